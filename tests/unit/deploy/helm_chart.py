"""The Helm chart (deploy/helm/armature) rendered through Helm's own engine, offline.

helm-python-sdk binds Helm's Go library (libhelm_c); no helm binary and no cluster. Its
`Chart.render` passes a release name, namespace and install flags, but not the two options
its native `helm_render` also takes: `api_versions` (what `.Capabilities.APIVersions.Has`
sees, which gates the Prometheus Operator objects) and `kube_version`. `render` calls that
native function with them."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native

__all__ = [
    "CHART_DIR",
    "EXAMPLES",
    "KUBE_VERSIONS",
    "MONITORING_API",
    "RELEASE",
    "Manifests",
    "load_values",
    "render",
]

REPO = Path(__file__).resolve().parents[3]
CHART_DIR = REPO / "deploy" / "helm" / "armature"
EXAMPLES = sorted((CHART_DIR / "examples").glob("*.yaml"))
# the oldest and newest Kubernetes we support (kubernetes-validate knows 1.25 to 1.37)
KUBE_VERSIONS = ("1.30.0", "1.37.0")
MONITORING_API = "monitoring.coreos.com/v1"
RELEASE = "demo"
NAMESPACE = "serving"


def load_values(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return values


class Manifests:
    """The objects of one render, by kind and name."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        return found

    def names(self, kind: str) -> set[str]:
        return {o["metadata"]["name"] for o in self.of_kind(kind)}

    def pod_templates(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(workload, its Pod spec) for every Deployment."""
        for workload in self.of_kind("Deployment"):
            yield workload, workload["spec"]["template"]["spec"]


def render(
    values: Mapping[str, Any],
    *,
    api_versions: tuple[str, ...] = (MONITORING_API,),
    kube_version: str = KUBE_VERSIONS[-1],
) -> Manifests:
    """Every object the chart renders for `values` (NOTES.txt left out)."""
    return _render(json.dumps(values, sort_keys=True), api_versions, kube_version)


@functools.lru_cache(maxsize=32)
def _render(values_json: str, api_versions: tuple[str, ...], kube_version: str) -> Manifests:
    options = {
        "name": RELEASE,
        "namespace": NAMESPACE,
        "is_install": True,
        "api_versions": list(api_versions),
        "kube_version": f"v{kube_version}",
    }
    with helm_python.Chart.load(CHART_DIR) as chart:
        rendered = json.loads(
            _native.call_string("helm_render", chart._raw(), values_json, json.dumps(options))
        )
    objects = [
        doc
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return Manifests(objects)
