"""The timing profile file that `armature profile --output` writes and `--timing-profile` reads:
what one engine measured in isolation on one machine, as versioned JSON.

    {"version": 2,
     "source": {"machine", "engine", "model", "dtype", "device", "flags", "created_at"},
     "max_num_batched_tokens": 1024, "max_num_seqs": 64,
     "block_size_tokens": 16, "num_kv_blocks": 4096,
     "prefill": [{"num_requests", "input_tokens", "ttft_ms", "tokens_per_s",
                  "context_tokens"}, ...],
     "decode":  [{"num_requests", "context_tokens", "itl_ms", "tokens_per_s"}, ...],
     "load": {"num_requests", "request_rate_per_s", "num_steps", "measured_s", "modeled_s"}
             or null}

A prefill point with `num_requests` 1 is one prompt alone (batch 1); more are that many
prompts submitted together (chunked batches). One with `context_tokens` (optional, 0 when
absent: files written before it read as before) is a prompt whose first `context_tokens`
were cached, `input_tokens` computed after them. A decode point is `num_requests` requests
decoding together over `context_tokens` tokens each (their prompts cached beforehand, so no
prefill is mixed in). Times are medians. The limits are the engine's as it ran: its step
budget and batch size, and its KV pool as built (what `--num-kv-blocks` or `--kv-cache-bytes`
came to for that model, or vLLM's own sizing), so a reader such as the planner knows one
worker's capacity without the model at hand (version 2 added them). A reader refuses
(`ProfileError`, one line) a file it cannot read, a version other than `PROFILE_VERSION`, or a
body that is not a profile.

`load` is the load pass (`--load-requests`), when it ran: Poisson arrivals of mixed lengths
served by the same engine after the sweep, and its steps' wall time against what the sweep's
tables give for the same steps, in all and by class: prompt steps (any prefill tokens, alone
or beside decodes) and decode steps. A loaded engine's batches mix requests at different
context lengths, batch sizes between the swept ones and prefill chunks beside decodes, which
the sweep's uniform points do not. Its `prompt_step_factor` (prompt steps' measured over
modeled time) scales the prompt steps of the mocker driven by this profile: how much more a
loaded engine's prompt steps cost than the tables compose them. Decode steps take the
tables' times. (Until 2026-12-05 the factor was taken over the decode steps' same ratio, to
cancel the machine's drift between the sweep and the pass; against measured runs that left
the TTFTs optimistic: docs/benchmarks.md, `configurator_native`.) A pass without the class
sums (files written before them) scales every step by its `factor` instead. Absent when no
load pass ran: nothing scaled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from armature.errors import ConfigError
from armature.outputs import write_atomically

__all__ = [
    "PROFILE_VERSION",
    "DecodePoint",
    "LoadCheck",
    "PrefillPoint",
    "ProfileError",
    "ProfileSource",
    "TimingProfile",
    "read_profile",
    "write_profile",
]

PROFILE_VERSION = 2

_PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
_NonNegative = Annotated[float, msgspec.Meta(ge=0)]
_Positive = Annotated[float, msgspec.Meta(gt=0)]  # a time a step or request took


class ProfileError(ConfigError):
    """A timing profile that cannot be read or used; the message names the file."""


class ProfileSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where a profile was measured: the machine, and the engine as it was configured."""

    machine: str  # CPU model, and the GPU's name on a GPU
    engine: str  # the registry kind: torch, mocker, vllm
    model: str  # the served model name
    dtype: str
    device: str
    flags: dict[str, str]  # the engine's command-line settings that differed from defaults
    created_at: str  # ISO 8601, UTC
    # engines profiled at once (`--engines-at-once`), each point the median of theirs
    engines_at_once: int = 1


class PrefillPoint(msgspec.Struct, frozen=True, kw_only=True):
    num_requests: int  # prompts submitted together (1: batch 1)
    input_tokens: int  # per prompt, computed (not cached)
    ttft_ms: _Positive  # median time to first token
    tokens_per_s: _NonNegative  # prompt tokens over the time the last first token took
    # prompt tokens cached before it (a prefix-cache hit), which the new ones attend over
    context_tokens: int = 0


