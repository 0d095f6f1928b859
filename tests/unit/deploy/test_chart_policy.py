"""Policy checks on every rendered value set: non-root, read-only root filesystems, resource
requests, probes, pinned images, the planner's RBAC exactly as its connector needs it, and a
worker drain that Kubernetes never cuts short."""

from __future__ import annotations

from typing import Any

import pytest
from chart_cases import CASES
from helm_chart import MONITORING_API, RELEASE, Manifests, render

from armature.config import HttpConfig, WorkerProcessConfig
from kube_api import SCALE_RULES

FULL = f"{RELEASE}-armature"
ARMATURE_COMPONENTS = {"frontend", "planner", "worker-agg", "worker-prefill", "worker-decode"}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _component(workload: dict[str, Any]) -> str:
    return str(workload["metadata"]["labels"]["app.kubernetes.io/component"])


def test_every_pod_runs_as_non_root_on_a_read_only_root(case: tuple[str, Any]) -> None:
    for workload, pod in render(case[1]).pod_templates():
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in _containers(pod):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}


def test_every_container_requests_resources_and_pins_its_image(case: tuple[str, Any]) -> None:
    for _, pod in render(case[1]).pod_templates():
        for container in _containers(pod):
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
            repository, _, tag = container["image"].rpartition(":")
            assert repository and tag and tag != "latest", container["image"]
            assert not tag.startswith("latest")


def test_every_long_running_container_has_probes(case: tuple[str, Any]) -> None:
    for _, pod in render(case[1]).pod_templates():
        for container in pod["containers"]:
            assert {"livenessProbe", "readinessProbe"} <= set(container), container["name"]


def test_the_frontend_probes_live_and_health() -> None:
    (container,) = render({}).get("Deployment", f"{FULL}-frontend")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    # the frontend listens only once a worker registered: up to startupTimeoutS (600 s)
    assert (
        container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"]
        == 600
    )


def test_the_frontend_service_selects_the_frontend_pods_on_their_http_port(
    case: tuple[str, Any],
) -> None:
    manifests = render(case[1])
    service = manifests.get("Service", f"{FULL}-frontend")
    selector = service["spec"]["selector"].items()
    pod_labels = {
        workload["metadata"]["name"]: workload["spec"]["template"]["metadata"]["labels"].items()
        for workload in manifests.of_kind("Deployment")
    }
    assert selector and {name for name, labels in pod_labels.items() if selector <= labels} == {
        f"{FULL}-frontend"
    }
    (port,) = service["spec"]["ports"]
    deployment = manifests.get("Deployment", f"{FULL}-frontend")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (port["name"], port["targetPort"]) == ("http", "http")
    assert named["http"] == port["port"]


def test_the_frontend_port_value_moves_the_container_and_service_ports_together() -> None:
    manifests = render({"frontend": {"port": 8123}})
    (port,) = manifests.get("Service", f"{FULL}-frontend")["spec"]["ports"]
    (container,) = manifests.get("Deployment", f"{FULL}-frontend")["spec"]["template"]["spec"][
        "containers"
    ]
    assert (port["port"], port["targetPort"]) == (8123, "http")
    assert container["ports"] == [{"name": "http", "containerPort": 8123, "protocol": "TCP"}]


@pytest.mark.parametrize(
    ("values", "gpus"),
    [
        ({}, {"agg": 0}),
        ({"workers": {"roles": {"agg": {"gpus": 2, "variant": "cuda"}}}}, {"agg": 2}),
        (CASES["disaggregated-gpu-nixl"], {"prefill": 1, "decode": 1}),
    ],
    ids=["cpu", "agg-2-gpus", "disaggregated-gpu-nixl"],
)
def test_worker_gpus_are_requested_not_only_limited(
    values: dict[str, Any], gpus: dict[str, int]
) -> None:
    """The scheduler places a Pod by its requests: a GPU only in the limits would (for an
    extended resource) be copied to the requests by the API server, but the chart states
    both, equal, so what the scheduler reserves is plain in the manifest."""
    manifests = render(values)
    for role, count in gpus.items():
        (container,) = manifests.get("Deployment", f"{FULL}-{role}")["spec"]["template"]["spec"][
            "containers"
        ]
        resources = container["resources"]
        if count == 0:
            assert "nvidia.com/gpu" not in resources["requests"]
            assert "nvidia.com/gpu" not in resources.get("limits", {})
        else:
            assert resources["requests"]["nvidia.com/gpu"] == count, role
            assert resources["limits"]["nvidia.com/gpu"] == count, role


