"""The value sets every chart test renders: the defaults, each example values file, and the
optional parts switched on (planner over each worker layout, in-chart etcd and NATS, etcd and
NATS credentials). A module of its own, not conftest.py: tests import it by name, and
`conftest` names whichever directory's conftest was loaded last in a whole-suite run."""

from __future__ import annotations

import json
from typing import Any

from helm_chart import CHART_DIR, EXAMPLES, load_values

PROFILE = json.dumps({"format": "a timing profile; the chart only mounts it"})
PREFILL_PROFILE = json.dumps({"format": "the prefill workers' timing profile"})
NATS_URL = "nats://armature:nats-pass@nats.infra:4222"


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
    # etcd with a user and TLS, a NATS URL with credentials: from the Secret and volumes
    tls = {
        "volumes": [{"name": "etcd-tls", "secret": {"secretName": "etcd-tls"}}],
        "volumeMounts": [{"name": "etcd-tls", "mountPath": "/etc/etcd-tls", "readOnly": True}],
    }
    cases["etcd-tls-nats-credentials"] = {
        "runtime": {
            "discovery": "etcd",
            "etcd-endpoints": "https://etcd.infra:2379",
            "etcd-user": "armature",
            "etcd-ca-file": "/etc/etcd-tls/ca.crt",
            "request-plane": "nats",
            "event-plane": "nats",
        },
        "secrets": {"etcdPassword": "etcd-pass", "natsUrl": NATS_URL},
        "frontend": tls,
        "planner": {**planner, **tls},
        "workers": {"roles": {"agg": tls}},
    }
    return cases


CASES = _cases()
