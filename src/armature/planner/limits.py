"""Worker limits: each role's min and max, and a total over roles (--max-total-workers, or
the GPU budget over GPUs per worker). `PlannerConfig` has already rejected limits that cannot
all hold, so a fit always exists.

Over the total, roles shrink in proportion to what they asked (largest remainder: each gets
floor(wanted x total / sum wanted), at least its min (taken back from the role furthest above
its own min when mins overfill), and the workers left go to the largest fractional parts,
first role first on ties)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from armature.config.planner import PlannerConfig
from armature.planner.decisions import LimitReason
from armature.protocols.worker import WorkerRole

__all__ = ["apply_limits"]


def apply_limits(
    config: PlannerConfig, wanted: Mapping[WorkerRole, int]
) -> dict[WorkerRole, tuple[int, LimitReason | None]]:
    """Each role's count within the limits, and the limit that changed it (None: as wanted).
    `wanted` names every role of `config.get_roles()`, in that order."""
    out: dict[WorkerRole, tuple[int, LimitReason | None]] = {}
    for role, num in wanted.items():
        limits = config.get_role_limits(role)
        if num < limits.min_workers:
            out[role] = (limits.min_workers, LimitReason.MIN_WORKERS)
        elif num > limits.max_workers:
            out[role] = (limits.max_workers, LimitReason.MAX_WORKERS)
        else:
            out[role] = (num, None)
    max_total = config.get_max_total_workers()
    asked = sum(num for num, _ in out.values())
    if max_total is None or asked <= max_total:
        return out
    shares = {role: num * max_total / asked for role, (num, _) in out.items()}
    fitted = {
        role: max(config.get_role_limits(role).min_workers, math.floor(share))
        for role, share in shares.items()
    }
    while sum(fitted.values()) > max_total:  # the mins took more than their shares
        roomy = max(fitted, key=lambda r: fitted[r] - config.get_role_limits(r).min_workers)
        fitted[roomy] -= 1
    by_remainder = sorted(shares, key=lambda r: -(shares[r] - math.floor(shares[r])))
    for role in by_remainder:
        if sum(fitted.values()) >= max_total:
            break
        if fitted[role] < out[role][0]:
            fitted[role] += 1
    result: dict[WorkerRole, tuple[int, LimitReason | None]] = {}
    for role, num in fitted.items():
        clamped, limit = out[role]
        result[role] = (num, LimitReason.TOTAL_WORKERS if num != clamped else limit)
    return result
