"""PNG plots of a timing profile (matplotlib, headless): prefill TTFT and tokens/s by input
length (alone and in batches), decode ITL and tokens/s by running requests (one line per
context length)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from armature.outputs import replacing
from armature.protocols.timing_profile import TimingProfile

__all__ = ["plot_profile"]


def _title(profile: TimingProfile) -> str:
    s = profile.source
    return f"{s.engine} engine, {s.model}, {s.dtype} on {s.device} ({s.machine})"


def plot_profile(profile: TimingProfile, directory: Path) -> list[Path]:
    """Write prefill.png and decode.png into `directory` (created); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "prefill.png", directory / "decode.png"]
    fig, (ttft, rate) = plt.subplots(1, 2, figsize=(12, 4))
    for num_requests, context in sorted(
        {(p.num_requests, p.context_tokens) for p in profile.prefill}
    ):
        points = sorted(
            (
                p
                for p in profile.prefill
                if (p.num_requests, p.context_tokens) == (num_requests, context)
            ),
            key=lambda p: p.input_tokens,
        )
        label = "alone" if num_requests == 1 else f"{num_requests} together"
        if context:
            label += f", after {context} cached"
        xs = [p.input_tokens for p in points]
        ttft.plot(xs, [p.ttft_ms for p in points], marker="o", label=label)
        rate.plot(xs, [p.tokens_per_s for p in points], marker="o", label=label)
    for ax, ylabel in ((ttft, "TTFT (ms, median)"), (rate, "prompt tokens/s")):
        ax.set_xlabel("input tokens per prompt")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"Prefill: {_title(profile)}", fontsize=9)
    with replacing(paths[0]) as temp:
        fig.savefig(temp, dpi=100, bbox_inches="tight")
    plt.close(fig)
    fig, (itl, rate) = plt.subplots(1, 2, figsize=(12, 4))
    for context in sorted({d.context_tokens for d in profile.decode}):
        row = sorted(
            (d for d in profile.decode if d.context_tokens == context),
            key=lambda d: d.num_requests,
        )
        xs = [d.num_requests for d in row]
        label = f"context {context}"
        itl.plot(xs, [d.itl_ms for d in row], marker="o", label=label)
        rate.plot(xs, [d.tokens_per_s for d in row], marker="o", label=label)
    for ax, ylabel in ((itl, "ITL (ms, median request)"), (rate, "output tokens/s")):
        ax.set_xlabel("running requests")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"Decode: {_title(profile)}", fontsize=9)
    with replacing(paths[1]) as temp:
        fig.savefig(temp, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return paths
