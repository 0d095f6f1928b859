"""The planner's pure core: it sizes the prefill and decode pools (or one aggregated pool) to
hold TTFT and ITL targets. No I/O and no clock: a service shell feeds it observations and
carries out its decisions through a connector (docs/architecture.md, "Planner").

    observation.py         PlannerObservation: the frontend's metrics and the workers' step
                           records
    performance.py         PerformanceModel (what a profile must answer)
    timing_performance.py  TimingPerformanceModel: one off a step-time model (sim layer)
    predictors.py          constant, moving average, Holt-Winters (statsmodels)
    forecast.py            LoadForecaster: the next interval's request rate and lengths
    correction.py          observed / predicted step time: the profile's correction factors
    replicas.py            the throughput plan's formulas, with the queueing model
    queueing.py            Erlang C (M/M/c) and its M/G/c scaling
    window_counts.py       one window's counts into FrontendMetrics (live scrape and simulation)
    recent_load.py         the load rule's view of the last few windows
    live.py                live TTFT/ITL estimates for the load rule
    load_rule.py           LoadRule: the short loop's choice for one role
    limits.py              per-role min/max and the total budget
    cooldown.py            cool-downs and the scale-down stabilization window
    decisions.py           ScalingDecision and its reasons; LimitHold
    core.py                Planner: plan_interval (throughput), plan_load (load rule)
"""

from __future__ import annotations

from armature.planner.core import Planner, PlannerEffects
from armature.planner.decisions import DecisionReason, LimitHold, LimitReason, ScalingDecision
from armature.planner.forecast import LoadForecast, LoadForecaster
from armature.planner.live import LiveEstimate
from armature.planner.observation import FrontendMetrics, PlannerObservation, WorkerSteps
from armature.planner.performance import PerformanceModel
from armature.planner.predictors import LoadPredictor, make_predictor
from armature.planner.replicas import PoolPlan, Targets

__all__ = [
    "DecisionReason",
    "FrontendMetrics",
    "LimitHold",
    "LimitReason",
    "LiveEstimate",
    "LoadForecast",
    "LoadForecaster",
    "LoadPredictor",
    "PerformanceModel",
    "Planner",
    "PlannerEffects",
    "PlannerObservation",
    "PoolPlan",
    "ScalingDecision",
    "Targets",
    "WorkerSteps",
    "make_predictor",
]
