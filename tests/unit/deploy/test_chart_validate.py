"""The chart through `helm lint --strict` (Helm's own linter, from helm-python-sdk) and every
rendered object against the Kubernetes API schemas of the oldest and newest Kubernetes we
support (kubernetes-validate, strict: no field the API does not know)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from helm_chart import CHART_DIR, KUBE_VERSIONS, MONITORING_API, render
from helm_python import HelmRenderError

# Prometheus Operator kinds: CRDs, which kubernetes-validate has no schema for
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_helm_lint_strict_passes(case: tuple[str, dict[str, Any]], kube_version: str) -> None:
    _, values = case
    report = helm_python.lint(CHART_DIR, values, strict=True, kube_version=f"v{kube_version}")
    # severity 1 is informational ("icon is recommended": the project has no icon to link)
    findings = [m for m in report["messages"] if m["severity"] > 1]
    assert (findings, report["errors"]) == ([], [])


def test_helm_lint_reports_a_broken_template(tmp_path: Path) -> None:
    chart = tmp_path / "armature"
    shutil.copytree(CHART_DIR, chart)
    service = chart / "templates" / "frontend.yaml"
    service.write_text(service.read_text().replace("{{- end }}", "", 1))
    report = helm_python.lint(chart, strict=True)
    errors = [m for m in report["messages"] if m["severity"] == 3]
    assert [m["path"] for m in errors] == ["templates/"]
    assert "frontend.yaml" in errors[0]["error"]


def test_a_values_mistake_stops_the_render() -> None:
    # lint runs Helm's lint mode, where `required` and `fail` only log: a render stops
    with pytest.raises(HelmRenderError, match=r"model\.pvc\.claimName is required"):
        render({"model": {"source": "pvc"}})
    with pytest.raises(HelmRenderError, match="prefill workers need decode workers"):
        render({"workers": {"roles": {"agg": {"enabled": False}, "prefill": {"enabled": True}}}})
    # an in-chart server that nothing would use (the processes stayed on their defaults)
    with pytest.raises(HelmRenderError, match=r"set runtime\.discovery to etcd"):
        render({"etcd": {"enabled": True}})
    with pytest.raises(HelmRenderError, match=r"set runtime\.request-plane or"):
        render({"nats": {"enabled": True}})
    render({"nats": {"enabled": True}, "runtime": {"event-plane": "nats"}})  # one plane is a use
    # a prefill profile without prefill workers
    planner = {"enabled": True, "performanceProfile": "{}", "prefillPerformanceProfile": "{}"}
    with pytest.raises(HelmRenderError, match=r"prefillPerformanceProfile is for prefill workers"):
        render({"planner": planner})
    # credentials on a command line, or a user without a password
    nats, nats_url = {"request-plane": "nats"}, {"natsUrl": "nats://u:p@nats:4222"}
    with pytest.raises(HelmRenderError, match=r"runtime\.nats-url: give the NATS URL as secrets"):
        render({"runtime": {**nats, "nats-url": "nats://u:p@nats:4222"}})
    with pytest.raises(HelmRenderError, match=r"secrets\.natsUrl names a NATS no process would"):
        render({"secrets": nats_url})
    render({"runtime": nats, "secrets": nats_url})
    with pytest.raises(HelmRenderError, match=r"secrets\.natsUrl names the one they use"):
        render({"runtime": nats, "secrets": nats_url, "nats": {"enabled": True}})
    with pytest.raises(HelmRenderError, match=r"etcd-user needs its password: set secrets\.etcd"):
        render({"runtime": {"discovery": "etcd", "etcd-user": "armature"}})
    with pytest.raises(HelmRenderError, match=r"etcdPassword is runtime\.etcd-user's password"):
        render({"secrets": {"etcdPassword": "pw"}})
    # /metrics protected with no key the planner and Prometheus could send
    protected = {"config": {"security": {"protect-metrics": True}}}
    with pytest.raises(HelmRenderError, match=r"protect-metrics: .* set secrets\.apiKeys$"):
        render({"frontend": protected})


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "sk-prod,2024",
            "secrets.apiKeys[1] holds a comma: the frontend reads the keys as one comma list "
            "(ARMATURE_API_KEYS) and would take it for two keys",
        ),
        (
            " sk-b",
            "secrets.apiKeys[1] starts or ends with a space, which the frontend trims off the "
            "keys of ARMATURE_API_KEYS",
        ),
        ("sk-b\t", "secrets.apiKeys[1] starts or ends with a space"),
        ("", "secrets.apiKeys[1] is empty"),
    ],
)
def test_an_api_key_the_frontend_would_not_read_whole_stops_the_render(
    key: str, message: str
) -> None:
    """The Secret joins the keys into one comma list, which the frontend splits and trims:
    "sk-prod,2024" was two keys, "sk-prod" and "2024". The message never shows the key."""
    with pytest.raises(HelmRenderError) as error:
        render({"secrets": {"apiKeys": ["sk-a", key]}})
    assert f"): {message}" in str(error.value)
    assert not key.strip() or key.strip() not in str(error.value)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_rendered_objects_pass_the_api_schemas(
    case: tuple[str, dict[str, Any]], kube_version: str
) -> None:
    _, values = case
    checked = set()
    for obj in render(values, kube_version=kube_version).objects:
        if obj["kind"] in CRD_KINDS:
            assert obj["apiVersion"] == MONITORING_API
            continue
        kubernetes_validate.validate(obj, kube_version, strict=True)
        checked.add(obj["kind"])
    assert {"Deployment", "Service", "Secret", "PodDisruptionBudget"} <= checked


def get_kube_version_floor(constraint: str) -> tuple[int, int, int]:
    """The lower bound of a Chart.yaml `kubeVersion` constraint (">=1.30.0-0", possibly with
    an upper bound beside it): its one `>=` term; the `-0` only lets pre-releases in."""
    floors = re.findall(r">=\s*v?(\d+)\.(\d+)\.(\d+)", constraint)
    assert len(floors) == 1, constraint
    major, minor, patch = (int(part) for part in floors[0])
    return major, minor, patch


def test_the_oldest_kubernetes_validated_is_the_charts_kube_version_floor() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    checked = sorted(tuple(int(p) for p in v.split(".")) for v in KUBE_VERSIONS)
    assert checked[0] == get_kube_version_floor(chart["kubeVersion"])
    assert get_kube_version_floor(">= v1.28.3-0 <1.40.0-0") == (1, 28, 3)


def test_the_schema_check_rejects_an_unknown_field() -> None:
    deployment = render({}).get("Deployment", "demo-armature-frontend")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)
