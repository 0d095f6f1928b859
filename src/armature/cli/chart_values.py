"""The configuration blocks of the Helm chart's values.yaml (`deploy/helm/armature`),
generated from the configuration tree, so that the chart's flags map one to one to it:

    values key  <section>.<flag>        e.g. workers.config.engine.max-num-seqs -> --max-num-seqs
    null        armature's own default (shown in the comment; the chart passes no flag)

A setting the chart sets itself (the Pod's address, its ports, the role of each Deployment,
secrets) has no key: its comment says what sets it (`ValuesBlock.owned`). A command's own
top-level settings form a section named after it (`frontend.config.frontend.seed`), as in
the README's flag tables. `python -m armature.cli.chart_values deploy/helm/armature/values.yaml`
rewrites every block between its markers; a test fails when the file and the definitions
differ, and another when a setting has neither a key nor an owner."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from armature.cli.flags_table import get_section_title, show_default
from armature.config import (
    FrontendConfig,
    PlannerCommandConfig,
    RuntimeConfig,
    Setting,
    WorkerConfig,
    flag_name,
    iter_settings,
)

__all__ = [
    "BLOCKS",
    "ValuesBlock",
    "begin_marker",
    "check_blocks",
    "end_marker",
    "get_values_key",
    "render_block",
    "rewrite",
]

FieldPath = tuple[str, ...]


@dataclass(frozen=True)
class ValuesBlock:
    """One generated block: the settings of `config_type` under the values path `name`.

    `elsewhere`: a section kept in another block (section -> that block's values path).
    `owned`: a setting the chart sets itself -> what sets it (no values key).
    `stated`: a setting whose value the chart's templates read (a key with the config's own
    default instead of null; e.g. the drain grace, which sizes terminationGracePeriodSeconds).
    `overrides`: a setting the chart defaults differently -> (its value, why)."""

    name: str
    config_type: type[Any]
    top_section: str | None = None
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    owned: Mapping[FieldPath, str] = field(default_factory=dict)
    stated: frozenset[FieldPath] = frozenset()
    overrides: Mapping[FieldPath, tuple[Any, str]] = field(default_factory=dict)

    @property
    def indent(self) -> int:
        return 2 * (self.name.count(".") + 1)


_LOCAL_ONLY = "not used: the chart's planner scales Deployments (--connector kubernetes)"
BLOCKS: tuple[ValuesBlock, ...] = (
    ValuesBlock(
        "runtime",
        RuntimeConfig,
        owned={
            ("plane_secret",): "the Secret (secrets.planeSecret), as ARMATURE_PLANE_SECRET",
            # a URL's credentials on a command line show to whoever can read the Pod
            ("nats_url",): "the Secret (secrets.natsUrl), as ARMATURE_NATS_URL; else the "
            "in-chart NATS (nats.enabled)",
        },
        overrides={
            ("discovery",): ("kubernetes", "the chart's default: Kubernetes-native discovery"),
        },
    ),
    ValuesBlock(
        "frontend.config",
        FrontendConfig,
        top_section="frontend",
        elsewhere={"runtime": "runtime"},
        owned={
            ("http", "host"): "the chart: 0.0.0.0, every address of the Pod",
            ("http", "port"): "frontend.port",
            ("http", "reuse_port"): "the chart: off (one frontend per Pod)",
            ("replicas", "replica_host"): "the chart: the Pod's IP (the replicas share load)",
            ("security", "api_keys"): "the Secret (secrets.apiKeys), as ARMATURE_API_KEYS",
        },
        stated=frozenset({("http", "shutdown_grace_s")}),
    ),
    ValuesBlock(
        "workers.config",
        WorkerConfig,
        elsewhere={"runtime": "runtime"},
        owned={
            ("engine", "model"): "model (its source: the default model, a PVC, a hostPath or "
            "a path in the image)",
            ("process", "host"): "the chart: the Pod's IP (downward API), which it advertises",
            ("process", "port"): "workers.ports.request",
            ("process", "metrics_port"): "workers.ports.metrics",
            ("process", "kv_transfer_port"): "workers.ports.kvTransfer",
            ("process", "role"): "the role of each Deployment (workers.roles)",
            ("process", "instance_id"): "the chart: none, each Pod draws its own",
        },
        stated=frozenset({("process", "shutdown_grace_s")}),
    ),
    ValuesBlock(
        "planner.config",
        PlannerCommandConfig,
        elsewhere={"runtime": "runtime"},
        owned={
            ("planner", "mode"): "the chart: agg with workers.roles.agg, else disagg",
            ("service", "frontend_api_key"): (
                "the Secret (the first of secrets.apiKeys), as ARMATURE_FRONTEND_API_KEY"
            ),
            ("service", "performance_model"): "planner.performanceProfile (a ConfigMap)",
            ("service", "prefill_performance_model"): (
                "planner.prefillPerformanceProfile (a ConfigMap)"
            ),
            ("service", "connector"): "the chart: kubernetes",
            ("service", "worker_args"): _LOCAL_ONLY,
            ("service", "prefill_worker_args"): _LOCAL_ONLY,
            ("service", "worker_log_dir"): _LOCAL_ONLY,
            ("service", "drain_timeout_s"): _LOCAL_ONLY,
            ("service", "ack_timeout_s"): _LOCAL_ONLY,
            ("service", "k8s_namespace"): "the chart: the release's namespace",
            ("service", "k8s_prefill_deployment"): "the chart: the prefill Deployment",
            ("service", "k8s_decode_deployment"): "the chart: the decode Deployment",
            ("service", "k8s_agg_deployment"): "the chart: the agg Deployment",
            ("service", "host"): "the chart: 0.0.0.0, every address of the Pod",
            ("service", "metrics_port"): "planner.metricsPort",
        },
    ),
)


def begin_marker(block: ValuesBlock) -> str:
    return f"# >>> generated by python -m armature.cli.chart_values: {block.name}"


def end_marker(block: ValuesBlock) -> str:
    return f"# <<< end of generated {block.name}"


def get_values_key(block: ValuesBlock, path: FieldPath, setting: Setting) -> tuple[str, str]:
    """(section, key) of a setting in `block`: its config section (or the block's
    `top_section` for a command's own settings) and its flag without dashes."""
    section = path[0] if len(path) > 1 else (block.top_section or "")
    return section, flag_name(path[-1], setting)


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return json.dumps([str(v) for v in value])
    return json.dumps(str(value))


def _comment(text: str, indent: int) -> list[str]:
    prefix = " " * indent + "# "
    return textwrap.wrap(text, 100, initial_indent=prefix, subsequent_indent=prefix)


def _entries(block: ValuesBlock) -> Iterator[tuple[str, list[str]]]:
    """(section, lines) for every setting of the block, in definition order."""
    defaults = block.config_type()
    for path, f, setting in iter_settings(block.config_type):
        if len(path) > 1 and path[0] in block.elsewhere:
            continue
        section, key = get_values_key(block, path, setting)
        indent = block.indent + (2 if section else 0)
        default = defaults
        for name in path:
            default = getattr(default, name)
        shown = show_default(default, setting, f.name) or "none"
        if path in block.owned:
            yield section, _comment(f"--{key}: set by {block.owned[path]}", indent)
            continue
        lines = _comment(f"--{key} [{shown}]: {setting.help}", indent)
        value: Any = None
        if path in block.stated:
            value = default
        if path in block.overrides:
            value, why = block.overrides[path]
            lines += _comment(f"{why} (armature's own: {shown})", indent)
        lines.append(f"{' ' * indent}{key}: {_yaml_scalar(value)}")
        yield section, lines


def _section_comment(block: ValuesBlock, section: str) -> list[str]:
    """The comment above a section's key: the first sentence of its docstring."""
    if section == block.top_section:
        title = f"{get_section_title(block.config_type, section)}: the command's own settings"
    else:
        title = get_section_title(get_type_hints(block.config_type)[section], section)
    return _comment(f"-- {title}", block.indent)


def render_block(block: ValuesBlock) -> str:
    """The block's text, its markers included, indented for its place in values.yaml: every
    key, sections included, under a comment of its own."""
    pad = " " * block.indent
    out = [pad + begin_marker(block)]
    out += _comment("null: armature's own default, in brackets; no flag is passed", block.indent)
    sections: dict[str, list[str]] = {}
    for section, lines in _entries(block):
        sections.setdefault(section, []).extend(lines)
    for section, lines in sections.items():
        if section:
            out += _section_comment(block, section)
            out.append(f"{pad}{section}:")
        out += lines
    for section, where in block.elsewhere.items():
        out += _comment(f"{section}: the top-level `{where}` values", block.indent)
    out.append(pad + end_marker(block))
    return "\n".join(out)


def rewrite(text: str) -> str:
    """`text` with every block between its markers replaced by the current one."""
    for block in BLOCKS:
        begin, end = begin_marker(block), end_marker(block)
        start = text.index(begin)
        start = text.rindex("\n", 0, start) + 1
        stop = text.index(end) + len(end)
        text = text[:start] + render_block(block) + text[stop:]
    return text


def check_blocks() -> None:
    """Every `owned`, `stated` and `overrides` path names a setting of its block."""
    for block in BLOCKS:
        paths = {path for path, _, _ in iter_settings(block.config_type)}
        named = set(block.owned) | block.stated | set(block.overrides)
        assert named <= paths, (block.name, sorted(named - paths))


if __name__ == "__main__":
    check_blocks()
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/helm/armature/values.yaml")
    target.write_text(rewrite(target.read_text()))
