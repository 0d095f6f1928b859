"""The planner's state machine: observations in, scaling decisions out; no I/O, no clock
(the caller passes `now_s`). A service shell calls `plan_interval` every `interval_s` and
`plan_load` every `load_interval_s`, and has a connector carry out `PlannerEffects.decisions`.

    plan_interval  feed the predictors and correction factors; predict the next interval's
                   load; size each pool for it (replicas.py): the throughput plan, which is
                   also the floor the load rule cannot go below
    plan_load      live TTFT/ITL estimates (live.py) and the recent arrival rate
                   (recent_load.py) into the load rule (load_rule.py): +1 above target, -1
                   once well below it for a scale-down cool-down; with the queueing model,
                   jump to what the recent arrival rate needs at once, and down half the way
                   at a time

Every change passes the role's cool-down (cooldown.py) and the limits (limits.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from armature.config.planner import PlannerConfig
from armature.planner.cooldown import RoleCooldown
from armature.planner.correction import CorrectionTracker
from armature.planner.decisions import DecisionReason, LimitHold, LimitReason, ScalingDecision
from armature.planner.forecast import LoadForecast, LoadForecaster
from armature.planner.limits import apply_limits
from armature.planner.live import LiveEstimate, estimate_live, get_backlog_requests
from armature.planner.load_rule import LoadRule, Pending, RoleState, Want, get_halfway
from armature.planner.observation import PlannerObservation
from armature.planner.performance import KvHeadroom, PerformanceModel
from armature.planner.predictors import LoadPredictor, make_predictor
from armature.planner.recent_load import (
    RecentWindows,
    get_attainment,
    get_rate_bounds,
    get_rising_rate,
)
from armature.planner.replicas import PoolPlan, Targets, plan_agg, plan_decode, plan_prefill
from armature.planner.trim import AttainmentTrim
from armature.protocols.worker import WorkerRole

__all__ = ["MIN_JUDGED_REQUESTS", "Planner", "PlannerEffects"]

# the fewest judged requests over the load rule's window for its measured attainment
MIN_JUDGED_REQUESTS = 20


@dataclass(frozen=True)
class PlannerEffects:
    """What one tick decided: the changes to make (`decisions`), the changes a cool-down
    held back (`held`), every role's count after it, and the numbers behind it. `limited`:
    the roles its limits keep below what a rule asked for this tick (a change or not)."""

    decisions: list[ScalingDecision]
    held: list[ScalingDecision]
    num_workers: dict[WorkerRole, int]
    limited: list[LimitHold] = field(default_factory=list)
    forecast: LoadForecast | None = None
    plans: dict[WorkerRole, PoolPlan] = field(default_factory=dict)
    live: dict[WorkerRole, LiveEstimate] = field(default_factory=dict)
    prefill_correction: float = 1.0
    decode_correction: float = 1.0
    # the share of requests within both targets over the load rule's window, as the frontend
    # judged them (None: it judges none, or too few finished)
    attainment: float | None = None
    # the share of the predicted load the pools were sized for (trim.py; 1.0: all of it)
    trim_scale: float = 1.0
    # forecaster fits that raised a numerical error since the planner started
    num_fit_failures: int = 0


class Planner:
    """Sizes the pools of `config.get_roles()`. Owns its predictors, correction factors,
    each role's count (what it last decided: the connector makes the fleet follow), the
    throughput plan's floor and the cool-downs."""

    def __init__(
        self,
        config: PlannerConfig,
        model: PerformanceModel,
        *,
        num_workers: Mapping[WorkerRole, int] | None = None,
        predictor_factory: Callable[[], LoadPredictor] | None = None,
    ) -> None:
        self._config = config
        self._model = model
        # the pools are sized with the KV headroom; corrections and live estimates read the
        # worker's own model
        self._sizing_model = KvHeadroom(model, config.decode_kv_share)
        self._targets = Targets(
            config.ttft_ms / 1000.0, config.itl_ms / 1000.0, config.slo_attainment
        )
        self._forecaster = LoadForecaster(predictor_factory or self._make_predictor)
        self._corrections = CorrectionTracker()
        roles = config.get_roles()
        given = num_workers or {}
        start = {r: given.get(r, config.get_role_limits(r).min_workers) for r in roles}
        self._num_workers = {r: num for r, (num, _) in apply_limits(config, start).items()}
        self._floor = {r: config.get_role_limits(r).min_workers for r in roles}
        self._cooldowns = {
            r: RoleCooldown(config.scale_up_cooldown_s, config.scale_down_cooldown_s) for r in roles
        }
        self._prefix_hit_rate = 0.0
        self._lengths: tuple[float, float] | None = None  # last measured (isl, osl)
        self._live: dict[WorkerRole, LiveEstimate] = {}
        self._recent = RecentWindows(config.load_rate_window_s, config.load_interval_s)
        self._load_rule = LoadRule(config, self._targets)
        self._attainment: float | None = None  # measured over the load rule's window
        self._trim = AttainmentTrim(config.trim_step, config.trim_min_scale, config.slo_attainment)

    def _make_predictor(self) -> LoadPredictor:
        config = self._config
        return make_predictor(
            config.predictor,
            window=config.predictor_window_intervals,
            history=config.predictor_history_intervals,
            season_length=config.season_intervals,
        )

    def get_num_workers(self) -> dict[WorkerRole, int]:
        """Each role's count as last decided."""
        return dict(self._num_workers)

    def get_floor(self) -> dict[WorkerRole, int]:
        """Each role's floor: the last throughput plan within the limits."""
        return dict(self._floor)

    def plan_interval(self, observation: PlannerObservation, now_s: float) -> PlannerEffects:
        """The throughput plan for the next interval, from the one that just ended."""
        frontend = observation.frontend
        self._forecaster.observe(frontend)
        self._corrections.observe(observation.workers, self._model)
        if frontend.num_requests > 0:
            self._prefix_hit_rate = frontend.prefix_hit_rate
            # 0.0: no length measured yet (no request, or no prefill, ended)
            if frontend.mean_output_tokens > 0.0 and frontend.mean_input_tokens > 0.0:
                self._lengths = (frontend.mean_input_tokens, frontend.mean_output_tokens)
        self._trim.observe(
            get_attainment(
                frontend.num_judged_requests, frontend.num_met_requests, MIN_JUDGED_REQUESTS
            ),
            frontend.get_request_rate_per_s(),
        )
        forecast = self._forecaster.predict_next()
        if forecast is None:
            return self._effects([], [])
        sized = self._trimmed(forecast)  # the effects report the prediction itself
        plans = {r: self._plan_pool(r, sized, self._config.queue_aware) for r in self._roles()}
        wants: dict[WorkerRole, Want] = {}
        for role, plan in plans.items():
            limits = self._config.get_role_limits(role)
            self._floor[role] = min(max(plan.num_workers, limits.min_workers), limits.max_workers)
            cooldown = self._cooldowns[role]
            cooldown.add_plan(plan.num_workers, now_s)
            wanted = plan.num_workers
            if wanted < self._num_workers[role]:
                # scale down only to the highest recent plan, half the way at a time, and,
                # where the load rule runs,
                # only once it has seen this role calm for the down cool-down (the rule that
                # added workers for a live latency is not undone by a lower prediction)
                wanted = max(wanted, cooldown.get_stable_plan())
                wanted = get_halfway(self._num_workers[role], wanted)
                if role in self._live and not self._load_rule.is_calm(role, now_s):
                    wanted = self._num_workers[role]
            wants[role] = Want(wanted, DecisionReason.THROUGHPUT, self._describe(forecast, plan))
        decisions, held, limited = self._apply(wants, now_s, share_total=True)
        return self._effects(decisions, held, forecast=forecast, plans=plans, limited=limited)

    def plan_load(self, observation: PlannerObservation, now_s: float) -> PlannerEffects:
        """The load rule over a short window: +-1 worker from live estimates, or (queue-aware)
        what the arrival rate of the last `load_rate_window_s` needs (`recent_load.py`): up
        on `get_rising_rate`, down on the high bound over the whole window."""
        frontend = observation.frontend
        recent = self._recent.add(frontend)
        self._attainment = recent.get_attainment(MIN_JUDGED_REQUESTS)
        if frontend.num_requests > 0:
            self._prefix_hit_rate = frontend.prefix_hit_rate
        if recent.num_requests > 0:
            # until a request finished, no output length is measured: the last one, else one
            # token (the least a request makes), so that prompts and backlogs are sized; until
            # a prefill ended, no input length: the last one, else none (0.0: the live TTFT
            # estimate still scales up)
            input_tokens, output_tokens = recent.mean_input_tokens, recent.mean_output_tokens
            if input_tokens <= 0.0 and self._lengths is not None:
                input_tokens = self._lengths[0]
            if output_tokens <= 0.0:
                output_tokens = self._lengths[1] if self._lengths is not None else 1.0
            self._lengths = (input_tokens, output_tokens)
        if self._lengths is None:
            return self._effects([], [])
        input_tokens, output_tokens = self._lengths
        new_tokens = input_tokens * (1.0 - self._prefix_hit_rate)
        low_rate_per_s, high_rate_per_s = get_rate_bounds(recent.num_requests, recent.window_s)
        low_rate_per_s = get_rising_rate(self._recent.get_suffix_counts())
        rising = self._trimmed(LoadForecast(low_rate_per_s, input_tokens, output_tokens))
        falling = self._trimmed(LoadForecast(high_rate_per_s, input_tokens, output_tokens))
        wants: dict[WorkerRole, Want] = {}
        plans: dict[WorkerRole, PoolPlan] = {}
        for role in self._roles():
            workers = observation.get_workers(role)
            live = estimate_live(
                role, workers, frontend, self._model, self._corrections.prefill_factor, new_tokens
            )
            self._live[role] = live
            queue_aware = self._config.queue_aware
            up_plan = self._plan_pool(role, rising, queue_aware)
            down_plan = self._plan_pool(role, falling, queue_aware)
            if queue_aware:
                plans[role] = up_plan
            backlog = (
                None
                if role is WorkerRole.DECODE
                else get_backlog_requests(workers, frontend, new_tokens)
            )
            pending = Pending(
                num_serving=len(workers),
                num_starting=max(0, self._num_workers[role] - len(workers)),
                backlog_requests=backlog,
                busy_up=rising.request_rate_per_s * up_plan.work_s,
                busy_down=falling.request_rate_per_s * down_plan.work_s,
                work_up_s=up_plan.work_s,
                work_down_s=down_plan.work_s,
            )
            want = self._load_rule.decide(
                role,
                RoleState(self._num_workers[role], self._floor[role]),
                live,
                (up_plan, down_plan) if queue_aware else None,
                pending,
                self._trim.has_room(self._attainment),
                now_s,
            )
            if want is not None:
                wants[role] = want
        decisions, held, limited = self._apply(wants, now_s, share_total=False)
        return self._effects(decisions, held, plans=plans, limited=limited)

    def _trimmed(self, load: LoadForecast) -> LoadForecast:
        """`load` at the trim's scale for its rate."""
        scale = self._trim.get_scale(load.request_rate_per_s)
        if scale == 1.0:
            return load
        return LoadForecast(
            load.request_rate_per_s * scale, load.mean_input_tokens, load.mean_output_tokens
        )

    def _apply(
        self, wants: Mapping[WorkerRole, Want], now_s: float, *, share_total: bool
    ) -> tuple[list[ScalingDecision], list[ScalingDecision], list[LimitHold]]:
        """Limits, then cool-downs: the decisions, those a cool-down held, and the roles a
        maximum (their own or the total) keeps below their want. `share_total`: roles share
        the total budget in proportion to what they want (the throughput plan); otherwise a
        role grows only into what the others leave free (the load rule moves one role and
        must not shrink another)."""
        wanted = {
            r: (wants[r].num_workers if r in wants else n) for r, n in self._num_workers.items()
        }
        if share_total:
            limited = apply_limits(self._config, wanted)
        else:
            limited = {}
            for role, num in wanted.items():
                others = {r: n for r, n in self._num_workers.items() if r != role}
                limited[role] = self._limit_alone(role, num, others)
        decisions: list[ScalingDecision] = []
        held: list[ScalingDecision] = []
        holds: list[LimitHold] = []
        max_total = self._config.get_max_total_workers()
        ordered = list(wants.items())
        if max_total is not None:
            # shrinking roles first: a role grows only into the room the others leave as
            # they are after their cool-downs (a held shrink leaves none: within budget)
            ordered.sort(key=lambda w: limited[w[0]][0] > self._num_workers[w[0]])
        for role, want in ordered:
            current = self._num_workers[role]
            target, limit = limited[role]
            if max_total is not None and target > current:
                room = max_total - sum(n for r, n in self._num_workers.items() if r != role)
                if target > room:
                    target, limit = max(current, room), LimitReason.TOTAL_WORKERS
            if limit is not None and want.num_workers > target:  # a maximum held it
                holds.append(
                    LimitHold(
                        role=role,
                        num_workers=target,
                        wanted_workers=want.num_workers,
                        reason=want.reason,
                        limited_by=limit,
                        at_s=now_s,
                    )
                )
            if target == current:
                continue
            decision = ScalingDecision(
                role=role,
                from_workers=current,
                to_workers=target,
                wanted_workers=want.num_workers,
                reason=want.reason,
                at_s=now_s,
                limited_by=limit,
                detail=want.detail,
            )
            if not self._cooldowns[role].allows(current, target, now_s):
                held.append(decision)
                continue
            self._num_workers[role] = target
            self._cooldowns[role].record_change(now_s)
            decisions.append(decision)
        return decisions, held, holds

    def _limit_alone(
        self, role: WorkerRole, num: int, others: Mapping[WorkerRole, int]
    ) -> tuple[int, LimitReason | None]:
        num, limit = apply_limits(self._config, {role: num})[role]
        max_total = self._config.get_max_total_workers()
        if max_total is not None and num + sum(others.values()) > max_total:
            num = max(self._num_workers[role], max_total - sum(others.values()))
            limit = LimitReason.TOTAL_WORKERS
        return num, limit

    def _plan_pool(self, role: WorkerRole, load: LoadForecast, queue_aware: bool) -> PoolPlan:
        k_p, k_d = self._corrections.prefill_factor, self._corrections.decode_factor
        max_workers = self._config.get_role_limits(role).max_workers
        if role is WorkerRole.PREFILL:
            return plan_prefill(
                load,
                self._prefix_hit_rate,
                self._sizing_model,
                k_p,
                self._targets,
                queue_aware=queue_aware,
                max_workers=max_workers,
            )
        if role is WorkerRole.DECODE:
            return plan_decode(
                load,
                self._sizing_model,
                k_d,
                self._targets,
                queue_aware=queue_aware,
                max_workers=max_workers,
            )
        return plan_agg(
            load,
            self._prefix_hit_rate,
            self._sizing_model,
            (k_p, k_d),
            self._targets,
            queue_aware=queue_aware,
            max_workers=max_workers,
        )

    def _roles(self) -> tuple[WorkerRole, ...]:
        return self._config.get_roles()

    def _describe(self, forecast: LoadForecast, plan: PoolPlan) -> str:
        unreachable = "" if plan.meets_target else "; the target cannot be met at any size"
        scale = self._trim.get_scale(forecast.request_rate_per_s)
        trimmed = "" if scale == 1.0 else f" (sized for {scale:.0%} of it: SLO feedback)"
        return (
            f"predicted {forecast.request_rate_per_s:.3g} req/s{trimmed}, isl "
            f"{forecast.mean_input_tokens:.0f}, osl {forecast.mean_output_tokens:.0f}; by "
            f"throughput {plan.num_by_throughput}, by queue {plan.num_by_queue}; service "
            f"{plan.service_s * 1000.0:.1f} ms{unreachable}"
        )

    def _effects(
        self,
        decisions: list[ScalingDecision],
        held: list[ScalingDecision],
        *,
        forecast: LoadForecast | None = None,
        plans: dict[WorkerRole, PoolPlan] | None = None,
        limited: list[LimitHold] | None = None,
    ) -> PlannerEffects:
        return PlannerEffects(
            decisions=decisions,
            held=held,
            num_workers=self.get_num_workers(),
            limited=limited or [],
            forecast=forecast,
            plans=plans or {},
            live=dict(self._live),
            prefill_correction=self._corrections.prefill_factor,
            decode_correction=self._corrections.decode_factor,
            attainment=self._attainment,
            trim_scale=self._trim.scale,
            num_fit_failures=self._forecaster.get_num_fit_failures(),
        )