def test_workers_drain_before_kubernetes_kills_them(case: tuple[str, Any]) -> None:
    manifests = render(case[1])
    workers = [w for w in manifests.of_kind("Deployment") if _component(w).startswith("worker-")]
    assert workers
    for workload in workers:
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = container["args"]
        grace_s = float(args[args.index("--shutdown-grace-s") + 1])
        assert pod["terminationGracePeriodSeconds"] == grace_s + 15
        assert container["lifecycle"]["preStop"]["exec"]["command"] == [
            "sh",
            "-c",
            "kill -TERM 1; while kill -0 1 2>/dev/null; do sleep 1; done",
        ]


def test_the_drain_grace_is_the_workers_own_default() -> None:
    (container,) = render({}).get("Deployment", f"{FULL}-agg")["spec"]["template"]["spec"][
        "containers"
    ]
    args = container["args"]
    assert float(args[args.index("--shutdown-grace-s") + 1]) == (
        WorkerProcessConfig().shutdown_grace_s
    )


def test_a_null_drain_grace_is_sized_as_armatures_own_default() -> None:
    """shutdown-grace-s null passes no flag: the frontend and the workers drain for their own
    default, which terminationGracePeriodSeconds covers (it was sized from 0 s: 20 s for the
    frontend, 15 s for a worker, and Kubernetes killed them mid-drain)."""
    assert HttpConfig().shutdown_grace_s == WorkerProcessConfig().shutdown_grace_s == 30.0
    values = {
        "frontend": {"config": {"http": {"shutdown-grace-s": None}}},
        "workers": {"config": {"process": {"shutdown-grace-s": None}}},
    }
    manifests = render(values)
    # the frontend's preStop sleep (5 s), the grace, the margin (15 s)
    for name, period_s in [("frontend", 5 + 30 + 15), ("agg", 30 + 15)]:
        pod = manifests.get("Deployment", f"{FULL}-{name}")["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert "--shutdown-grace-s" not in container["args"]
        assert pod["terminationGracePeriodSeconds"] == period_s, name
    # a role's own null: the same
    role = {"config": {"process": {"shutdown-grace-s": None}}}
    agg = render({"workers": {"roles": {"agg": role}}}).get("Deployment", f"{FULL}-agg")
    assert agg["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45


def test_each_worker_role_has_a_disruption_budget(case: tuple[str, Any]) -> None:
    manifests = render(case[1])
    workers = {
        w["metadata"]["name"]: w["spec"]["selector"]["matchLabels"]
        for w in manifests.of_kind("Deployment")
        if _component(w).startswith("worker-")
    }
    budgets = {
        b["metadata"]["name"]: (b["spec"]["selector"]["matchLabels"], b["spec"]["maxUnavailable"])
        for b in manifests.of_kind("PodDisruptionBudget")
    }
    assert budgets == {name: (labels, 1) for name, labels in workers.items()}


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {
        (verb, group, resource, tuple(sorted(rule.get("resourceNames", ()))))
        for rule in role["rules"]
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


@pytest.mark.parametrize(
    ("name", "scaled"),
    [("planner-agg", (f"{FULL}-agg",)), ("planner-disagg", (f"{FULL}-decode", f"{FULL}-prefill"))],
)
def test_the_planner_may_only_get_and_patch_its_workers_scale(
    name: str, scaled: tuple[str, ...]
) -> None:

    manifests = render(CASES[name])
    role = manifests.get("Role", f"{FULL}-planner-scale")
    names = tuple(sorted(scaled))
    assert _rules(role) == {(verb, group, res, names) for verb, group, res in SCALE_RULES}
    bound = {
        b["roleRef"]["name"]
        for b in manifests.of_kind("RoleBinding")
        if {"kind": "ServiceAccount", "name": f"{FULL}-planner", "namespace": "serving"}
        in b["subjects"]
    }
    # and Kubernetes discovery's read-only role: list and watch Pods, nothing else
    assert bound == {f"{FULL}-planner-scale", f"{FULL}-discovery-watch"}
    watch = manifests.get("Role", f"{FULL}-discovery-watch")
    assert _rules(watch) == {(v, "", "pods", ()) for v in ("get", "list", "watch")}
    assert not manifests.of_kind("ClusterRole") and not manifests.of_kind("ClusterRoleBinding")
    (container,) = manifests.get("Deployment", f"{FULL}-planner")["spec"]["template"]["spec"][
        "containers"
    ]
    flags = dict(zip(container["args"][1::2], container["args"][2::2], strict=False))
    assert flags["--connector"] == "kubernetes"
    for deployment in scaled:
        role_name = deployment.rsplit("-", 1)[1]
        assert flags[f"--k8s-{role_name}-deployment"] == deployment
        # the planner owns the replicas: an upgrade must not reset them
        assert "replicas" not in manifests.get("Deployment", deployment)["spec"]


def test_prometheus_monitors_only_where_the_api_exists() -> None:
    with_api = render({})
    (service_monitor,) = with_api.of_kind("ServiceMonitor")
    (pod_monitor,) = with_api.of_kind("PodMonitor")
    assert service_monitor["apiVersion"] == pod_monitor["apiVersion"] == MONITORING_API
    assert service_monitor["spec"]["endpoints"][0]["port"] == "http"
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    without = render({}, api_versions=())
    assert not without.of_kind("ServiceMonitor") and not without.of_kind("PodMonitor")


def test_prometheus_scrapes_protected_frontend_metrics_with_the_planners_key() -> None:
    """With protect-metrics the frontends answer /metrics only with a key: the ServiceMonitor
    sends the one the planner sends (the first API key; it scraped with none and got 401)."""
    endpoint = {"port": "http", "path": "/metrics", "interval": "15s"}
    (open_metrics,) = render({"secrets": {"apiKeys": ["k1"]}}).of_kind("ServiceMonitor")
    assert open_metrics["spec"]["endpoints"] == [endpoint]
    protected = {"security": {"protect-metrics": True}}
    manifests = render({"secrets": {"apiKeys": ["k1", "k2"]}, "frontend": {"config": protected}})
    (monitor,) = manifests.of_kind("ServiceMonitor")
    secret_key = {"name": f"{FULL}-secrets", "key": "planner-api-key"}
    assert monitor["spec"]["endpoints"] == [
        {**endpoint, "authorization": {"type": "Bearer", "credentials": secret_key}}
    ]
    assert manifests.get("Secret", f"{FULL}-secrets")["data"]["planner-api-key"] == "azE="  # k1
    # a Secret of your own: its planner-api-key
    existing = {"existingSecret": "mine"}
    (monitor,) = render({"secrets": existing, "frontend": {"config": protected}}).of_kind(
        "ServiceMonitor"
    )
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {
        "name": "mine",
        "key": "planner-api-key",
    }


def test_the_dashboard_configmap_is_the_repository_dashboard() -> None:
    from helm_chart import CHART_DIR

    configmap = render({}).get("ConfigMap", f"{FULL}-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    expected = (CHART_DIR / "dashboards" / "armature.json").read_text()
    assert configmap["data"]["armature.json"] == expected.rstrip("\n")


def test_secrets_reach_the_processes_from_one_secret() -> None:
    secrets = {"apiKeys": ["k1", "k2"], "planeSecret": "s3cret"}
    manifests = render({"secrets": secrets, **CASES["planner-agg"]})
    assert "planner" in {_component(w) for w, _ in manifests.pod_templates()}
    secret = manifests.get("Secret", f"{FULL}-secrets")
    assert secret["data"] == {
        "api-keys": "azEsazI=",
        "plane-secret": "czNjcmV0",
        "planner-api-key": "azE=",  # the first key: the planner reads a protected /metrics
    }
    for workload, pod in manifests.pod_templates():
        if _component(workload) not in ARMATURE_COMPONENTS:
            continue
        (container,) = pod["containers"]
        env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in container["env"]}
        assert env["ARMATURE_PLANE_SECRET"] == {"name": f"{FULL}-secrets", "key": "plane-secret"}
        if _component(workload) == "frontend":
            assert env["ARMATURE_API_KEYS"] == {
                "name": f"{FULL}-secrets",
                "key": "api-keys",
                "optional": True,
            }
        if _component(workload) == "planner":
            assert env["ARMATURE_FRONTEND_API_KEY"] == {
                "name": f"{FULL}-secrets",
                "key": "planner-api-key",
                "optional": True,
            }
        assert "--plane-secret" not in container["args"] and "--api-key" not in container["args"]


def test_etcd_and_nats_credentials_reach_every_process_from_the_secret() -> None:
    """etcd's password and a NATS URL (credentials in it) come from the Secret, never on a
    command line (the URL was a flag; nothing could set ARMATURE_ETCD_PASSWORD)."""
    manifests = render(CASES["etcd-tls-nats-credentials"])
    secret = manifests.get("Secret", f"{FULL}-secrets")["data"]
    assert (secret["etcd-password"], secret["nats-url"]) == (
        "ZXRjZC1wYXNz",  # etcd-pass
        "bmF0czovL2FybWF0dXJlOm5hdHMtcGFzc0BuYXRzLmluZnJhOjQyMjI=",  # NATS_URL
    )
    components = set()
    for workload, pod in manifests.pod_templates():
        if _component(workload) not in ARMATURE_COMPONENTS:
            continue
        components.add(_component(workload))
        for container in _containers(pod):  # the frontend's default-model init container too
            env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in container["env"]}
            assert env["ARMATURE_ETCD_PASSWORD"] == {
                "name": f"{FULL}-secrets",
                "key": "etcd-password",
            }
            assert env["ARMATURE_NATS_URL"] == {"name": f"{FULL}-secrets", "key": "nats-url"}
        (container,) = pod["containers"]
        args = container["args"]
        assert "--nats-url" not in args and not [a for a in args if "pass" in a], args
        assert args[args.index("--etcd-user") + 1] == "armature"
    assert components == {"frontend", "planner", "worker-agg"}


def test_an_existing_secret_gives_etcds_password_and_may_give_the_nats_url() -> None:
    values = {
        "secrets": {"existingSecret": "mine"},
        "runtime": {"discovery": "etcd", "etcd-user": "armature", "event-plane": "nats"},
    }
    (container,) = render(values).get("Deployment", f"{FULL}-agg")["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in container["env"]}
    # a missing password stops the Pod at its start; the URL left out: armature's default
    assert env["ARMATURE_ETCD_PASSWORD"] == {"name": "mine", "key": "etcd-password"}
    assert env["ARMATURE_NATS_URL"] == {"name": "mine", "key": "nats-url", "optional": True}
    # the in-chart NATS: its address, as a flag
    in_chart = {**values, "nats": {"enabled": True}}
    agg = render(in_chart).get("Deployment", f"{FULL}-agg")
    (container,) = agg["spec"]["template"]["spec"]["containers"]
    assert "ARMATURE_NATS_URL" not in {e["name"] for e in container["env"]}
    args = container["args"]
    assert args[args.index("--nats-url") + 1] == f"nats://{FULL}-nats:4222"
    # neither where nothing asks for them
    agg = render({"secrets": {"existingSecret": "mine"}}).get("Deployment", f"{FULL}-agg")
    (container,) = agg["spec"]["template"]["spec"]["containers"]
    names = {e["name"] for e in container["env"]}
    assert not {"ARMATURE_ETCD_PASSWORD", "ARMATURE_NATS_URL"} & names


def test_the_frontend_and_the_planner_mount_extra_volumes() -> None:
    """The files their flags name (an API key file, etcd's TLS files) come from volumes of
    their own, as the workers' do (they named paths no volume held)."""
    manifests = render(CASES["etcd-tls-nats-credentials"])
    for name in ("frontend", "planner", "agg"):
        pod = manifests.get("Deployment", f"{FULL}-{name}")["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = container["args"]
        assert args[args.index("--etcd-ca-file") + 1] == "/etc/etcd-tls/ca.crt"
        assert pod["volumes"][-1] == {"name": "etcd-tls", "secret": {"secretName": "etcd-tls"}}
        assert container["volumeMounts"][-1] == {
            "name": "etcd-tls",
            "mountPath": "/etc/etcd-tls",
            "readOnly": True,
        }
    frontend = manifests.get("Deployment", f"{FULL}-frontend")["spec"]["template"]["spec"]
    assert [v["name"] for v in frontend["volumes"]] == ["tmp", "cache", "etcd-tls"]
    assert [m["mountPath"] for m in frontend["containers"][0]["volumeMounts"]] == [
        "/tmp",
        "/cache",
        "/etc/etcd-tls",
    ]
    planner = manifests.get("Deployment", f"{FULL}-planner")["spec"]["template"]["spec"]
    assert [v["name"] for v in planner["volumes"]] == ["tmp", "cache", "profile", "etcd-tls"]


def test_in_chart_etcd_and_nats_are_what_every_process_uses() -> None:

    manifests: Manifests = render(CASES["etcd-nats"])
    assert {f"{FULL}-etcd", f"{FULL}-nats"} <= manifests.names("Service")
    for workload, pod in manifests.pod_templates():
        if _component(workload) not in ARMATURE_COMPONENTS:
            continue
        args = pod["containers"][0]["args"]
        assert args[args.index("--etcd-endpoints") + 1] == f"http://{FULL}-etcd:2379"
        assert args[args.index("--nats-url") + 1] == f"nats://{FULL}-nats:4222"
        assert args[args.index("--discovery") + 1] == "etcd"


def test_frontend_replicas_share_their_load_from_their_pod_ip() -> None:
    """Each replica publishes its in-flight load on its Pod's IP and registers a card (an
    annotation of its own Pod, under Kubernetes discovery) so the others find it."""
    manifests = render(CASES["frontend-replicas"])
    deployment = manifests.get("Deployment", f"{FULL}-frontend")
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    flags = dict(zip(container["args"][1::2], container["args"][2::2], strict=False))
    assert flags["--replica-host"] == "$(POD_IP)"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        container["env"]
    )
    register = manifests.get("RoleBinding", f"{FULL}-discovery-register")
    assert {"kind": "ServiceAccount", "name": f"{FULL}-frontend", "namespace": "serving"} in (
        register["subjects"]
    )
    role = manifests.get("Role", f"{FULL}-discovery-register")
    assert _rules(role) == {(v, "", "pods", ()) for v in ("get", "list", "watch", "patch")}
    # nothing binds the read-only role without a planner
    assert not [b for b in manifests.of_kind("RoleBinding") if "discovery-watch" in str(b)]


def test_a_planner_reads_every_frontend_replica_from_discovery() -> None:
    """With frontend replicas behind the Service, the planner is given no frontend url: it
    reads each replica's /metrics at the address its card names (through the Service it would
    read one replica's share, at random), with the discovery read access that takes."""
    manifests = render({**CASES["planner-agg"], **CASES["frontend-replicas"]})
    (container,) = manifests.get("Deployment", f"{FULL}-planner")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "--frontend-url" not in container["args"]
    watch = manifests.get("RoleBinding", f"{FULL}-discovery-watch")
    assert {"kind": "ServiceAccount", "name": f"{FULL}-planner", "namespace": "serving"} in (
        watch["subjects"]
    )
