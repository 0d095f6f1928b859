"""Step times from a timing profile (`armature profile`): the mocker then behaves like the
engine that was profiled.

    prefill_ms(t)    the batch-1 TTFT table by input tokens (t = new prefill tokens in the step),
                     piecewise linear, extrapolated linearly past either end
    + k * pairs      attention over earlier context: a chunk of t new tokens after c tokens
                     (a prefix-cache hit, earlier chunks) pays k per (new, earlier) token pair,
                     k fitted from the profile's prefills timed after a cached prefix
    decode_ms(b, c)  the decode ITL grid by requests b and context tokens c per request
                     (c = the decode requests' KV tokens / b), bilinear, extrapolated linearly

         c: 256   1024          decode_ms(3, 640): between rows b=2 and b=4, and columns
    b=1 [ 10.0,  12.0 ]         c=256 and c=1024; linear in each direction
    b=2 [ 11.0,  14.0 ]
    b=4 [ 13.0,  19.0 ]

A step with both prefill and decode work runs one forward pass: it costs both parts less the
step overhead they would otherwise count twice, and never less than either part alone. The
overhead is the prefill table extrapolated to 0 tokens, clamped to [0, the cheapest
measured prefill or decode]. A profile with a load pass scales the steps that carry prefill
tokens by its prompt step factor (the loaded engine's prompt steps against these tables;
decode steps as the tables give), or, from a pass that did not keep the two classes apart,
every step by its factor; every time is divided by the speedup ratio; none is below 0.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from armature.protocols.timing_profile import (
    LoadCheck,
    PrefillPoint,
    ProfileError,
    TimingProfile,
    read_profile,
)
from armature.sim.timing import StepWork

__all__ = [
    "ProfileTiming",
    "fit_context_pair_ms",
    "load_profile",
    "load_profile_timing",
    "timing_from_profile",
]


def _segment(xs: Sequence[float], x: float) -> tuple[int, float]:
    """(i, w): x lies between xs[i-1] and xs[i] at weight w from xs[i-1] (w outside [0, 1]
    past either end: linear extrapolation). One point: (0, 0.0)."""
    if len(xs) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    return i, (x - xs[i - 1]) / (xs[i] - xs[i - 1])


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    i, w = _segment(xs, x)
    if len(xs) == 1:
        return ys[0]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * w


def _check_axis(name: str, xs: Sequence[float], minimum: int) -> None:
    if len(xs) < minimum:
        raise ValueError(f"{name}: needs at least {minimum} points, has {len(xs)}")
    if any(b <= a for a, b in itertools.pairwise(xs)):
        raise ValueError(f"{name}: values must increase strictly")


@dataclass(frozen=True)
class ProfileTiming:
    """Tables from a profile. `decode_ms_grid[i][j]` is the ITL of `decode_requests[i]`
    requests over `decode_context_tokens[j]` tokens each. The prefill table needs two points;
    each decode axis needs one (one point: constant along it)."""

    prefill_tokens: tuple[float, ...]
    prefill_ms_table: tuple[float, ...]
    decode_requests: tuple[float, ...]
    decode_context_tokens: tuple[float, ...]
    decode_ms_grid: tuple[tuple[float, ...], ...]
    speedup_ratio: float = 1.0
    load_factor: float = 1.0  # every step: an older load pass's loaded steps over the tables
    # steps with prefill tokens: the load pass's prompt steps measured over these tables
    prompt_step_factor: float = 1.0
    # a prefill's attention over earlier context, per (new token, earlier token) pair
    prefill_ms_per_context_pair: float = 0.0

    def __post_init__(self) -> None:
        _check_axis("prefill input tokens", self.prefill_tokens, 2)
        _check_axis("decode requests", self.decode_requests, 1)
        _check_axis("decode context tokens", self.decode_context_tokens, 1)
        if len(self.prefill_ms_table) != len(self.prefill_tokens):
            raise ValueError("prefill: one time per input length")
        rows, columns = len(self.decode_requests), len(self.decode_context_tokens)
        if len(self.decode_ms_grid) != rows or any(len(r) != columns for r in self.decode_ms_grid):
            raise ValueError(f"decode: needs a {rows} x {columns} grid of times")
        if self.speedup_ratio <= 0:
            raise ValueError("speedup_ratio must be > 0")
        if self.load_factor <= 0:
            raise ValueError("load_factor must be > 0")
        if self.prompt_step_factor <= 0:
            raise ValueError("prompt_step_factor must be > 0")
        if self.prefill_ms_per_context_pair < 0:
            raise ValueError("prefill_ms_per_context_pair must be >= 0")

    def get_prefill_ms(self, num_tokens: float) -> float:
        """A prefill-only step of `num_tokens` new tokens, before the speedup."""
        return max(0.0, _interpolate(self.prefill_tokens, self.prefill_ms_table, num_tokens))

    def get_decode_ms(self, num_requests: float, context_tokens: float) -> float:
        """A decode-only step of `num_requests` over `context_tokens` each, before the
        speedup."""
        i, w = _segment(self.decode_requests, num_requests)
        columns = self.decode_context_tokens
        if len(self.decode_requests) == 1:
            return max(0.0, _interpolate(columns, self.decode_ms_grid[0], context_tokens))
        low = _interpolate(columns, self.decode_ms_grid[i - 1], context_tokens)
        high = _interpolate(columns, self.decode_ms_grid[i], context_tokens)
        return max(0.0, low + (high - low) * w)

    def get_step_overhead_ms(self) -> float:
        """What every step costs whatever it computes: the prefill table at 0 tokens."""
        cheapest = min(min(self.prefill_ms_table), min(min(r) for r in self.decode_ms_grid))
        at_zero = _interpolate(self.prefill_tokens, self.prefill_ms_table, 0.0)
        return min(max(0.0, at_zero), cheapest)

    @property
    def decode_uses_context(self) -> bool:
        return True  # decode time is read by context tokens per request

    def step_ms(self, work: StepWork) -> float:
        prefill = decode = 0.0
        if work.num_prefill_tokens > 0:
            prefill = self.get_prefill_ms(work.num_prefill_tokens)
            prefill += self.prefill_ms_per_context_pair * work.num_prefill_context_pairs
        if work.num_decode_requests > 0:
            context = (
                work.num_decode_kv_tokens / work.num_decode_requests
                if work.num_decode_kv_tokens > 0
                else self.decode_context_tokens[0]  # a caller that cannot tell
            )
            decode = self.get_decode_ms(work.num_decode_requests, context)
        total = prefill + decode
        if prefill > 0 and decode > 0:
            total = max(prefill, decode, total - self.get_step_overhead_ms())
        if work.num_prefill_tokens > 0:
            total *= self.prompt_step_factor
        return total * self.load_factor / self.speedup_ratio


def fit_context_pair_ms(
    tokens: Sequence[float], ms_table: Sequence[float], points: Sequence[PrefillPoint]
) -> float:
    """The ms per (new token, earlier token) pair that best explains, by least squares through
    0, what each prefill after a cached prefix took over the fresh table at its new tokens;
    0 with no such point, and never below 0."""
    num = den = 0.0
    for p in points:
        if p.context_tokens > 0:
            pairs = float(p.input_tokens * p.context_tokens)
            num += (p.ttft_ms - _interpolate(tokens, ms_table, p.input_tokens)) * pairs
            den += pairs * pairs
    return max(0.0, num / den) if den > 0 else 0.0


def timing_from_profile(profile: TimingProfile, speedup_ratio: float = 1.0) -> ProfileTiming:
    """The profile's tables: batch-1 prefill points of fresh prompts within the step budget
    (one step each; several at one length are averaged), the cost of earlier context fitted
    from those timed after a cached prefix, and the decode points, which must form a full
    grid; prompt steps scaled by the load pass's prompt step factor when the profile has one
    (every step by its factor, from a pass without the classes). ValueError naming what is
    missing."""
    prefill: dict[int, list[float]] = {}
    after_prefix: list[PrefillPoint] = []
    for p in profile.prefill:
        if p.num_requests != 1 or p.input_tokens > profile.max_num_batched_tokens:
            continue
        if p.context_tokens > 0:
            after_prefix.append(p)
        else:
            prefill.setdefault(p.input_tokens, []).append(p.ttft_ms)
    grid: dict[tuple[int, int], float] = {}
    for d in profile.decode:
        grid[(d.num_requests, d.context_tokens)] = d.itl_ms
    requests = sorted({b for b, _ in grid})
    contexts = sorted({c for _, c in grid})
    missing = [(b, c) for b in requests for c in contexts if (b, c) not in grid]
    if missing:
        b, c = missing[0]
        raise ValueError(f"decode points do not form a grid: none for {b} requests x {c} tokens")
    if not grid:
        raise ValueError("no decode points")
    lengths = sorted(prefill)
    load_factor, prompt_step_factor = _load_factors(profile.load)
    tokens = tuple(float(t) for t in lengths)
    ms_table = tuple(sum(prefill[t]) / len(prefill[t]) for t in lengths)
    return ProfileTiming(
        prefill_tokens=tokens,
        prefill_ms_table=ms_table,
        decode_requests=tuple(float(b) for b in requests),
        decode_context_tokens=tuple(float(c) for c in contexts),
        decode_ms_grid=tuple(tuple(grid[(b, c)] for c in contexts) for b in requests),
        speedup_ratio=speedup_ratio,
        load_factor=load_factor,
        prompt_step_factor=prompt_step_factor,
        prefill_ms_per_context_pair=(
            fit_context_pair_ms(tokens, ms_table, after_prefix) if len(tokens) >= 2 else 0.0
        ),
    )


def _load_factors(load: LoadCheck | None) -> tuple[float, float]:
    """(every step's, prompt steps') factor from a profile's load pass: prompt steps at their
    own measured-over-modeled time, decode steps at the tables'; a pass written before the
    classes, its factor on every step."""
    if load is None:
        return 1.0, 1.0
    if not load.has_classes:
        return load.factor, 1.0
    return 1.0, load.prompt_step_factor or 1.0


def load_profile(
    path: Path, speedup_ratio: float = 1.0, *, model: str | None = None
) -> tuple[TimingProfile, ProfileTiming]:
    """The profile at `path` and its timing model. With `model`, a profile of another model is
    refused. ProfileError (one line, naming the file) for anything that cannot be used."""
    profile = read_profile(path)
    if model is not None and profile.source.model != model:
        raise ProfileError(
            f"timing profile {path} was measured on model {profile.source.model!r}, not "
            f"{model!r} (profile this model, or serve that one)"
        )
    try:
        return profile, timing_from_profile(profile, speedup_ratio)
    except ValueError as exc:
        raise ProfileError(f"timing profile {path} cannot give step times: {exc}") from None


def load_profile_timing(
    path: Path, speedup_ratio: float = 1.0, *, model: str | None = None
) -> ProfileTiming:
    """`load_profile`'s timing model alone (the mocker's step times)."""
    return load_profile(path, speedup_ratio, model=model)[1]
