"""The configuration tree: every setting round-trips through its flag (`to_argv` then the
command's parser), `serve` forwards every worker setting to its worker processes, and every
flag's `ARMATURE_*` variable sets its default."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from armature.cli.main import build_parser, main
from armature.cli.options import read_settings
from armature.config import (
    EngineConfig,
    FrontendConfig,
    KvCacheConfig,
    KvTierConfig,
    PlannerCommandConfig,
    RuntimeConfig,
    ServeConfig,
    Setting,
    TransferConfig,
    WorkerConfig,
    env_name,
    get_setting_value,
    iter_settings,
    to_argv,
)
from armature.errors import ConfigError
from armature.frontend.worker_processes import (
    fleet_runtime,
    worker_command,
    worker_configs,
    worker_environment,
)
from armature.model.source import ResolvedModel


def _other_value(field: dataclasses.Field[Any], setting: Setting, default: Any) -> Any:
    """A valid value of the setting that is not its default."""
    if isinstance(field.default, bool):
        return not default
    if setting.choices is not None:
        return next(c for c in setting.choices if c != default)
    if field.name == "engine":
        return "mocker"
    if field.name == "policy":
        return "kv" if default != "kv" else "least-loaded"
    if field.name == "kv_transfer_backends":
        return ("nixl", "tcp")
    if field.name == "lora_modules":
        return ("a=/tmp/lora-a", "b=/tmp/lora-b")
    if setting.repeat:
        return ("key-a", "key-b")
    if field.name in ("load_bound", "share_bound"):
        return 1.5  # 0 (none) or above 1
    if isinstance(default, float):
        return default + 0.25 if field.name != "busy_kv_usage" else 0.75
    if isinstance(default, int):
        return default + 7
    if field.type in ("int | None",):
        return 0.75 if field.name == "busy_kv_usage" else 4097
    if field.type == "float | None":
        return 0.75
    return f"/tmp/{field.name}-value"


def everything_changed(config_type: type[Any]) -> Any:
    """An instance of `config_type` with every setting set to a non-default value."""
    defaults = config_type()

    def build(kind: type[Any], path: tuple[str, ...]) -> Any:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(kind):
            sub = getattr(get_setting_value(defaults, path), f.name)
            if dataclasses.is_dataclass(sub):
                values[f.name] = build(type(sub), (*path, f.name))
            elif "setting" in f.metadata:
                values[f.name] = _other_value(f, f.metadata["setting"], sub)
        return dataclasses.replace(get_setting_value(defaults, path), **values)

    return build(config_type, ())


def parse(command: str, argv: list[str], config_type: type[Any]) -> Any:
    return read_settings(build_parser().parse_args([command, *argv]), config_type)


@pytest.mark.parametrize(
    ("command", "config_type"),
    [
        ("worker", WorkerConfig),
        ("frontend", FrontendConfig),
        ("serve", ServeConfig),
    ],
)
def test_every_setting_round_trips_through_its_flag(command: str, config_type: type[Any]) -> None:
    changed = everything_changed(config_type)
    settings = list(iter_settings(config_type))
    assert all(
        get_setting_value(changed, path) != get_setting_value(config_type(), path)
        for path, _, _ in settings
    )
    secrets = {path for path, _, s in settings if s.secret}
    public = dataclasses.replace(changed)
    for path in secrets:  # secrets travel in the environment, never on a command line
        section = get_setting_value(public, path[:-1]) if len(path) > 1 else public
        default = get_setting_value(config_type(), path)
        replaced = dataclasses.replace(section, **{path[-1]: default})
        public = _set(public, path[:-1], replaced) if len(path) > 1 else replaced
    argv = to_argv(changed)
    assert parse(command, argv, config_type) == public
    assert all(token not in argv for token in ("key-a", "--plane-secret"))


def _set(config: Any, path: tuple[str, ...], value: Any) -> Any:
    if len(path) == 1:
        return dataclasses.replace(config, **{path[0]: value})
    inner = _set(getattr(config, path[0]), path[1:], value)
    return dataclasses.replace(config, **{path[0]: inner})


def test_planner_command_settings_round_trip_through_their_flags() -> None:
    """`armature planner` takes the planner's, its service's and the runtime's settings
    without a clash (the generic values above break the planner's limits: set by hand)."""
    from armature.config import PlannerConfig, PlannerServiceConfig

    config = PlannerCommandConfig(
        planner=PlannerConfig(ttft_ms=300.0, mode="agg", queue_aware=False, max_workers=4),
        service=PlannerServiceConfig(
            frontend_url="http://127.0.0.1:9000",
            frontend_wait_s=5.0,
            performance_model="/tmp/table.json",
            prefill_performance_model="/tmp/prefill.json",
            connector="virtual",
            worker_args=("--engine mocker", "--speedup-ratio 10"),
            prefill_worker_args=("--engine mocker", "--num-kv-blocks 64"),
            worker_log_dir="/tmp/workers",
            drain_timeout_s=20.0,
            ack_timeout_s=15.0,
            k8s_namespace="inference",
            k8s_prefill_deployment="p",
            k8s_decode_deployment="d",
            k8s_agg_deployment="a",
            dry_run=True,
            host="127.0.0.2",
            metrics_port=9100,
            log_level="debug",
        ),
        runtime=RuntimeConfig(namespace="fleet", discovery_dir="/tmp/discovery"),
    )
    # every setting but the secret (never on a command line: the environment carries it)
    service_settings = [s for s in iter_settings(PlannerServiceConfig) if not s[2].secret]
    assert all(
        get_setting_value(config.service, path) != get_setting_value(PlannerServiceConfig(), path)
        for path, _, _ in service_settings
    )
    argv = to_argv(config)
    assert parse("planner", argv, PlannerCommandConfig) == config
    assert parse(
        "planner", [*argv, "--frontend-api-key", "k"], PlannerCommandConfig
    ) == dataclasses.replace(
        config, service=dataclasses.replace(config.service, frontend_api_key="k")
    )
    assert to_argv(PlannerCommandConfig()) == []
    assert parse("planner", [], PlannerCommandConfig) == PlannerCommandConfig()


def test_defaults_give_an_empty_command_line() -> None:
    for config_type in (WorkerConfig, FrontendConfig, ServeConfig):
        assert to_argv(config_type()) == []
        assert (
            parse(
                {WorkerConfig: "worker", FrontendConfig: "frontend"}.get(config_type, "serve"),
                [],
                config_type,
            )
            == config_type()
        )


def test_serve_forwards_every_worker_setting_to_its_worker_processes(tmp_path: Path) -> None:
    """Each section of a worker's configuration is serve's own section (forwarded whole) or
    the fleet's (runtime, process); a worker section serve does not forward fails here."""
    fleet_owned = {"runtime", "process"}
    serve_sections = {f.name: f.type for f in dataclasses.fields(ServeConfig)}
    for f in dataclasses.fields(WorkerConfig):
        assert f.name in fleet_owned or serve_sections.get(f.name) == f.type, f.name

    serve = dataclasses.replace(
        everything_changed(ServeConfig), workers=2, prefill_workers=None, decode_workers=None
    )
    model = ResolvedModel(tmp_path, "served-name")
    runtime = fleet_runtime(tmp_path / "discovery", "s3cret")
    workers = worker_configs(serve, runtime, model)
    assert [w.process.instance_id for w in workers] == [0, 1]
    for worker in workers:
        command = worker_command(worker)
        assert command[:4] == [sys.executable, "-m", "armature.cli", "worker"]
        parsed = parse("worker", command[4:], WorkerConfig)
        expected_engine = dataclasses.replace(serve.engine, model=str(tmp_path))
        assert parsed.engine == expected_engine
        assert parsed.kv == serve.kv
        assert parsed.transfer == serve.transfer
        assert parsed.runtime == dataclasses.replace(runtime, plane_secret=None)
        assert parsed.process.log_level == serve.http.log_level
    env = worker_environment(runtime)
    assert env["ARMATURE_PLANE_SECRET"] == "s3cret"


def test_serve_names_the_workers_model_when_no_name_was_given(tmp_path: Path) -> None:
    serve = ServeConfig(workers=2)
    model = ResolvedModel(tmp_path, "SmolLM2-135M-Instruct")
    workers = worker_configs(serve, fleet_runtime(tmp_path, "s"), model)
    assert [w.engine.served_model_name for w in workers] == ["SmolLM2-135M-Instruct"] * 2
    assert [w.process.role for w in workers] == ["agg", "agg"]
    disagg = ServeConfig(prefill_workers=1, decode_workers=2)
    roles = [w.process.role for w in worker_configs(disagg, fleet_runtime(tmp_path, "s"), model)]
    assert roles == ["prefill", "decode", "decode"]


def test_worker_processes_do_not_inherit_setting_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ARMATURE_MAX_NUM_SEQS", "3")
    monkeypatch.setenv("ARMATURE_UNRELATED_TO_SETTINGS", "kept")
    env = worker_environment(fleet_runtime(tmp_path, "s"))
    assert "ARMATURE_MAX_NUM_SEQS" not in env
    assert env["ARMATURE_UNRELATED_TO_SETTINGS"] == "kept"


@pytest.mark.parametrize(
    ("variable", "value", "path", "expected"),
    [
        ("ARMATURE_MAX_NUM_SEQS", "7", ("engine", "max_num_seqs"), 7),
        ("ARMATURE_KV_CACHE_BYTES", "2GiB", ("kv", "kv_cache_bytes"), 2 << 30),
        ("ARMATURE_NO_PREFIX_CACHING", "1", ("kv", "enable_prefix_caching"), False),
        ("ARMATURE_NO_PREFIX_CACHING", "0", ("kv", "enable_prefix_caching"), True),
        (
            "ARMATURE_KV_TRANSFER_BACKENDS",
            "nixl,tcp",
            ("transfer", "kv_transfer_backends"),
            ("nixl", "tcp"),
        ),
        ("ARMATURE_NAMESPACE", "team-a", ("runtime", "namespace"), "team-a"),
        ("ARMATURE_ROLE", "decode", ("process", "role"), "decode"),
    ],
)
def test_a_variable_sets_its_flag_default(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, path: tuple[str, ...], expected: Any
) -> None:
    monkeypatch.setenv(variable, value)
    assert get_setting_value(parse("worker", [], WorkerConfig), path) == expected


def test_a_flag_beats_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARMATURE_MAX_NUM_SEQS", "7")
    assert parse("worker", ["--max-num-seqs", "9"], WorkerConfig).engine.max_num_seqs == 9


def test_api_keys_from_the_variable_and_the_flags_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARMATURE_API_KEYS", "a, b")
    config = parse("frontend", ["--api-key", "c"], FrontendConfig)
    assert config.security.api_keys == ("a", "b", "c")


def test_an_api_key_with_a_comma_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The keys travel on as the comma list ARMATURE_API_KEYS (serve's frontend replicas):
    --api-key sk-prod,2024 went on as two keys, sk-prod and 2024. The key is not shown."""
    for command in ("frontend", "serve"):
        with pytest.raises(SystemExit) as exit_:
            parse(command, ["--api-key", "sk-a", "--api-key", "sk-prod,2024"], FrontendConfig)
        assert exit_.value.code == 2
        assert capsys.readouterr().err == (
            "armature: error: argument --api-key: an API key must hold no comma "
            "(ARMATURE_API_KEYS, a comma list, would split it in two) (see --help)\n"
        )


def test_a_blank_api_keys_variable_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart sets it empty where it has no keys."""
    monkeypatch.setenv("ARMATURE_API_KEYS", "")
    assert parse("frontend", [], FrontendConfig).security.api_keys == ()


@pytest.mark.parametrize(
    ("command", "variable", "value", "fragment"),
    [
        (
            "worker",
            "ARMATURE_MAX_NUM_SEQS",
            "many",
            "ARMATURE_MAX_NUM_SEQS: not an integer: 'many'",
        ),
        ("worker", "ARMATURE_NO_PREFIX_CACHING", "perhaps", "ARMATURE_NO_PREFIX_CACHING: expected"),
        (
            "worker",
            "ARMATURE_DISCOVERY",
            "carrier-pigeon",
            "ARMATURE_DISCOVERY: expected one of file",
        ),
        # choices the command gives (the engine registry's, the router's policies)
        ("worker", "ARMATURE_ENGINE", "bogus", "ARMATURE_ENGINE: expected one of torch, mocker"),
        ("frontend", "ARMATURE_ROUTER", "bogus", "ARMATURE_ROUTER: expected one of round-robin"),
        # "$KEY1,$KEY2" with both unset: no keys would be no protection, unseen
        ("frontend", "ARMATURE_API_KEYS", ",", "ARMATURE_API_KEYS: an item of the comma list is"),
        ("frontend", "ARMATURE_API_KEYS", "k1, ", "ARMATURE_API_KEYS: an item of the comma list"),
    ],
)
def test_a_bad_variable_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    variable: str,
    value: str,
    fragment: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("armature: error: ")
    assert fragment in err


def test_every_flag_names_its_variable_in_help() -> None:
    for command, config_type in (("worker", WorkerConfig), ("serve", ServeConfig)):
        sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        text = " ".join(sub.format_help().split())
        for _, f, setting in iter_settings(config_type):
            assert f"(env {env_name(f.name, setting)})" in text, f.name


def test_sections_define_each_default_once() -> None:
    """The sections serve, worker and frontend share are the same types, so a default lives
    in one place."""
    assert ServeConfig().engine == WorkerConfig().engine == EngineConfig()
    assert ServeConfig().kv == WorkerConfig().kv == KvCacheConfig()
    assert ServeConfig().transfer == WorkerConfig().transfer == TransferConfig()
    assert FrontendConfig().runtime == WorkerConfig().runtime == RuntimeConfig()
    assert FrontendConfig().router.policy == "kv" and ServeConfig().router.policy == "round-robin"


def test_the_readme_flag_tables_match_the_definitions() -> None:
    from armature.cli.flags_table import render_flag_tables

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert render_flag_tables() in readme, "run: python -m armature.cli.flags_table README.md"


def test_a_section_title_is_its_docstrings_first_sentence_across_lines() -> None:
    from armature.cli.flags_table import get_section_title
    from armature.config import PlannerServiceConfig

    assert get_section_title(PlannerServiceConfig, "service") == (
        "`armature planner`'s shell: the frontend it reads, the performance model, and the "
        "connector that carries decisions out"
    )
    assert get_section_title(RuntimeConfig, "runtime") == (
        "Where processes meet (discovery) and how they talk (request and event planes)"
    )


def test_a_disk_tier_without_a_directory_is_the_mockers_alone() -> None:
    """A size alone makes a (modeled) disk tier; an engine that writes real blocks refuses it,
    and refuses the mocker's bandwidths."""
    modeled = KvTierConfig(kv_disk_blocks=8)
    assert modeled.is_enabled and modeled.has_disk_tier
    assert modeled.get_num_disk_blocks(bytes_per_block=1) == 8
    with pytest.raises(ConfigError, match="need --kv-disk-dir"):
        modeled.check_stored()
    with pytest.raises(ConfigError, match="--kv-host-bandwidth-gbps is for --engine mocker"):
        KvTierConfig(kv_host_blocks=8, kv_host_bandwidth_gbps=50.0).check_stored()
    KvTierConfig(kv_disk_dir="/d", kv_disk_blocks=8).check_stored()  # the torch engine's G3
    with pytest.raises(ConfigError, match="--kv-disk-dir needs"):
        KvTierConfig(kv_disk_dir="/d")
    with pytest.raises(ConfigError, match="--kv-remote-bandwidth-gbps must be positive"):
        KvTierConfig(kv_remote_bandwidth_gbps=0.0)
    assert not KvTierConfig().is_enabled


def test_a_bad_variable_stops_only_the_commands_that_take_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from armature.cli.options import check_env_errors

    monkeypatch.setenv("ARMATURE_MIN_WORKERS", "abc")  # a planner setting
    check_env_errors(build_parser().parse_args(["worker"]))  # the worker takes none
    with pytest.raises(ConfigError, match="ARMATURE_MIN_WORKERS: not an integer: 'abc'"):
        check_env_errors(build_parser().parse_args(["planner"]))
