"""The chart's flags map one to one to the configuration tree: values.yaml's generated blocks
are in step with the definitions, every setting has a values key or is set by the chart, and
the command line each Deployment renders parses (with armature's own parser) into exactly the
configuration its values say."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml
from chart_cases import CASES, NATS_URL, PREFILL_PROFILE, PROFILE
from helm_chart import CHART_DIR, EXAMPLES, RELEASE, Manifests, load_values, render

from armature.cli.chart_values import BLOCKS, ValuesBlock, check_blocks, get_values_key, rewrite
from armature.cli.main import build_parser
from armature.cli.options import read_settings
from armature.config import (
    FrontendConfig,
    PlannerCommandConfig,
    Setting,
    WorkerConfig,
    get_setting_value,
    iter_settings,
)
from armature.protocols.worker import WorkerRole

VALUES_FILE = CHART_DIR / "values.yaml"
FULL = f"{RELEASE}-armature"
BLOCK = {block.name: block for block in BLOCKS}


def _at(tree: dict[str, Any], dotted: str) -> dict[str, Any]:
    for name in dotted.split("."):
        tree = tree[name]
    return tree


def test_the_generated_blocks_are_in_step_with_the_config() -> None:
    check_blocks()
    text = VALUES_FILE.read_text()
    assert rewrite(text) == text, (
        "run: python -m armature.cli.chart_values deploy/helm/armature/values.yaml"
    )


def _keys_check(block: ValuesBlock, values: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """(settings of `block` with neither a values key nor an owner, values keys that are no
    setting) in the values tree `values`."""
    tree = _at(values, block.name) or {}
    settings = list(iter_settings(block.config_type))
    if all(len(path) == 1 for path, _, _ in settings):
        found = {("", key) for key in tree}
    else:
        found = {(section, key) for section, keys in tree.items() for key in keys}
    expected = {}
    for path, _, setting in settings:
        if len(path) > 1 and path[0] in block.elsewhere:
            assert block.elsewhere[path[0]] in BLOCK, path
        elif path not in block.owned:
            expected[get_values_key(block, path, setting)] = path
    missing = [path for key, path in expected.items() if key not in found]
    return missing, sorted(found - set(expected))


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_every_setting_has_a_values_key_or_an_owner(block: ValuesBlock) -> None:
    assert _keys_check(block, yaml.safe_load(VALUES_FILE.read_text())) == ([], [])


def test_a_worker_setting_without_a_key_fails_the_check() -> None:
    values = yaml.safe_load(VALUES_FILE.read_text())
    del values["workers"]["config"]["engine"]["max-num-seqs"]
    values["workers"]["config"]["kv"]["kv-cache-blocks"] = 8
    assert _keys_check(BLOCK["workers.config"], values) == (
        [("engine", "max_num_seqs")],
        [("kv", "kv-cache-blocks")],
    )


def _expected_value(value: Any, setting: Setting, default: Any) -> Any:
    """What a values entry means to armature: null its default, a switch on or off, a list
    one comma-joined value, anything else the flag's text parsed."""
    if value is None:
        return default
    if isinstance(value, bool):
        return (not setting.negate) if value else default
    text = ",".join(value) if isinstance(value, list) else str(value)
    if isinstance(value, float) and value.is_integer():
        text = str(int(value))
    return (setting.parse or str)(text)


def _check_config(
    config: Any, block: ValuesBlock, sections: dict[str, Any], runtime: dict[str, Any]
) -> None:
    defaults = block.config_type()
    for path, _, setting in iter_settings(block.config_type):
        if path in block.owned:
            continue
        if len(path) > 1 and path[0] == "runtime":
            section, key = get_values_key(BLOCK["runtime"], path[1:], setting)
            value = runtime.get(key)
        else:
            section, key = get_values_key(block, path, setting)
            value = sections.get(section, {}).get(key)
        expected = _expected_value(value, setting, get_setting_value(defaults, path))
        assert get_setting_value(config, path) == expected, (path, value)


def _parse(args: list[str], config_type: type[Any]) -> Any:
    args = [a.replace("$(POD_IP)", "pod-ip") for a in args]
    return read_settings(build_parser().parse_args(args), config_type)


