"""How far this machine's speed moved between profiles of the same engine: the same points of
each profile (the longest prefill alone; decode at one request and at the most, at the
shortest context) against the first profile's. A benchmark that predicts from one profile and
measures later shows it beside its errors, so that drift is not read as a model error. The
load pass's factor, when the profile has one, is the last column."""

from __future__ import annotations

from armature.protocols.timing_profile import TimingProfile
from bench.report import markdown_table

__all__ = ["drift_table"]


def drift_table(profiles: list[tuple[str, TimingProfile]]) -> str:
    """The same points of each profile, and how far each moved from the first."""
    first = profiles[0][1]
    prefill = max(
        (p for p in first.prefill if p.num_requests == 1 and not p.context_tokens),
        key=lambda p: p.input_tokens,
    )
    decodes = [
        p
        for p in first.decode
        if p.context_tokens == min(d.context_tokens for d in first.decode)
        and p.num_requests in (1, max(d.num_requests for d in first.decode))
    ]

    def cell(value: float, reference: float) -> str:
        return f"{value:.1f} ({(value - reference) / reference:+.1%})"

    rows = []
    for when, profile in profiles:
        ttft_ms = {
            (p.num_requests, p.input_tokens): p.ttft_ms
            for p in profile.prefill
            if not p.context_tokens
        }
        itl_ms = {(p.num_requests, p.context_tokens): p.itl_ms for p in profile.decode}
        row: list[object] = [when, profile.source.created_at]
        pairs = [(ttft_ms.get((1, prefill.input_tokens)), prefill.ttft_ms)]
        pairs += [(itl_ms.get((d.num_requests, d.context_tokens)), d.itl_ms) for d in decodes]
        row += ["" if value is None else cell(value, reference) for value, reference in pairs]
        row.append("" if profile.load is None else f"{profile.load.factor:.3f}")
        rows.append(row)
    return markdown_table(
        [
            "profile",
            "made at",
            f"prefill {prefill.input_tokens} tokens TTFT ms",
            *(f"decode {d.num_requests} x {d.context_tokens} ITL ms" for d in decodes),
            "load pass factor",
        ],
        rows,
    )
