"""The value sets every chart test renders: the defaults, each example values file, and the
optional parts switched on (planner over each worker layout, in-chart etcd and NATS). A module
of its own, not conftest.py: tests import it by name, and `conftest` names whichever
directory's conftest was loaded last in a whole-suite run."""

from __future__ import annotations

import json
from typing import Any

from helm_chart import CHART_DIR, EXAMPLES, load_values

PROFILE = json.dumps({"format": "a timing profile; the chart only mounts it"})
PREFILL_PROFILE = json.dumps({"format": "the prefill workers' timing profile"})


def _cases() -> dict[str, dict[str, Any]]:
    cases: dict[str, dict[str, Any]] = {"defaults": {}}
    for path in EXAMPLES:
        cases[path.stem] = load_values(path)
    planner = {"enabled": True, "performanceProfile": PROFILE}
    cases["planner-agg"] = {"planner": planner}
    disagg = load_values(CHART_DIR / "examples" / "disaggregated-gpu-nixl.yaml")
    # the prefill workers with a profile of their own
    prefill = {**planner, "prefillPerformanceProfile": PREFILL_PROFILE}
    cases["planner-disagg"] = {**disagg, "planner": prefill}
    cases["frontend-replicas"] = {"frontend": {"replicas": 3}}
    cases["etcd-nats"] = {
        "runtime": {"discovery": "etcd", "request-plane": "nats", "event-plane": "nats"},
        "etcd": {"enabled": True},
        "nats": {"enabled": True},
    }
    return cases


CASES = _cases()