class DecodePoint(msgspec.Struct, frozen=True, kw_only=True):
    num_requests: int  # requests decoding together
    context_tokens: int  # per request, mean over the measured steps
    itl_ms: _Positive  # the median over the requests of their mean inter-token latency
    tokens_per_s: _NonNegative  # output tokens per second, all requests together


class LoadCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The load pass: its steps' wall time against the sweep's tables for the same steps."""

    num_requests: int  # requests served
    request_rate_per_s: float  # their Poisson arrival rate
    num_steps: int  # engine steps timed
    measured_s: Annotated[float, msgspec.Meta(gt=0)]  # the steps' wall time, summed
    # what the sweep's tables give for the same steps, summed
    modeled_s: Annotated[float, msgspec.Meta(gt=0)]
    # the same sums by class: prompt steps (any prefill tokens) and decode steps (0: files
    # written before the classes, or a class the pass did not run)
    prompt_measured_s: _NonNegative = 0.0
    prompt_modeled_s: _NonNegative = 0.0
    decode_measured_s: _NonNegative = 0.0
    decode_modeled_s: _NonNegative = 0.0

    @property
    def factor(self) -> float:
        """The loaded steps' time over the tables'."""
        return self.measured_s / self.modeled_s

    @property
    def has_classes(self) -> bool:
        """Whether the pass summed prompt and decode steps apart (files written before the
        classes did not)."""
        return self.prompt_modeled_s > 0 or self.decode_modeled_s > 0

    @property
    def prompt_step_factor(self) -> float | None:
        """Prompt steps' measured over modeled time; None without prompt steps."""
        return _ratio(self.prompt_measured_s, self.prompt_modeled_s)

    @property
    def decode_step_factor(self) -> float | None:
        """Decode steps' measured over modeled time; None without decode steps."""
        return _ratio(self.decode_measured_s, self.decode_modeled_s)


def _ratio(measured_s: float, modeled_s: float) -> float | None:
    return measured_s / modeled_s if measured_s > 0 and modeled_s > 0 else None


class TimingProfile(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    source: ProfileSource
    max_num_batched_tokens: _PositiveInt  # the step's token budget the engine ran with
    max_num_seqs: _PositiveInt  # the most requests it ran at once
    block_size_tokens: _PositiveInt  # tokens per KV block
    num_kv_blocks: _PositiveInt  # its KV cache (G1) as built, in blocks
    prefill: list[PrefillPoint]
    decode: list[DecodePoint]
    load: LoadCheck | None = None  # the load pass, when one ran


class _Versioned(msgspec.Struct):
    version: int | None = None


def write_profile(profile: TimingProfile, path: Path) -> None:
    """Write `profile` as indented JSON (parent directories created), whole or not at all
    (OSError: the file that was there is kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, msgspec.json.format(msgspec.json.encode(profile), indent=2) + b"\n")


def read_profile(path: Path) -> TimingProfile:
    """The profile at `path`; ProfileError when it is unreadable, of another version, or not a
    profile."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"cannot read timing profile {path}: {exc.strerror}") from None
    try:
        version = msgspec.json.decode(data, type=_Versioned).version
    except (msgspec.DecodeError, msgspec.ValidationError):
        version = None
    if version is None:
        raise ProfileError(
            f"{path} is not a timing profile (write one with `armature profile --output`)"
        )
    if version != PROFILE_VERSION:
        raise ProfileError(
            f"{path} is a timing profile of version {version}; this armature reads version "
            f"{PROFILE_VERSION} (profile the engine again)"
        )
    try:
        return msgspec.json.decode(data, type=TimingProfile)
    except msgspec.ValidationError as exc:
        raise ProfileError(f"{path} is not a valid timing profile: {exc}") from None
