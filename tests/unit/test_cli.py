"""CLI: user mistakes end with one line on stderr and exit code 2; --help lists every flag."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from armature.cli.main import build_parser, main
from armature.cli.planner import check_worker_args
from armature.config import parse_bytes
from armature.errors import ConfigError
from profiles import write_small_profile
from servers import free_port as _free_port


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits directly
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["serve", "--port", "0"], "--port: must be positive"),
        (["serve", "--port", "70000"], "port must be 1..65535"),
        # "" listened on every interface
        (["serve", "--host", ""], "--host: must be a host name or an IP address, got ''"),
        (["replay", "--synthetic", "multi-turn", "--report", ""], "--report is empty: give a file"),
        (["replay", "--synthetic", "multi-turn", "--plot", " "], "--plot is empty: give a file"),
        (["profile", "--engines-at-once", "1000"], "--engines-at-once: must be"),
        (["--bogus"], "unrecognized arguments: --bogus; give a command first"),  # "required"
        (["replay", "--synthetic", "multi-turn", "--kv-remote", ""], "--kv-remote: must not be"),
        (["serve", "--kv-disk-dir", " "], "--kv-disk-dir: must not be empty, got ' '"),
        ([], "the following arguments are required: command"),
        (["worker", "--host", " "], "--host: must be a host name or an IP address, got ' '"),
        (["serve", "--kv-cache-bytes", "12XB"], "not a size"),
        (["serve", "--dtype", "int3"], "invalid choice"),
        (["serve", "--model", "/definitely/not/here"], "does not exist"),
        (["serve", "--bogus-flag"], "unrecognized arguments"),
        (["serve", "--engine", "mocker", "--speedup-ratio", "0"], "must be positive"),
        (["serve", "--engine", "gpt"], "invalid choice"),
        (["serve", "--prefill-workers", "1"], "--prefill-workers needs --decode-workers"),
        # aggregated workers only: every request was refused (a 503 each) after a clean start
        (["serve", "--enforce-disagg"], "--enforce-disagg needs --prefill-workers above 0"),
        (  # no prefill worker can join serve's own fleet
            ["serve", "--enforce-disagg", "--prefill-workers", "0", "--decode-workers", "1"],
            "--enforce-disagg needs --prefill-workers above 0 and --decode-workers",
        ),
        # flags of another engine, task or tier: they did nothing, unseen
        (["worker", "--speedup-ratio", "2"], "--speedup-ratio is for --engine mocker, not torch"),
        (["serve", "--enforce-eager"], "--enforce-eager is for --engine vllm, not torch"),
        (["serve", "--engine", "mocker", "--pooling", "cls"], "--pooling is for --task embed"),
        (["serve", "--kv-offload", "write-through"], "--kv-offload needs a lower KV tier"),
        (["worker", "--kv-disk-offload", "all"], "--kv-disk-offload needs a disk tier"),
        (  # G1's blocks go to the first lower tier whatever it says
            [
                "serve",
                "--kv-disk-dir",
                "/tmp/d",
                "--kv-disk-blocks",
                "9",
                "--kv-disk-offload",
                "all",
            ],
            "--kv-disk-offload picks which host-tier (G2) victims go down to disk: it needs",
        ),
        (  # a G4 only read takes no blocks
            ["serve", "--kv-remote", "file:///tmp/g4", "--kv-offload", "write-through"],
            "--kv-offload: nothing takes the blocks (--kv-remote with --kv-remote-offload off",
        ),
        (
            ["worker", "--kv-onboard-max-inflight-bytes", "1MiB"],
            "--kv-onboard-max-inflight-bytes needs a lower KV tier",
        ),
        (["serve", "--kv-remote-refresh-s", "5"], "--kv-remote-refresh-s needs --kv-remote"),
        (
            ["serve", "--workers", "3", "--prefill-workers", "1", "--decode-workers", "1"],
            "either --workers or --prefill-workers",
        ),
        (["serve", "--decode-workers", "0"], "must be positive"),
        (["serve", "--workers", "5000"], "--workers: the router's prefix index holds at most"),
        (["serve", "--num-kv-blocks", "3000000000"], "at most 2,147,483,646 (32-bit block ids)"),
        (
            ["replay", "--synthetic", "multi-turn", "--num-kv-blocks", "2147483647"],
            "--num-kv-blocks: must be at most 2,147,483,646",
        ),
        (
            ["serve", "--engine", "mocker", "--kv-cache-bytes", "10000TiB"],
            "more than the 2,147,483,646 a KV cache holds",
        ),
        (
            ["serve", "--engine", "mocker", "--kv-cache-bytes", "1000"],
            "--kv-cache-bytes 1,000 holds no KV block of this model (368,640 bytes each)",
        ),
        (["planner", "--max-decode-workers", "5000"], "--max-decode-workers: the router's"),
        (
            ["serve", "--prefill-workers", "4097", "--decode-workers", "1"],
            "--prefill-workers: the router's prefix index holds at most 4,096 workers, got 4,097",
        ),
        (["serve", "--kv-transfer-backends", "shm"], "that includes tcp"),
        # TEST-NET-1: no machine's address (the load publisher failed later, unseen)
        (["frontend", "--replica-host", "192.0.2.1"], "--replica-host 192.0.2.1: cannot bind"),
        (
            ["serve", "--no-prefix-caching", "--kv-host-bytes", "1GiB"],
            "keep cached prefix blocks: drop --no-prefix-caching or the tier flags",
        ),
        (
            ["worker", "--engine", "mocker", "--no-prefix-caching", "--kv-disk-blocks", "64"],
            "keep cached prefix blocks: drop --no-prefix-caching or the tier flags",
        ),
        (["serve", "--kv-transfer-backends", "rdma,tcp"], "shm,nixl,tcp"),
        (["serve", "--max-local-prefill-tokens", "-1"], "must be"),
        (["serve", "--migration-limit", "x"], "--migration-limit"),
        (["replay", "--synthetic", "prefix-groups", "--prefill-workers", "8"], "at least one"),
        (
            ["replay", "--synthetic", "multi-turn", "--kv-remote-offload", "all"],
            "--kv-remote-offload needs --kv-remote",
        ),
        (["replay", "--synthetic", "multi-turn", "--kv-host-bytes", "1MiB"], "below one KV block"),
        # a tier's count past the index's integers (the frontend's event sync failed on it in
        # a loop, a traceback each round) and a listing wait past what a wait can take
        (
            ["replay", "--synthetic", "multi-turn", "--kv-disk-blocks", str(2**63)],
            "--kv-disk-blocks: must be at most 2,147,483,646",
        ),
        (
            ["replay", "--synthetic", "multi-turn", "--kv-disk-bytes", "1000000TiB"],
            "--kv-disk-bytes holds",
        ),
        (
            ["replay", "--synthetic", "multi-turn", "--kv-host-bytes", "1000000TiB"],
            "--kv-host-bytes holds",
        ),
        (
            ["replay", "--synthetic", "multi-turn", "--kv-host-bytes", "10000000000000TiB"],
            "--kv-host-bytes: size 10000000000000TiB is too large (at most 2**63 - 1 bytes)",
        ),
        (
            ["serve", "--kv-remote", "file:///tmp", "--kv-remote-refresh-s", "1e10"],
            "--kv-remote-refresh-s: must be at most 86400",
        ),
        (["replay", "--synthetic", "multi-turn", "--kv-host-bandwidth-gbps", "0"], "positive"),
        (["replay", "--synthetic", "multi-turn", "--kv-disk-dir", "/tmp"], "unrecognized"),
        (["replay", "--synthetic", "multi-turn", "--shape-factor", "0.5"], "must be >= 1"),
        (["replay", "--synthetic", "multi-turn", "--step-for-s", "0"], "must be positive"),
        (["replay", "--synthetic", "multi-turn", "--planner", "all"], "invalid choice"),
        (
            ["replay", "--synthetic", "multi-turn", "--min-workers", "3", "--max-workers", "2"],
            "minimum (3) is above",
        ),
        (["replay", "--synthetic", "multi-turn", "--worker-startup-s", "-1"], "must be >= 0"),
        (["replay", "--synthetic", "multi-turn", "--workers", "5000"], "at most 4,096 workers"),
        (
            ["replay", "--synthetic", "multi-turn", "--planner", "sla", "--max-workers", "5000"],
            "--max-workers: the router's prefix index holds at most 4,096 workers of a role",
        ),
        (
            [
                "replay",
                "--synthetic",
                "multi-turn",
                "--router",
                "kv-approx",
                "--kv-routed-ttl-s",
                "0",
            ],
            "--kv-routed-ttl-s must be above 0",
        ),
        (["serve", "--router", "kv-approx", "--kv-routed-ttl-s", "0"], "must be above 0"),
        (["serve", "--kv-routed-ttl-s", "-1"], "--kv-routed-ttl-s"),
        (["serve", "--kv-load-bound", "1"], "--kv-load-bound: must be 0 (none) or above 1"),
        (["replay", "--synthetic", "multi-turn", "--kv-load-bound", "-3"], "--kv-load-bound"),
        (["serve", "--api-key-file", "/definitely/not/here"], "cannot read the API key file"),
        (["serve", "--protect-metrics"], "--protect-metrics needs an API key"),
        (["serve", "--api-key", " padded "], "--api-key must not be empty"),
        # its replicas' ARMATURE_API_KEYS, a comma list, would split it in two keys
        (["serve", "--api-key", "sk-prod,2024"], "argument --api-key: an API key must hold no"),
        (["planner", "--dry-run"], "--performance-model is required"),
        (["planner", "--performance-model", "/definitely/not/here.json"], "not/here.json"),
        (["planner", "--min-workers", "3", "--max-workers", "2"], "minimum (3) is above"),
        (["planner", "--gpu-budget", "1"], "--gpu-budget 1 is below"),
        (["planner", "--connector", "k8s"], "invalid choice"),
        (["planner", "--frontend-url", "http://[::1"], "--frontend-url: not a valid URL"),
        (["planner", "--frontend-url", "http://127.0.0.1:99999"], "not a valid URL"),
        (["planner", "--frontend-url", "ftp://127.0.0.1"], "must be an http:// or https://"),
        (["planner", "--frontend-url", "127.0.0.1:8000"], "must be an http:// or https://"),
        (["planner", "--metrics-port", "70000"], "--metrics-port: must be -1..65535"),
        (["planner", "--season-intervals", "1"], "--season-intervals: must be at least 2"),
        (
            ["planner", "--connector", "virtual", "--worker-args", "--engine mocker"],
            "--worker-args is for --connector local (this planner's is virtual)",
        ),
        (
            ["planner", "--dry-run", "--k8s-namespace", "x", "--frontend-wait-s", "0"],
            "--k8s-namespace is for --connector kubernetes (this planner's is local)",
        ),
        (["planner", "--connector", "kubernetes", "--ack-timeout-s", "5"], "--ack-timeout-s is"),
        (["planner", "--connector", "virtual", "--drain-timeout-s", "5"], "--drain-timeout-s is"),
        (
            ["planner", "--connector", "virtual", "--prefill-worker-args", "--engine mocker"],
            "--prefill-worker-args is for --connector local",
        ),
        (
            ["replay", "--synthetic", "multi-turn", "--report", "/tmp"],
            "--report /tmp is a directory",
        ),
        (["replay", "--synthetic", "multi-turn", "--plot", "/tmp/x.txt"], "image's format"),
        (["replay", "--synthetic", "multi-turn", "--plot", "/etc/hostname/x.png"], "not a dir"),
        (["profile", "--engine", "mocker", "--output", "/tmp"], "--output /tmp is a directory"),
        (["profile", "--engine", "mocker", "--report", "/etc/hostname"], "is not a directory"),
        (["profile", "--engine", "mocker", "--report", ""], "--report needs a directory"),
        (["replay", "--synthetic", "multi-turn", "--limit", "3"], "--limit is for --trace"),
        (["replay", "--synthetic", "multi-turn", "--time-scale", "2"], "--time-scale is for"),
        # given at its default where it does nothing
        (["replay", "--synthetic", "multi-turn", "--time-scale", "1"], "--time-scale is for"),
        (["replay", "--trace", "t.jsonl", "--num-requests", "1000"], "--num-requests is for"),
        (["replay", "--trace", "t.jsonl", "--rate-rps", "8"], "--rate-rps is for --synthetic"),
        (["replay", "--synthetic", "multi-turn", "--shape-factor", "4"], "is for --rate-shape"),
        (["replay", "--trace", "t.jsonl", "--num-requests", "5"], "--num-requests is for --synth"),
        (
            [
                "replay",
                "--synthetic",
                "multi-turn",
                "--planner",
                "sla",
                "--planner-interval-s",
                "1e-4",
            ],
            "more than 10,000 throughput plans of --planner-interval-s 0.0001 (raise it)",
        ),
        (["replay", "--trace", "t.jsonl", "--rate-rps", "100"], "--rate-rps is for --synthetic"),
        (["replay", "--synthetic", "multi-turn", "--shape-factor", "9"], "is for --rate-shape st"),
        (
            ["replay", "--synthetic", "multi-turn", "--rate-shape", "diurnal", "--step-at-s", "3"],
            "--step-at-s is for --rate-shape step",
        ),
        (
            [
                "replay",
                "--synthetic",
                "multi-turn",
                "--rate-shape",
                "step",
                "--shape-period-s",
                "9",
            ],
            "--shape-period-s is for --rate-shape diurnal",
        ),
        (
            ["replay", "--synthetic", "multi-turn", "--num-requests", "20", "--rate-shape", "step"],
            "--step-at-s 120 (the default; give an earlier one): the workload's last arrival is",
        ),
        (["replay", "--synthetic", "multi-turn", "--speedup", "1e-300"], "at least 0.001"),
        (["replay", "--synthetic", "multi-turn", "--rate-rps", "1e-9"], "more than 50,000"),
        (["replay", "--trace", "/tmp"], "trace file /tmp is a directory"),
        (
            ["replay", "--synthetic", "multi-turn", "--slo-itl-quantile", "0.9"],
            "--slo-itl-quantile is a quantile of --slo-itl-ms",
        ),
        (
            ["replay", "--synthetic", "multi-turn", "--prefill-timing-profile", "p.json"],
            "--prefill-timing-profile is the step times of --prefill-workers",
        ),
        (["serve", "--queue-timeout-s", "1.4e307"], "--queue-timeout-s: must be at most 3600"),
        (["serve", "--queue-timeout-s", "inf"], "must be a finite number"),
        (["serve", "--engine", "mocker", "--speedup-ratio", "nan"], "must be a finite number"),
        (["serve", "--max-queued-requests", "1000001"], "must be 0..1000000"),
        (["serve", "--busy-prefill-tokens", "2147483648"], "must be 1..2147483647"),
        (["serve", "--seed", "9223372036854775808"], "--seed: must be -9223372036854775808.."),
        (
            ["replay", "--synthetic", "multi-turn", "--seed", "2" + "0" * 19],
            "--seed: must be -9223372036854775808..",
        ),
        (["worker", "--metrics-port", "-2"], "--metrics-port: must be -1..65535"),
        (["serve", "--frontends", "0"], "--frontends: must be"),
        (["serve", "--frontends", "2", "--in-process-workers"], "drop --in-process-workers"),
        (["serve", "--frontends", "2", "--replica-port", "9100"], "leave it 0 (any free port)"),
        (["frontend", "--replica-port", "65536"], "--replica-port: must be 0..65535"),
        (["serve", "--worker-processes", "--in-process-workers"], "give one of them"),
        (["frontend", "--share-load-ttl-s", "0"], "--share-load-ttl-s: must be"),
        (["worker", "--kv-transfer-port", "65536"], "--kv-transfer-port: must be 0..65535"),
        ([], "required"),
        (
            ["profile", "--engine", "mocker", "--prefill-input-tokens", "-64,256"],
            "'-64,256' reads as a flag; write --prefill-input-tokens=-64,256",
        ),
        (
            ["profile", "--engine", "mocker", "--prefill-input-tokens=-64,256"],
            "--prefill-input-tokens: must be positive, got -64",
        ),
        (["configure", "--isl", "-5e2"], "'-5e2' reads as a flag; write --isl=-5e2"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("armature: error: ")
    assert fragment in err
    assert "Traceback" not in err


def test_port_in_use_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code, err = run(["serve", "--port", str(port)], capsys)
        assert code == 2
        assert f"cannot listen on 127.0.0.1:{port}" in err
        # replicas sharing the port refuse a port that anything listens on
        code, err = run(["serve", "--port", str(port), "--frontends", "2"], capsys)
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in err


def test_a_worker_metrics_port_in_use_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The message named the request port (127.0.0.1:0) for a taken --metrics-port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        argv = ["worker", "--engine", "mocker", "--discovery-dir", str(tmp_path)]
        code, err = run([*argv, "--metrics-port", str(port)], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}" in err


def test_a_flag_left_without_its_value_gets_no_hint(capsys: pytest.CaptureFixture[str]) -> None:
    """The hint is for a value that starts with '-', not for a value that is missing."""
    code, err = run(["serve", "--port"], capsys)
    assert code == 2
    assert err == "armature: error: argument --port: expected one argument (see --help)\n"
    code, err = run(["serve", "--port", "--workers", "2"], capsys)
    assert code == 2
    assert err == "armature: error: argument --port: expected one argument (see --help)\n"


def test_help_lists_every_serve_flag() -> None:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = serve.format_help()
    for action in serve._actions:
        for flag in action.option_strings:
            assert flag in text


def test_every_commands_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """`armature COMMAND --help` for every command: argparse expands %-formats in help
    texts, so a setting's "70% of" must reach it escaped (it broke `profile --help`)."""
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in commands:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0, name
        out, err = capsys.readouterr()
        assert out.startswith(f"usage: armature {name}") and not err, name
    profile = commands["profile"].format_help()
    assert "at 70% of the" in " ".join(profile.split())


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"armature {importlib.metadata.version('armature')}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1024", 1024), ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5k", 1500), ("3G", 3 * 10**9)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1ib", "not a size: '1ib'"),  # an i with no prefix before it (a KeyError before)
        ("1i", "not a size: '1i'"),
        ("9" * 400, "size 99999999999999999999... (400 characters) is too large"),  # overflowed
        ("9" * 400 + ".5", "(402 characters) is too large"),  # a float's inf
        (str(2**63), f"size {2**63} is too large (at most 2**63 - 1 bytes)"),
    ],
)
def test_parse_bytes_refuses(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_bytes(text)
    assert parse_bytes(str(2**63 - 1)) == 2**63 - 1  # the largest, exactly


def test_a_bad_size_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["serve", "--kv-host-bytes", "1ib"], capsys)
    assert code == 2
    assert err == (
        "armature: error: argument --kv-host-bytes: not a size: '1ib' (e.g. 2GiB, 512MiB, "
        "1000000) (see --help)\n"
    )


