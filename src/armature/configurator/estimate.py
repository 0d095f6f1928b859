"""The fast estimate: a deployment's steady state at a decode batch `b`, in closed form over
the same step times the simulator runs (`sim.timing.StepWork` -> ms).

Aggregated, one worker of `tp` GPUs, requests of mean prompt `isl` and output `osl`:

    each step decodes b requests over ctx = isl + osl/2 tokens each, and prefills the
    p = b * isl / osl tokens that new requests bring per step (they finish at b / osl per
    step); p must fit the step budget left by the decodes (max-num-batched-tokens - b)
    ITL   = step(p, b)
    TTFT  = step(p, b) / 2 (the step running on arrival) + n chunks of the prompt, each
            step(chunk, b), waiting as in an M/D/1 queue at the budget's load p / budget
    rate  = b / osl / ITL requests/s

Disaggregated, P prefill workers of tp_p and D decode workers of tp_d GPUs per group:

    decode  ITL = step(0, b) + the KV transfer over the output's tokens; D*b/osl/step req/s
    prefill serves prompts in full steps of the budget: its capacity c_p in requests/s;
            TTFT = the prompt alone, waiting as in an M/D/1 queue at load rate / (P * c_p)

tokens/s per GPU = rate x osl / the group's GPUs; tokens/s per user = 1000 / ITL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from armature.configurator.space import AGG, Deployment, Targets, Workload
from armature.sim.timing import StepWork, TimingModel

__all__ = ["BATCH_GRID", "BATCH_HEADROOM", "Estimator", "Prediction"]

BATCH_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768)
# a deployment operates at most at this share of its max-num-seqs (room for bursts)
BATCH_HEADROOM = 0.75
# a pool loaded beyond this is not an operating point (its queue has no steady state)
MAX_LOAD = 0.95


@dataclass(frozen=True)
class Prediction:
    """A deployment at one operating point, per group of workers."""

    ttft_ms: float  # median
    itl_ms: float  # mean
    request_rate_per_s: float  # what one group serves
    tokens_per_s_per_gpu: float
    num_running: int  # requests decoding on each decode (or aggregated) worker

    @property
    def tokens_per_s_per_user(self) -> float:
        """Output tokens a second one request sees after its first (inf when requests have
        one output token: no interval)."""
        return 1000.0 / self.itl_ms if self.itl_ms > 0 else math.inf


def _queued(service_ms: float, load: float) -> float:
    """Time in an M/D/1 queue of service `service_ms` at `load` (< 1), service included."""
    return service_ms * (1.0 + load / (2.0 * (1.0 - load)))


class Estimator:
    """Estimates over one workload. `timings`: each TP's step-time model, from its whole
    profile (the simulation of a finalist prices steps from the profile at the deployment's
    own step budget, `Hardware.get_timing`: the estimate only prunes, and its error beside
    the simulation is measured in `bench/configurator_fidelity.py`);
    `get_kv_transfer_ms`: one mean prompt's KV transfer from a deployment's prefill worker to
    its decode worker (none by default)."""

    def __init__(
        self,
        timings: dict[int, TimingModel],
        workload: Workload,
        get_kv_transfer_ms: Callable[[Deployment], float] | None = None,
    ):
        self.timings = timings
        self.workload = workload
        self.get_kv_transfer_ms = get_kv_transfer_ms or (lambda deployment: 0.0)
        self._context_tokens = workload.isl_tokens + workload.osl_tokens / 2
        self._prefill: dict[tuple[int, int], tuple[float, float]] = {}

    def _step_ms(
        self, tp: int, num_prefill_tokens: float, num_decodes: int, context_pairs: int = 0
    ) -> float:
        kv_tokens = round(num_decodes * self._context_tokens)
        work = StepWork(round(num_prefill_tokens), num_decodes, 0.0, kv_tokens, context_pairs)
        return self.timings[tp].step_ms(work)

    def _chunks_ms(self, tp: int, chunk: float, num_decodes: int) -> float:
        """The prompt in steps of `chunk` tokens beside `num_decodes` decodes, each chunk
        attending over those before it."""
        num_chunks = math.ceil(self.workload.isl_tokens / chunk)
        pairs = round(chunk * chunk)
        return sum(self._step_ms(tp, chunk, num_decodes, i * pairs) for i in range(num_chunks))

    def get_agg(self, deployment: Deployment, b: int) -> Prediction | None:
        """An aggregated worker decoding `b` requests; None when it cannot hold them."""
        isl, osl, tp = self.workload.isl_tokens, self.workload.osl_tokens, deployment.decode_tp
        budget = deployment.max_num_batched_tokens - b
        prefill_tokens = b * isl / osl
        if budget <= 0 or prefill_tokens > MAX_LOAD * budget:
            return None
        itl = self._step_ms(tp, prefill_tokens, b)
        chunk = min(isl, budget)
        chunks_ms = self._chunks_ms(tp, chunk, b)
        ttft = itl / 2 + _queued(chunks_ms, prefill_tokens / budget)
        rate = b / osl / (itl / 1000.0)
        return Prediction(ttft, itl, rate, rate * osl / deployment.num_gpus, b)

    def _get_prefill(self, tp: int, budget: int) -> tuple[float, float]:
        """(one prompt alone in ms, requests/s at full steps) of a prefill worker."""
        key = (tp, budget)
        if key not in self._prefill:
            isl = self.workload.isl_tokens
            chunk = min(isl, budget)
            alone = self._chunks_ms(tp, chunk, 0)
            per_step = max(1, budget // math.ceil(isl)) if isl <= budget else 1
            full_ms = self._step_ms(tp, per_step * isl, 0) if isl <= budget else alone
            self._prefill[key] = (alone, per_step / (full_ms / 1000.0))
        return self._prefill[key]

    def get_disagg(self, deployment: Deployment, b: int) -> Prediction | None:
        """A group whose decode workers each decode `b` requests; None when its prefill
        workers cannot keep up."""
        osl = self.workload.osl_tokens
        step = self._step_ms(deployment.decode_tp, 0, b)
        itl = step + self.get_kv_transfer_ms(deployment) / max(1.0, osl - 1)
        rate = deployment.num_decode_workers * b / osl / (step / 1000.0)
        alone_ms, capacity = self._get_prefill(
            deployment.prefill_tp, deployment.max_num_batched_tokens
        )
        load = rate / (deployment.num_prefill_workers * capacity)
        if load > MAX_LOAD:
            return None
        return Prediction(_queued(alone_ms, load), itl, rate, rate * osl / deployment.num_gpus, b)

    def get(self, deployment: Deployment, b: int) -> Prediction | None:
        if deployment.mode == AGG:
            return self.get_agg(deployment, b)
        return self.get_disagg(deployment, b)

    def get_points(self, deployment: Deployment) -> list[Prediction]:
        """The deployment at every decode batch of the grid within its headroom."""
        top = max(1, int(deployment.max_num_seqs * BATCH_HEADROOM))
        points = (self.get(deployment, b) for b in BATCH_GRID if b <= top)
        return [p for p in points if p is not None]

    def get_best(self, deployment: Deployment, targets: Targets) -> tuple[Prediction, float] | None:
        """(the point of most tokens/s per GPU that meets `targets`, else the closest one;
        its miss: <= 1 meets them). None: the deployment has no operating point."""
        osl = self.workload.osl_tokens
        best: tuple[Prediction, float] | None = None
        for point in self.get_points(deployment):
            miss = targets.get_miss(point.ttft_ms, point.itl_ms, osl)
            if best is None:
                best = (point, miss)
            elif miss <= 1.0:
                if best[1] > 1.0 or point.tokens_per_s_per_gpu > best[0].tokens_per_s_per_gpu:
                    best = (point, miss)
            elif best[1] > 1.0 and miss < best[1]:
                best = (point, miss)
        return best