@pytest.fixture(autouse=True)
def _no_armature_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("ARMATURE_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("path", [VALUES_FILE, *EXAMPLES], ids=lambda p: p.name)
def test_worker_args_parse_into_the_values_config(path: Any) -> None:
    chart_values = load_values(VALUES_FILE)
    values = load_values(path) if path != VALUES_FILE else {}
    merged = render(values)
    runtime = {**chart_values["runtime"], **values.get("runtime", {})}
    shared = chart_values["workers"]["config"]
    overrides = values.get("workers", {}).get("config", {})
    roles = {**chart_values["workers"]["roles"]}
    for role, spec in values.get("workers", {}).get("roles", {}).items():
        roles[role] = {**roles[role], **spec}
    checked = []
    for role, spec in roles.items():
        if not spec["enabled"]:
            continue
        workload = merged.get("Deployment", f"{FULL}-{role}")
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        config: WorkerConfig = _parse(container["args"], WorkerConfig)
        sections = {s: {**shared.get(s, {}), **overrides.get(s, {})} for s in shared}
        for section, settings in (spec.get("config") or {}).items():
            sections[section] = {**sections[section], **settings}
        _check_config(config, BLOCK["workers.config"], sections, runtime)
        assert config.process.role is WorkerRole(role)
        assert (config.process.host, config.process.port) == ("pod-ip", 9000)
        assert (config.process.metrics_port, config.process.kv_transfer_port) == (9090, 9100)
        assert config.process.instance_id is None
        checked.append(role)
    assert checked


def test_the_model_source_sets_the_model_flag() -> None:
    for model, expected in [
        ({"source": "default"}, None),
        ({"source": "pvc", "pvc": {"claimName": "m", "subPath": "llama/8b"}}, "/models/llama/8b"),
        ({"source": "pvc", "pvc": {"claimName": "m"}}, "/models"),
        ({"source": "hostPath", "hostPath": {"path": "/data/m"}}, "/models"),
        ({"source": "image", "image": {"path": "/opt/model"}}, "/opt/model"),
    ]:
        workload = render({"model": model}).get("Deployment", f"{FULL}-agg")
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        assert _parse(container["args"], WorkerConfig).engine.model == expected, model


def test_frontend_and_planner_args_parse_into_the_values_config() -> None:

    values = {
        "planner": {
            "enabled": True,
            "performanceProfile": PROFILE,
            "config": {"planner": {"ttft-ms": 250, "planner-queue-blind": True}},
        },
        "frontend": {"config": {"router": {"router": "least-loaded"}, "frontend": {"seed": 7}}},
    }
    manifests = render(values)
    chart_values = load_values(VALUES_FILE)
    runtime = {**chart_values["runtime"], **values.get("runtime", {})}

    (frontend,) = manifests.get("Deployment", f"{FULL}-frontend")["spec"]["template"]["spec"][
        "containers"
    ]
    config: FrontendConfig = _parse(frontend["args"], FrontendConfig)
    sections = chart_values["frontend"]["config"]
    sections["router"]["router"] = "least-loaded"
    sections["frontend"]["seed"] = 7
    _check_config(config, BLOCK["frontend.config"], sections, runtime)
    assert (config.http.host, config.http.port) == ("0.0.0.0", 8000)

    (planner,) = manifests.get("Deployment", f"{FULL}-planner")["spec"]["template"]["spec"][
        "containers"
    ]
    planned: PlannerCommandConfig = _parse(planner["args"], PlannerCommandConfig)
    sections = chart_values["planner"]["config"]
    sections["planner"].update({"ttft-ms": 250, "planner-queue-blind": True})
    _check_config(planned, BLOCK["planner.config"], sections, runtime)
    assert planned.planner.ttft_ms == 250.0 and planned.planner.queue_aware is False
    assert (planned.planner.mode, planned.service.connector) == ("agg", "kubernetes")
    assert planned.service.frontend_url is None  # every frontend replica, from discovery
    assert planned.service.k8s_agg_deployment == f"{FULL}-agg"
    assert planned.service.k8s_namespace == "serving"
    assert planned.service.performance_model == "/etc/armature/profile/profile.json"
    assert planned.service.prefill_performance_model is None


def test_the_prefill_workers_profile_is_mounted_beside_the_workers() -> None:
    manifests = render(CASES["planner-disagg"])
    (planner,) = manifests.get("Deployment", f"{FULL}-planner")["spec"]["template"]["spec"][
        "containers"
    ]
    planned: PlannerCommandConfig = _parse(planner["args"], PlannerCommandConfig)
    assert planned.planner.mode == "disagg"
    assert planned.service.performance_model == "/etc/armature/profile/profile.json"
    assert planned.service.prefill_performance_model == "/etc/armature/profile/prefill_profile.json"
    profiles = manifests.get("ConfigMap", f"{FULL}-planner-profile")["data"]
    assert profiles == {"profile.json": PROFILE, "prefill_profile.json": PREFILL_PROFILE}


def _pod_environment(manifests: Manifests, container: dict[str, Any]) -> dict[str, str]:
    """The container's variables as Kubernetes sets them from values and from the chart's
    Secret (the downward API's left out)."""
    secret = manifests.get("Secret", f"{FULL}-secrets")["data"]
    env = {}
    for variable in container["env"]:
        ref = variable.get("valueFrom", {}).get("secretKeyRef")
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif ref is not None and ref["key"] in secret:
            env[variable["name"]] = base64.b64decode(secret[ref["key"]]).decode()
    return env


def test_credentials_from_the_secret_parse_into_the_runtime_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The NATS URL reaches each process as the variable armature's parser reads it by, and
    etcd's password as the one etcd discovery reads."""
    manifests = render(CASES["etcd-tls-nats-credentials"])
    for name, config_type in [
        ("frontend", FrontendConfig),
        ("planner", PlannerCommandConfig),
        ("agg", WorkerConfig),
    ]:
        (container,) = manifests.get("Deployment", f"{FULL}-{name}")["spec"]["template"]["spec"][
            "containers"
        ]
        env = _pod_environment(manifests, container)
        assert env["ARMATURE_ETCD_PASSWORD"] == "etcd-pass"  # src/armature/runtime/factory.py
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            runtime = _parse(container["args"], config_type).runtime
        assert (runtime.nats_url, runtime.etcd_user) == (NATS_URL, "armature"), name