def write_trace(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_prints_a_summary_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(
        tmp_path / "t.jsonl",
        [
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
            '{"timestamp": 10, "input_length": 700, "output_length": 3, "hash_ids": [1, 3]}',
            '{"timestamp": 20, "input_length": 100, "output_length": 2, "hash_ids": [4]}',
        ],
    )
    report_path = tmp_path / "r.json"
    code = main(
        [
            "replay",
            "--trace",
            str(trace),
            "--workers",
            "2",
            "--num-kv-blocks",
            "256",
            "--report",
            str(report_path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "num_requests: 3" in out
    report = json.loads(report_path.read_text())
    assert report["num_requests"] == 3
    assert set(report["ttft_ms"]) == {"p50", "p90", "p99", "mean"}
    assert sum(report["requests_per_worker"].values()) == 3
    for key in (
        "prefix_hit_ratio",
        "itl_ms",
        "e2e_ms",
        "throughput_tokens_s",
        "load_skew",
        "wall_time_s",
    ):
        assert key in report


def test_replay_reference_steps_writes_the_same_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "--synthetic", "prefix-groups", "--num-requests", "30", "--workers", "2"]
    reports = []
    for extra in ([], ["--reference-steps"]):
        path = tmp_path / f"r{len(reports)}.json"
        assert main([*argv, "--report", str(path), *extra]) == 0
        report = json.loads(path.read_text())
        del report["wall_time_s"]
        reports.append(report)
    assert reports[0] == reports[1]
    assert reports[0]["num_requests"] == 30
    capsys.readouterr()


def test_replay_bad_trace_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "bad.jsonl", ['{"timestamp": 0}'])
    code, err = run(["replay", "--trace", str(trace)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "bad.jsonl:1:" in err
    code, err = run(["replay", "--trace", str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "does not exist" in err


def test_replay_reads_a_trace_from_a_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--trace <(...)`: a path that exists but is not a regular file ("does not exist"
    before)."""
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    line = '{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1]}\n'
    writer = threading.Thread(target=fifo.write_text, args=(line * 3,))
    writer.start()
    code, err = run(["replay", "--trace", str(fifo)], capsys)
    writer.join()
    assert (code, err) == (0, "")


def test_replay_refuses_to_write_over_its_own_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output that is an input (the report over the trace) or another output (the plot
    over the report): refused before the replay (it overwrote the trace and exited 0)."""
    line = '{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1]}'
    trace = write_trace(tmp_path / "t.jsonl", [line])
    code, err = run(["replay", "--trace", str(trace), "--report", str(trace)], capsys)
    assert (code, err) == (
        2,
        f"armature: error: --report {trace} is the file --trace names; writing it would lose"
        " that\n",
    )
    assert trace.read_text() == line + "\n"
    both = str(tmp_path / "out.png")
    code, err = run(["replay", "--trace", str(trace), "--report", both, "--plot", both], capsys)
    assert code == 2 and "--plot" in err and "is the file --report names" in err
    assert not Path(both).exists()


def test_replay_takes_the_tier_flags_and_reports_the_tiers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A disk tier needs no directory in replay (nothing is written); the summary gains the
    tiers' figures."""
    argv = ["replay", "--synthetic", "multi-turn", "--num-requests", "40", "--workers", "2"]
    argv += ["--num-kv-blocks", "256", "--kv-host-blocks", "64", "--kv-disk-blocks", "512"]
    assert main([*argv, "--kv-disk-offload", "all", "--kv-remote", "any"]) == 0
    out = capsys.readouterr().out
    assert "num_requests: 40" in out
    assert "blocks_onboarded: {'g2->g1': " in out and "'g1->g2': " in out
    assert "onboarded_token_ratio: " in out
    help_text = build_parser().parse_args
    with pytest.raises(SystemExit):
        help_text(["replay", "--help"])
    assert "--kv-remote-bandwidth-gbps" in capsys.readouterr().out


def test_replay_with_the_planner_on_a_step_load_reports_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step load (x4 from 10 s for 10 s) on one worker: the planner adds workers, the
    summary and report carry the fleet's cost and attainment, --plot writes a PNG."""
    report_path, plot_path = tmp_path / "r.json", tmp_path / "fleet.png"
    argv = ["replay", "--synthetic", "prefix-groups", "--num-requests", "400", "--rate-rps", "8"]
    argv += ["--workers", "1", "--rate-shape", "step", "--step-at-s", "10", "--step-for-s", "10"]
    argv += ["--planner", "both", "--worker-startup-s", "2", "--ttft-ms", "300", "--itl-ms", "15"]
    argv += ["--planner-interval-s", "10", "--load-interval-s", "2", "--scale-up-cooldown-s", "2"]
    argv += ["--report", str(report_path), "--plot", str(plot_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "worker_seconds: " in out and "sla_attainment: " in out
    assert "planner_decisions: " in out
    assert "planner_limited: never" in out  # the fleet had room to grow (up to 8)
    report = json.loads(report_path.read_text())
    assert report["num_requests"] == 400
    assert report["peak_workers"]["agg"] > 1
    assert report["worker_seconds"] > report["simulated_time_s"]
    assert sum(report["planner_decisions"].values()) >= 1
    assert [s["time_s"] for s in report["timeline"][:3]] == [2.0, 4.0, 6.0]
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_says_when_the_planner_was_held_at_its_maximum(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same step with --max-workers 1: no decision can be made, and the summary says for
    how long the maximum held the fleet and how many workers the planner asked for."""
    argv = ["replay", "--synthetic", "prefix-groups", "--num-requests", "400", "--rate-rps", "8"]
    argv += ["--workers", "1", "--rate-shape", "step", "--step-at-s", "10", "--step-for-s", "10"]
    argv += ["--planner", "both", "--worker-startup-s", "2", "--ttft-ms", "300", "--itl-ms", "15"]
    argv += ["--planner-interval-s", "10", "--load-interval-s", "2", "--max-workers", "1"]
    assert main(argv) == 0
    lines = {
        key.strip(): value.strip()
        for key, _, value in (line.partition(":") for line in capsys.readouterr().out.splitlines())
    }
    assert lines["planner_decisions"] == "none"
    held = re.fullmatch(
        r"agg (\d+) s, asked for up to (\d+) workers "
        r"\(held by --max-workers, --max-total-workers or --gpu-budget\)",
        lines["planner_limited"],
    )
    assert held is not None
    assert int(held[1]) > 0 and int(held[2]) >= 2


def test_replay_takes_a_negative_seed(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--synthetic", "multi-turn", "--num-requests", "8", "--seed", "-1"]
    assert main([*argv, "--workers", "1", "--num-kv-blocks", "1024"]) == 0
    assert "num_requests: 8" in capsys.readouterr().out


def test_replay_synthetic_workloads_run(capsys: pytest.CaptureFixture[str]) -> None:
    for kind in ("prefix-groups", "multi-turn"):
        code = main(
            [
                "replay",
                "--synthetic",
                kind,
                "--num-requests",
                "40",
                "--workers",
                "2",
                "--num-kv-blocks",
                "1024",
            ]
        )
        assert code == 0
        assert "num_requests: 40" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["worker", "--engine", "mocker", "--namespace", "a.b"], "invalid namespace"),
        (["frontend", "--namespace", "no spaces"], "invalid namespace"),
        (["frontend", "--discovery", "etcd", "--etcd-endpoints", "localhost:2379"], "http(s)"),
        (["worker", "--request-plane", "carrier-pigeon"], "invalid choice"),
        (["frontend", "--event-plane", "smoke"], "invalid choice"),
        (["worker", "--engine", "mocker", "--instance-id", "-1"], "--instance-id: must be 0.."),
    ],
)
def test_runtime_mistakes_exit_2_with_one_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [*argv, "--discovery-dir", str(tmp_path / "d")]
    if argv[0] == "frontend":
        argv += ["--port", str(_free_port()), "--wait-for-workers-s", "0.5"]
    code, err = run(argv, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("armature: error: ")
    assert fragment in err


def test_frontend_without_workers_gives_up_clearly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["frontend", "--discovery-dir", str(tmp_path), "--port", str(_free_port())]
    code, err = run([*argv, "--wait-for-workers-s", "0.3"], capsys)
    assert code == 2
    assert "0 of 1 workers registered in namespace 'armature' within 0.3 s" in err


def register_cards(directory: Path, model_dir: Path, cards: list[tuple[int, str, str]]) -> None:
    """Worker cards (instance id, model name, request url) of `model_dir` in file discovery
    at `directory`; the entries outlive this call's loop for their 30 s lease."""
    import asyncio

    import msgspec

    from armature.protocols.worker import WorkerCard, worker_key
    from armature.runtime.discovery_file import FileDiscovery

    async def register() -> None:
        d = FileDiscovery(directory)
        for instance_id, name, request_url in cards:
            card = WorkerCard(
                instance_id=instance_id,
                namespace="armature",
                model_name=name,
                model_path=str(model_dir.resolve()),
                block_size=16,
                num_kv_blocks=64,
                max_model_len=512,
                vocab_size=1000,
                request_url=request_url,
                events_url=f"tcp://127.0.0.1:{10 + instance_id}",
            )
            key = worker_key("armature", instance_id)
            await d.register(key, msgspec.msgpack.encode(card), 30)

    asyncio.run(register())


def test_frontend_over_several_models_must_name_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_llama_dir: Path
) -> None:
    """Workers of two models in the namespace: a frontend that names neither is a one-line
    error (it served whichever model's card sorted first); one naming a model no worker
    serves waits for its workers, and says which it waited for."""
    cards = [(1, "tiny", "tcp://127.0.0.1:1"), (2, "other", "tcp://127.0.0.1:2")]
    register_cards(tmp_path, tiny_llama_dir, cards)
    argv = ["frontend", "--discovery-dir", str(tmp_path), "--port", str(_free_port())]
    code, err = run(argv, capsys)
    assert code == 2 and err.count("\n") == 1
    assert "the workers serve 2 models (other, tiny): name the one this frontend" in err
    argv += ["--served-model-name", "absent", "--wait-for-workers-s", "0.3"]
    code, err = run(argv, capsys)
    assert code == 2 and err.count("\n") == 1
    assert "0 of 1 workers of model 'absent' registered in namespace 'armature'" in err


def test_unreachable_nats_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_llama_dir: Path
) -> None:
    argv = ["worker", "--engine", "mocker", "--model", str(tiny_llama_dir)]
    argv += ["--discovery-dir", str(tmp_path), "--event-plane", "nats"]
    code, err = run([*argv, "--nats-url", f"nats://127.0.0.1:{_free_port()}"], capsys)
    assert code == 2
    assert "cannot connect to NATS" in err and err.count("\n") == 1
    # a frontend too, at start (it waited for workers, then failed with a traceback)
    for plane in ("--event-plane", "--request-plane"):
        argv = ["frontend", "--discovery-dir", str(tmp_path), "--port", str(_free_port())]
        argv += [plane, "nats", "--nats-url", f"nats://127.0.0.1:{_free_port()}"]
        code, err = run(argv, capsys)
        assert code == 2
        assert "cannot connect to NATS" in err and err.count("\n") == 1, plane


def test_a_worker_whose_card_conflicts_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_llama_dir: Path
) -> None:
    register_cards(tmp_path, tiny_llama_dir, [(1, "tiny", "tcp://127.0.0.1:1")])
    argv = ["worker", "--engine", "mocker", "--model", str(tiny_llama_dir)]
    argv += ["--discovery-dir", str(tmp_path), "--served-model-name", "tiny"]
    code, err = run([*argv, "--block-size", "32"], capsys)
    assert code == 2
    assert "model 'tiny' is already served with block size 16" in err
    # another context length: every frontend refused it, saying so in its own log only
    code, err = run([*argv, "--max-model-len", "256"], capsys)
    assert code == 2
    assert (
        "model 'tiny' is already served with a context of 512 tokens in namespace 'armature'; "
        "this worker's is 256 (--max-model-len)"
    ) in err


def test_a_worker_whose_instance_id_a_live_worker_holds_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_llama_dir: Path
) -> None:
    """Two workers given one --instance-id both started, the second's card replacing the
    first's in discovery (every frontend lost the first); now the second is a one-line
    error while the first answers on the request plane."""
    import asyncio
    import threading

    from armature.runtime.tcp_server import RequestPlaneServer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    live = RequestPlaneServer({})  # the first worker's request plane
    asyncio.run_coroutine_threadsafe(live.start(), loop).result(30)
    try:
        register_cards(tmp_path, tiny_llama_dir, [(7, "tiny", live.url)])
        argv = ["worker", "--engine", "mocker", "--model", str(tiny_llama_dir)]
        argv += ["--discovery-dir", str(tmp_path), "--served-model-name", "tiny"]
        code, err = run([*argv, "--instance-id", "7"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        taken = f"--instance-id 7 is taken in namespace 'armature' by a live worker at {live.url}"
        assert taken in err
    finally:
        asyncio.run_coroutine_threadsafe(live.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_replay_slo_quantile_above_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--synthetic", "prefix-groups", "--slo-itl-quantile", "1.5"]
    code, err = run(argv, capsys)
    assert code == 2 and "expected a number in 0..1" in err


@pytest.mark.parametrize(
    ("command", "text", "fragment"),
    [
        (["replay", "--synthetic", "multi-turn"], None, "cannot read timing profile"),
        (["replay", "--synthetic", "multi-turn"], "{not json", "is not a timing profile"),
        (["replay", "--synthetic", "multi-turn"], '{"version": 99}', "of version 99"),
        (["serve", "--engine", "mocker"], '{"version": 2}', "is not a valid timing profile"),
        (["worker", "--engine", "mocker"], '{"version": 99}', "of version 99"),
        (["serve"], '{"version": 1}', "--timing-profile is for --engine mocker, not torch"),
    ],
)
def test_bad_timing_profiles_exit_2_with_one_line(
    command: list[str],
    text: str | None,
    fragment: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "profile.json"
    if text is not None:
        path.write_text(text)
    code, err = run([*command, "--timing-profile", str(path)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("armature: error: ")
    assert fragment in err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--decode-requests", "128"], "--decode-requests 128 is above --max-num-seqs 64"),
        (["--prefill-input-tokens", "64,32"], "expected increasing positive integers"),
        (["--prefill-input-tokens", "64,,256"], "got '64,,256'"),
        (["--prefill-input-tokens", "2048,4096"], "at least two lengths within"),
        # the flag that sized the cache is the one to raise
        (
            ["--num-kv-blocks", "20"],
            "(320 tokens): lower --prefill-batch-requests or raise --num-kv-blocks",
        ),
        (
            ["--kv-cache-bytes", "1MiB"],
            "(32 tokens): lower --prefill-batch-requests or raise --kv-cache-bytes",
        ),
    ],
)
def test_profile_mistakes_exit_2_with_one_line(
    argv: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    code, err = run(["profile", "--engine", "mocker", *argv, "--output", str(out)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("armature: error: ")
    assert fragment in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("frontend", "message"),
    [
        ("http://127.0.0.1:{port}", "no metrics from http://127.0.0.1:{port}: cannot read"),
        # none given: every frontend in discovery, where there is none
        (
            None,
            "no metrics from the frontends of namespace 'armature' in discovery: no frontend "
            "is listed\n",
        ),
    ],
)
def test_planner_with_an_unreachable_frontend_is_a_one_line_error(
    frontend: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    write_small_profile(profile)
    port = _free_port()
    argv = ["planner", "--dry-run", "--performance-model", str(profile), "--frontend-wait-s", "0"]
    if frontend is not None:
        argv += ["--frontend-url", frontend.format(port=port)]
    argv += ["--discovery-dir", str(tmp_path / "discovery"), "--metrics-port", "-1"]
    code, err = run(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1 and message.format(port=port) in err


@pytest.mark.parametrize(
    ("worker_args", "message"),
    [
        ("--engine mocker --port abc", "--worker-args: argument --port: not an integer: 'abc'"),
        ("--engine mocker --no-such-flag", "--worker-args: unrecognized arguments: --no-such-flag"),
    ],
)
def test_planner_refuses_worker_args_a_worker_would_refuse(
    worker_args: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The local connector's workers would exit at start, and be started again for good."""
    profile = tmp_path / "profile.json"
    write_small_profile(profile)
    argv = ["planner", "--connector", "local", "--performance-model", str(profile)]
    argv += ["--worker-args", worker_args, "--discovery-dir", str(tmp_path / "discovery")]
    code, err = run([*argv, "--metrics-port", "-1"], capsys)
    assert (code, err) == (2, f"armature: error: {message}\n")
    check_worker_args(("--engine mocker", "--max-num-seqs 4"))  # what a worker takes passes
    # the prefill workers' own flags: checked alike, and only for a disaggregated fleet
    fine = [*argv[: argv.index("--worker-args")], "--worker-args", "--engine mocker"]
    prefill = ["--prefill-worker-args", worker_args, "--planner-mode", "disagg"]
    code, err = run([*fine, *prefill, "--metrics-port", "-1"], capsys)
    assert (code, err) == (2, f"armature: error: --prefill-{message.removeprefix('--')}\n")
    agg = ["--prefill-worker-args", "--engine mocker", "--planner-mode", "agg"]
    code, err = run([*fine, *agg, "--metrics-port", "-1"], capsys)
    assert (code, err) == (
        2,
        "armature: error: --prefill-worker-args is for --planner-mode disagg (aggregated "
        "workers take --worker-args alone)\n",
    )


@pytest.mark.parametrize("flag", ["--load-interval-s", "--planner-interval-s"])
def test_planner_refuses_an_interval_too_short_to_scrape(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    write_small_profile(profile)
    argv = ["planner", "--dry-run", "--performance-model", str(profile), flag, "0.001"]
    argv += ["--discovery-dir", str(tmp_path / "discovery"), "--metrics-port", "-1"]
    code, err = run(argv, capsys)
    assert code == 2
    assert err == (
        f"armature: error: {flag} 0.001: the planner reads the frontend's metrics every "
        "interval; use at least 0.1 s\n"
    )


def _write_text(text: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(text)

    return write


def _write_one_prefill_point(path: Path) -> None:
    write_small_profile(path)
    data = json.loads(path.read_text())
    data["prefill"] = data["prefill"][:1]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("write", "fragment"),
    [
        (lambda path: None, "cannot read timing profile"),
        (_write_text("[1, 2]"), "is not a timing profile (write one with `armature profile"),
        (_write_text('{"format": "armature-planner-table/1"}'), "is not a timing profile"),
        (
            functools.partial(write_small_profile, version=1),
            "is a timing profile of version 1; this armature reads version 2",
        ),
        (_write_text('{"version": 2, "source": {}}'), "not a valid timing profile: Object missing"),
        (
            _write_one_prefill_point,
            "cannot give step times: prefill input tokens: needs",
        ),
    ],
)
def test_planner_with_a_bad_performance_model_is_a_one_line_error(
    write: Callable[[Path], None],
    fragment: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "profile.json"
    write(path)
    code, err = run(["planner", "--dry-run", "--performance-model", str(path)], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("armature: error: --performance-model: ")
    assert str(path) in err and fragment in err


def test_replay_says_which_planner_flags_need_the_planner(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["replay", "--synthetic", "prefix-groups", "--num-requests", "20", "--workers", "1"]
    code, err = run([*argv, "--min-workers", "3", "--ttft-ms", "900"], capsys)
    assert code == 0
    assert err.strip() == "armature: note: --min-workers takes effect with --planner only"
    code, err = run([*argv, "--ttft-ms", "900"], capsys)  # the targets judge every replay
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    ("flags", "note"),
    [
        (
            ["--router", "round-robin", "--kv-decode-weight", "2", "--kv-routed-ttl-s", "5"],
            "--kv-decode-weight, --kv-routed-ttl-s take effect with --router kv or kv-approx only",
        ),
        (
            ["--kv-offload", "write-through", "--kv-tier-blind"],
            "--kv-offload takes effect with a lower KV tier only\n"
            "armature: note: --kv-tier-blind takes effect with a lower KV tier only",
        ),
        (
            ["--max-local-prefill-tokens", "100", "--transfer-bandwidth-gbs", "1"],
            "--max-local-prefill-tokens, --transfer-bandwidth-gbs take effect with "
            "--prefill-workers (a disaggregated fleet) only",
        ),
        (
            ["--transfer-bandwidth-gbs", "25"],  # its default, given: still does nothing
            "--transfer-bandwidth-gbs takes effect with --prefill-workers (a disaggregated fleet) "
            "only",
        ),
        (
            ["--kv-bytes-per-block", "100"],
            "--kv-bytes-per-block takes effect with --prefill-workers (a disaggregated fleet) only",
        ),
        (
            ["--planner", "load", "--predictor", "moving-average", "--planner-trim-step", "0.1"],
            "--predictor, --planner-trim-step take effect with --planner sla or both only",
        ),
        (
            ["--planner", "sla", "--scale-down-ratio", "0.5"],  # its default
            "--scale-down-ratio takes effect with --planner load or both only",
        ),
        (
            ["--planner", "sla", "--scale-down-ratio", "0.9"],
            "--scale-down-ratio takes effect with --planner load or both only",
        ),
        (
            ["--planner", "load", "--min-prefill-workers", "2", "--max-decode-workers", "3"],
            "--min-prefill-workers, --max-decode-workers take effect with --prefill-workers (a "
            "disaggregated fleet) only",
        ),
    ],
)
def test_replay_notes_flags_that_do_nothing_where_given(
    capsys: pytest.CaptureFixture[str], flags: list[str], note: str
) -> None:
    argv = ["replay", "--synthetic", "prefix-groups", "--num-requests", "20", "--workers", "1"]
    code, err = run([*argv, *flags], capsys)
    assert code == 0
    assert err.strip() == f"armature: note: {note}"
    code, err = run([*argv, "--kv-decode-weight", "2", "--kv-host-blocks", "4096"], capsys)
    assert code == 0 and err == ""  # each where it applies: the kv router, a host tier


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        ([], "has no requests"),
        (
            [
                '{"timestamp": 1' + "0" * 400 + ', "input_length": 9, "output_length": 2, '
                '"hash_ids": [1]}'
            ],
            "timestamp must be a finite number >= 0, got 1000",
        ),
        (["[" * 100_000 + "]" * 100_000], "invalid JSON: nested too deeply"),
        (
            [
                '{"timestamp": 0, "input_length": 9, "output_length": 2, "hash_ids": [1]}',
                '{"timestamp": 1e20, "input_length": 9, "output_length": 2, "hash_ids": [2]}',
            ],
            "the workload spans 1e+17 s",
        ),
        (
            [
                '{"timestamp": 0, "input_length": 4000, "output_length": 2, "hash_ids": '
                + str(list(range(8)))
                + "}"
            ],
            "no request was replayed",
        ),
    ],
)
def test_replay_of_a_trace_it_cannot_replay_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], fragment: str
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(line + "\n" for line in lines))
    argv = ["replay", "--trace", str(trace), "--num-kv-blocks", "64"]
    code, err = run(argv, capsys)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("armature: error: ")
    assert fragment in err


def test_replay_of_multi_turn_gives_the_requests_asked_for(tmp_path: Path) -> None:
    """Sessions of 4 turns: 7 requests are the first 7 arrivals of 2 sessions."""
    for n in (1, 7):
        report = tmp_path / f"r{n}.json"
        argv = ["replay", "--synthetic", "multi-turn", "--num-requests", str(n)]
        assert main([*argv, "--report", str(report)]) == 0
        assert json.loads(report.read_text())["num_requests"] == n


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`armature replay ... | head -1`: no BrokenPipeError traceback."""
    command = [sys.executable, "-m", "armature.cli", "replay", "--synthetic", "prefix-groups"]
    command += ["--num-requests", "20"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader goes away before the report is printed
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == 141  # as a process killed by SIGPIPE reads to a shell


def test_replay_reports_goodput_only_against_a_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --slo-* flags every finished request would meet 'no bound', so goodput would
    read as throughput beside a low sla_attainment: the report has none, the summary says why."""
    argv = ["replay", "--synthetic", "prefix-groups", "--num-requests", "20", "--workers", "2"]
    assert main([*argv, "--report", str(tmp_path / "none.json")]) == 0
    out = capsys.readouterr().out
    assert "goodput_requests_s: n/a (no --slo-ttft-ms / --slo-itl-ms)" in out
    none = json.loads((tmp_path / "none.json").read_text())
    assert none["goodput_requests_s"] == none["goodput_tokens_s"] == {}
    bounded = [*argv, "--slo-ttft-ms", "0.001", "--report", str(tmp_path / "tight.json")]
    assert main(bounded) == 0
    tight = json.loads((tmp_path / "tight.json").read_text())
    assert tight["goodput_requests_s"] == {"sla": 0.0}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # a card naming every address: no peer or planner could dial it
        (
            ["--replica-host", "0.0.0.0"],
            "--replica-host 0.0.0.0: the other frontends and the planner connect to it; give an "
            "address of this host they reach",
        ),
        (["--replica-port", "{port}"], "--replica-host/--replica-port: cannot listen on"),
    ],
)
def test_a_frontends_own_address_that_cannot_work_is_a_one_line_error(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before it waits for workers: the replica's own address, beside --port (which
    the second case takes too)."""
    port = _free_port()
    argv = ["frontend", "--port", str(port), "--discovery-dir", str(tmp_path / "discovery")]
    code, err = run([*argv, *(x.format(port=port) for x in extra)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"armature: error: {message}")


def test_a_report_that_cannot_be_written_keeps_the_one_there(tmp_path: Path) -> None:
    """A replay whose report hits the file size limit (a full disk alike): one line, exit 2,
    and the report an earlier run wrote is as it was (it was cut to the limit, unreadable,
    under a traceback)."""
    import resource
    import subprocess
    import sys

    report = tmp_path / "report.json"
    report.write_text('{"earlier": true}\n')

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    argv = ["replay", "--synthetic", "multi-turn", "--num-requests", "40", "--report"]
    done = subprocess.run(
        [sys.executable, "-m", "armature.cli", *argv, str(report)],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"armature: error: --report {report}: cannot write it: File too large"
    ]
    assert report.read_text() == '{"earlier": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_worker_log_dir_that_cannot_be_one_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was found at each worker's start, retried every load interval for ever."""
    profile = tmp_path / "profile.json"
    write_small_profile(profile)
    argv = ["planner", "--performance-model", str(profile), "--connector", "local"]
    argv += ["--worker-args=--engine mocker", "--worker-log-dir", str(profile)]
    argv += ["--discovery-dir", str(tmp_path / "discovery"), "--metrics-port", "-1"]
    code, err = run(argv, capsys)
    assert code == 2
    assert err == (f"armature: error: --worker-log-dir {profile}: {profile} is not a directory\n")


def test_a_planned_disaggregated_fleet_cut_to_the_limits_is_noted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As for an aggregated fleet (the disaggregated one was cut without a word)."""
    argv = ["replay", "--synthetic", "multi-turn", "--num-requests", "20", "--workers", "12"]
    argv += ["--prefill-workers", "4", "--planner", "both", "--max-workers", "2"]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        "armature: note: the planner starts the fleet within --min-workers 1 and --max-workers "
        "2 per role, not at --prefill-workers 4 and decode workers (the rest of --workers) 8"
    )


@pytest.mark.parametrize(
    ("flags", "total"),
    [(["--max-total-workers", "2"], 2), (["--gpus-per-worker", "2", "--gpu-budget", "5"], 2)],
)
def test_a_planned_fleet_cut_to_its_total_budget_is_noted(
    capsys: pytest.CaptureFixture[str], flags: list[str], total: int
) -> None:
    argv = ["replay", "--synthetic", "multi-turn", "--num-requests", "20", "--workers", "3"]
    assert main([*argv, "--planner", "load", *flags]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"armature: note: the planner starts the fleet within {total} workers in all "
        "(--max-total-workers, or --gpu-budget over --gpus-per-worker), not at --workers 3"
    )
