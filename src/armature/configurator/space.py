"""What the search is over and for: the workload, the targets, the deployments.

A deployment is one *group* of workers, replicated to fill the GPUs: an aggregated worker of
`decode_tp` GPUs, or `num_prefill_workers` prefill workers of `prefill_tp` GPUs beside
`num_decode_workers` decode workers of `decode_tp` GPUs (P:D in lowest terms: 2:4 is two
groups of 1:2). Every worker of a deployment runs the same batch limits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from armature.workload.traces import TraceRequest

__all__ = ["AGG", "DISAGG", "Deployment", "SearchSpace", "Targets", "Workload"]

AGG = "agg"
DISAGG = "disagg"


@dataclass(frozen=True)
class Targets:
    """TTFT (median) and ITL (mean) in ms; `e2e_ms` (median TTFT + mean ITL x the rest of
    the output) replaces the ITL target when given."""

    ttft_ms: float
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def get_miss(self, ttft_ms: float, itl_ms: float, osl_tokens: float) -> float:
        """The largest ratio of a prediction to its target: <= 1 meets them all."""
        ratios = [ttft_ms / self.ttft_ms]
        if self.itl_ms is not None:
            ratios.append(itl_ms / self.itl_ms)
        if self.e2e_ms is not None:
            ratios.append((ttft_ms + itl_ms * max(0.0, osl_tokens - 1)) / self.e2e_ms)
        return max(ratios)


@dataclass(frozen=True)
class Workload:
    """Requests of `isl_tokens` prompt and `osl_tokens` output tokens on average, each drawn
    uniformly within +-`spread` of the mean; or a trace's requests (`trace`, its own lengths
    and arrival pattern, rescaled to the rate simulated)."""

    isl_tokens: float
    osl_tokens: float
    spread: float = 0.0
    trace: tuple[TraceRequest, ...] = ()

    @staticmethod
    def of_trace(requests: tuple[TraceRequest, ...]) -> Workload:
        isl = sum(r.input_length for r in requests) / len(requests)
        osl = sum(r.output_length for r in requests) / len(requests)
        return Workload(isl, osl, trace=requests)

    def get_max_request_tokens(self) -> int:
        """The longest request's prompt and output together."""
        if self.trace:
            return max(r.input_length + r.output_length for r in self.trace)
        scale = 1.0 + self.spread
        return math.ceil(self.isl_tokens * scale) + math.ceil(self.osl_tokens * scale)


@dataclass(frozen=True)
class Deployment:
    mode: str
    decode_tp: int  # an aggregated worker's, or a decode worker's
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_tp: int = 0
    num_prefill_workers: int = 0  # per group
    num_decode_workers: int = 1  # per group

    @property
    def num_gpus(self) -> int:
        """GPUs of one group."""
        return self.num_prefill_workers * self.prefill_tp + self.num_decode_workers * self.decode_tp

    def describe(self) -> str:
        limits = f"seqs {self.max_num_seqs}, batch {self.max_num_batched_tokens}"
        if self.mode == AGG:
            return f"agg tp{self.decode_tp}, {limits}"
        return (
            f"disagg {self.num_prefill_workers}P(tp{self.prefill_tp})"
            f":{self.num_decode_workers}D(tp{self.decode_tp}), {limits}"
        )


@dataclass(frozen=True)
class SearchSpace:
    tensor_parallel: tuple[int, ...] = (1, 2, 4, 8)
    max_num_seqs: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    max_num_batched_tokens: tuple[int, ...] = (2048, 4096, 8192, 16384)
    max_prefill_workers: int = 4  # per group
    max_decode_workers: int = 8
    modes: tuple[str, ...] = field(default=(AGG, DISAGG))

    def iter_deployments(self, max_gpus: int) -> Iterator[Deployment]:
        """Every deployment whose group takes at most `max_gpus` GPUs."""
        limits = list(itertools.product(self.max_num_seqs, self.max_num_batched_tokens))
        if AGG in self.modes:
            for tp, (seqs, tokens) in itertools.product(self.tensor_parallel, limits):
                if tp <= max_gpus:
                    yield Deployment(AGG, tp, seqs, tokens)
        if DISAGG not in self.modes:
            return
        ratios = [
            (p, d)
            for p in range(1, self.max_prefill_workers + 1)
            for d in range(1, self.max_decode_workers + 1)
            if math.gcd(p, d) == 1
        ]
        for tp_p, tp_d, (p, d) in itertools.product(
            self.tensor_parallel, self.tensor_parallel, ratios
        ):
            if p * tp_p + d * tp_d > max_gpus:
                continue
            for seqs, tokens in limits:
                yield Deployment(DISAGG, tp_d, seqs, tokens, tp_p, p, d)
