"""`armature configure` end to end in this process: every bad input is one line and exit 2;
--save-dir writes command lines that parse, and a replay command that gives back the
prediction it saved."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from configurator_cases import TINY_LLAMA, write_config
from msgspec.structs import replace

from armature.cli.main import build_parser, main
from armature.protocols.timing_profile import write_profile
from profiles import make_load_check, make_profile, write_small_profile

# a small space: the tiny Llama on H100s, one TP, one set of limits
SMALL = ["--tp", "1,2", "--max-num-seqs", "16", "--max-num-batched-tokens", "2048"]
SMALL += ["--finalists", "1", "--isl", "256", "--osl", "32", "--total-gpus", "4"]


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    return write_config(tmp_path / "tiny", TINY_LLAMA)


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> str:
    """Run configure; it must exit 2 with one line naming `message`. Returns stdout."""
    assert main(["configure", *argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("armature: error: ")
    assert message in lines[0]
    return out


def test_unknown_system(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["--model", str(tiny_dir), "--system", "tpu9"], "unknown system 'tpu9'")


def test_a_model_that_fits_at_no_tp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = {**TINY_LLAMA, "hidden_size": 16384, "num_hidden_layers": 200}
    huge |= {"num_attention_heads": 128, "intermediate_size": 65536}
    model = write_config(tmp_path / "huge", huge)
    _fails(
        capsys,
        ["--model", str(model), "--system", "l40s"],
        "does not fit on l40s at any tensor parallelism up to 8",
    )


def test_a_tp_the_heads_do_not_split_over(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 query heads and 2 KV heads: TP 3 shares neither
    _fails(
        capsys,
        ["--model", str(tiny_dir), "--tp", "3", "--total-gpus", "4"],
        "tiny's 4 attention heads (2 KV heads) split over none of --tp 3",
    )


def test_requests_whose_kv_fits_nowhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 40 GB of weights on an L40S: at TP 8 each GPU keeps ~35 GB, 16 x 120k-token requests
    # of 320 KB/token would need far more
    big = {**TINY_LLAMA, "hidden_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 64}
    big |= {"num_key_value_heads": 8, "intermediate_size": 28672, "max_position_embeddings": 131072}
    model = write_config(tmp_path / "big", big)
    argv = ["--model", str(model), "--system", "l40s", "--isl", "120000", "--osl", "100"]
    argv += ["--modes", "agg"]
    _fails(capsys, argv, "no deployment fits in memory: 16 requests of up to 120100 tokens")


def test_impossible_targets_show_the_closest(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _fails(
        capsys,
        ["--model", str(tiny_dir), *SMALL, "--ttft-ms", "0.001"],
        "no configuration meets the targets",
    )
    assert " 1  " in out and "sim no" in out  # the closest, simulated, ranked first


def test_impossible_targets_save_nothing_and_say_so(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save = tmp_path / "out"
    argv = ["--model", str(tiny_dir), *SMALL, "--ttft-ms", "0.001", "--save-dir", str(save)]
    _fails(capsys, argv, f"or give more GPUs); no deployment saved to {save}")
    assert [p.name for p in save.iterdir()] == ["pareto.png"]  # the closest, plotted


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give --model"),
        (["--system", "local"], "--system local needs --timing-profile"),
        (["--timing-profile", "p.json"], "--timing-profile is for --system local"),
        (["--system", "a100_sxm", "--dtype", "fp8"], "a100_sxm has no fp8 math"),
        (["--max-num-batched-tokens", "3000"], "--max-num-batched-tokens 3000: must be"),
        # the grid's first length alone gives prefill no slope (a traceback before)
        (["--max-num-batched-tokens", "16"], "16: must be a power of 2, or 3 x one, from 24"),
        (["--trace", "/nonexistent/trace.jsonl"], "does not exist"),
        (["--isl", "5000"], "exceed the model's context (4096)"),
        (["--system", "local", "--timing-profile", "/nonexistent.json"], "cannot read"),
        (["--osl", "1"], "--osl must be at least 2"),
        (["--trace", "/"], "trace file / is a directory"),
        (["--tp", "16"], "every --tp value (16) is above 8"),
        (["--total-gpus", "1", "--tp", "2,4"], "every --tp value (2, 4) is above 1"),
        (["--total-gpus", "1", "--modes", "disagg"], "disaggregated serving needs at least 2"),
        (["--plot", "/tmp"], "--plot /tmp is a directory"),
        (["--plot", "out.txt"], "give the image's format as its extension"),
        (["--plot", "out"], "give the image's format as its extension"),
        # the error names the file given, then the directory that cannot hold it
        (
            ["--plot", "/etc/hostname/p.png"],
            "--plot /etc/hostname/p.png: /etc/hostname is not a directory",
        ),
        (["--plot", "/proc/a/p.png"], "--plot /proc/a/p.png: cannot make its directory /proc/a"),
        (["--save-dir", "/proc/armature"], "--save-dir /proc/armature: cannot make"),
        (["--save-dir", "/etc/hostname"], "/etc/hostname is not a directory"),
    ],
)
def test_bad_inputs(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    model = [] if not argv else ["--model", str(tiny_dir)]
    _fails(capsys, [*model, *argv], message)


def test_a_config_json_with_a_bad_text_config_or_experts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_config(tmp_path / "bad", {**TINY_LLAMA, "text_config": None})
    assert main(["configure", "--model", str(bad), *SMALL]) == 0  # null: the config itself
    capsys.readouterr()
    bad = write_config(tmp_path / "bad", {**TINY_LLAMA, "text_config": [1]})
    _fails(capsys, ["--model", str(bad)], "config.json: text_config must be an object")
    moe = write_config(
        tmp_path / "moe", {**TINY_LLAMA, "num_local_experts": 8, "num_experts_per_tok": 16}
    )
    _fails(capsys, ["--model", str(moe)], "num_experts_per_tok (16) is above the experts (8)")
    # heads that no grouping of KV heads can serve (it was priced as if it ran)
    odd = write_config(
        tmp_path / "odd", {**TINY_LLAMA, "num_attention_heads": 4, "num_key_value_heads": 3}
    )
    _fails(
        capsys,
        ["--model", str(odd)],
        "config.json: num_attention_heads (4) is not a multiple of num_key_value_heads (3)",
    )


def test_a_trace_of_one_token_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i, "input_length": 100, "output_length": 1, "hash_ids": [i]} for i in range(3)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = write_config(tmp_path / "tiny", TINY_LLAMA)
    _fails(capsys, ["--model", str(model), "--trace", str(trace)], "one output token")


def test_the_step_margin_row(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """By default the best configurations show their prediction with every step 10% slower
    (what they meet the targets with too); with --step-margin 0 that row is empty."""
    rows, meets = {}, {}
    for margin in ("0.1", "0"):
        argv = ["configure", "--model", str(tiny_dir), *SMALL, "--step-margin", margin]
        assert main([*argv, "--ttft-ms", "5000", "--itl-ms", "200"]) == 0
        out = capsys.readouterr().out
        rows[margin] = next(x for x in out.splitlines() if x.startswith("TTFT / ITL ms, --step"))
        meets[margin] = next(x for x in out.splitlines() if x.startswith("meets the targets"))
    cells = rows["0.1"].removeprefix("TTFT / ITL ms, --step-margin slower").split()
    # each column: "TTFT / ITL (TTFT +N%)", the growth that --max-ttft-growth limits
    assert len(cells) == 10 and "-" not in cells
    for column in (cells[:5], cells[5:]):
        ttft, slash, itl, label, growth = column
        assert slash == "/" and float(ttft) > 0 and float(itl) > 0 and label == "(TTFT"
        assert growth.endswith("%)") and int(growth[:-2]) <= 50  # within the default limit
    assert rows["0"].split()[-2:] == ["-", "-"]
    assert meets["0.1"].split()[-2:] == ["yes", "yes"]


def test_max_ttft_growth_offers_less_where_ttft_grows(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A limit no configuration keeps at any retry rate: none meets the targets (the closest
    shown, the error naming the limit); the default limit and 0 (none) meet; a negative
    value is a one-line error."""
    argv = ["--model", str(tiny_dir), *SMALL, "--ttft-ms", "5000", "--itl-ms", "200"]
    out = _fails(capsys, [*argv, "--max-ttft-growth", "0.0001"], "--max-ttft-growth, or give")
    assert " 1  " in out and "sim no" in out
    for limit in ([], ["--max-ttft-growth", "0"]):
        assert main(["configure", *argv, *limit]) == 0
        capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["configure", *argv, "--max-ttft-growth", "-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("armature: error: argument --max-ttft-growth:")
    assert len(err.strip().splitlines()) == 1


def test_a_missing_model_and_a_bad_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fails(capsys, ["--model", str(tmp_path)], "no config.json there")
    with pytest.raises(SystemExit) as exit_info:  # argparse's own check, the same one line
        main(["configure", "--model", str(tmp_path), "--dtype", "int3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("armature: error: argument --dtype: invalid choice: 'int3'")
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["configure", "--model", str(tmp_path), "--step-margin", "1.5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("armature: error: argument --step-margin: expected a number in 0..1")
    assert len(err.strip().splitlines()) == 1


def test_a_file_that_is_not_a_profile(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tiny_dir / "bad.json"
    bad.write_text("{}")
    _fails(
        capsys,
        ["--model", str(tiny_dir), "--system", "local", "--timing-profile", str(bad)],
        "is not a timing profile",
    )


def _saved_lines(path: Path) -> list[list[str]]:
    return [shlex.split(line) for line in path.read_text().splitlines() if line.startswith("arm")]


def _replays_the_prediction(save: Path) -> dict[str, Any]:
    """Run the saved replay.sh: it gives back the saved prediction. Its report."""
    [replay] = _saved_lines(save / "replay.sh")
    assert main(replay[1:]) == 0
    replayed: dict[str, Any] = json.loads((save / "replay.json").read_text())
    predicted = json.loads((save / "prediction.json").read_text())
    assert predicted["simulated"] is True
    assert replayed["ttft_ms"]["p50"] == pytest.approx(predicted["ttft_ms_p50"], rel=1e-9)
    assert replayed["itl_ms"]["mean"] == pytest.approx(predicted["itl_ms_mean"], rel=1e-9)
    return replayed


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_save_dir_replays_to_the_saved_prediction(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    save = tmp_path / "out"
    argv = ["configure", "--model", str(tiny_dir), *SMALL, "--modes", mode, "--save-dir", str(save)]
    assert main([*argv, "--total-gpus", "16"]) == 0  # more groups than are simulated (4)
    out = capsys.readouterr().out
    assert "aggregated" in out and "disaggregated" in out
    assert (save / "pareto.png").stat().st_size > 0
    for script in ("commands.sh", "planner.sh"):
        for line in _saved_lines(save / script):
            assert line[0] == "armature"
            build_parser().parse_args(line[1:])  # every saved command line parses
    # a config.json alone gives the shape, not the weights the lines need: said at the top
    assert (save / "commands.sh").read_text().splitlines()[2] == (
        f"# note: {tiny_dir} holds no weights (the model's shape was read from its config "
        "alone): give --model the checkpoint's directory to run these"
    )
    # the planner meets the frontend line's workers, and starts them as predicted
    commands = _saved_lines(save / "commands.sh")
    [frontend] = [line for line in commands if line[1] == "frontend"]
    workers = [line for line in commands if line[1] == "worker"]
    [planner] = _saved_lines(save / "planner.sh")
    discovery = frontend[frontend.index("--discovery-dir") + 1]
    assert planner[planner.index("--discovery-dir") + 1] == discovery
    worker_args = shlex.split(planner[planner.index("--worker-args") + 1])
    blocks = worker_args[worker_args.index("--num-kv-blocks") + 1]
    assert blocks == workers[-1][workers[-1].index("--num-kv-blocks") + 1]
    values = (save / "values.yaml").read_text()
    role = "agg" if mode == "agg" else "decode"
    assert f"    {role}:\n      enabled: true\n" in values
    replayed = _replays_the_prediction(save)
    if mode == "disagg":
        assert replayed["num_remote_prefills"] == replayed["num_requests"]
    # the prediction says which groups its rate covers: the replay's, of the deployment's
    predicted = json.loads((save / "prediction.json").read_text())
    [replay] = _saved_lines(save / "replay.sh")
    num_replayed = int(replay[replay.index("--workers") + 1])
    [serve] = [line for line in commands if line[1] == "serve"]
    for line in (serve, frontend):  # judged as the planner's targets
        assert all(flag in line for flag in SLO_FLAGS), line
    flags = ("--workers", "--prefill-workers", "--decode-workers")
    num_deployed = sum(int(serve[serve.index(f) + 1]) for f in flags if f in serve)
    if mode == "agg":  # 16 groups of one GPU, 4 of them simulated
        assert (predicted["simulated_groups"], predicted["groups"]) == (4, 16)
    assert num_deployed * predicted["simulated_groups"] == num_replayed * predicted["groups"]
    rate = predicted["request_rate_per_s"] / predicted["simulated_groups"] * predicted["groups"]
    assert predicted["deployment_request_rate_per_s"] == pytest.approx(rate, rel=1e-12)
    # the table's rate per group is the one the simulation served, saved under its own name
    [row] = [line for line in out.splitlines() if line.startswith("requests/s per group")]
    shown = row.split()[3 if mode == "agg" else 4]
    assert shown == f"{predicted['request_rate_per_s_per_group']:.2f}"
    arrivals_s = [json.loads(line)["timestamp"] / 1000 for line in (save / "workload.jsonl").open()]
    served = (len(arrivals_s) - 1) / (arrivals_s[-1] - arrivals_s[0])
    served *= replayed["num_requests"] / len(arrivals_s) / predicted["simulated_groups"]
    assert predicted["request_rate_per_s_per_group"] == pytest.approx(served, rel=1e-9)


def test_local_system_saves_native_commands(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    write_small_profile(profile, model="tiny")
    save = tmp_path / "out"
    argv = ["configure", "--model", str(tiny_dir), "--system", "local"]
    argv += ["--timing-profile", str(profile), "--isl", "64", "--osl", "16", "--ttft-ms", "5000"]
    argv += ["--itl-ms", "200", "--max-num-seqs", "4", "--finalists", "1", "--save-dir", str(save)]
    assert main(argv) == 0
    native = _saved_lines(save / "commands_native.sh")
    assert native[0][:2] == ["armature", "serve"]
    assert "--engine" not in native[0]  # the native engine, the default
    captured = capsys.readouterr()
    assert "2 workers" in captured.out
    # one engine profiled alone, two deployed side by side, and no load pass: said, once each
    assert captured.err.splitlines() == [
        "armature: note: the timing profile was measured with 1 engine(s) at once; 2 workers "
        "on this host run 2 (armature profile --engines-at-once 2 measures the step times "
        "they see)",
        "armature: note: the timing profile has no load pass: its step times are uniform "
        "batches', which a loaded server's mixed batches exceed (armature profile "
        "--load-requests 48 measures by how much)",
    ]
    # a profile of two engines at once for two workers, with a load pass: nothing to say
    pair = make_profile(model="tiny")
    load = make_load_check(33.0, 30.0)
    pair = replace(pair, source=replace(pair.source, engines_at_once=2), load=load)
    write_profile(pair, profile)
    assert main([*argv[:-2], "--save-dir", str(tmp_path / "pair")]) == 0
    assert capsys.readouterr().err == ""
    # a profile of another model: said (it was taken silently)
    write_profile(replace(pair, source=replace(pair.source, model="other")), profile)
    assert main([*argv[:-2], "--save-dir", str(tmp_path / "other")]) == 0
    assert capsys.readouterr().err == (
        "armature: note: the timing profile was measured on model 'other', not 'tiny': its "
        "step times are that model's\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stack-cpu-ms-per-request", "5"], "--stack-cpu-ms-per-request is for --system local"),
        (["--host-cores", "4"], "--host-cores is for --system local"),
        (["--stack-idle-cores", "0.1"], "--stack-idle-cores is for --system local"),
        (["--host-cores", "0"], "--host-cores"),
        (["--stack-cpu-ms-per-request", "-1"], "--stack-cpu-ms-per-request"),
        (["--shell-cpu-ms-per-request", "2"], "--shell-cpu-ms-per-request is for --system local"),
        (["--shell-cpu-ms-per-request", "-1"], "--shell-cpu-ms-per-request"),
        (["--frontend-cpu-ms-per-request", "3"], "--frontend-cpu-ms-per-request is for --system"),
    ],
)
def test_the_host_options_are_the_local_systems(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = ["configure", "--model", str(tiny_dir), *SMALL, *argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own check of a value
        code = int(exc.code or 0)
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("armature: error: ")
    assert message in lines[0]


def test_the_stacks_parts_cannot_exceed_it(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    write_small_profile(profile, model="tiny")
    argv = ["configure", "--model", str(tiny_dir), "--system", "local"]
    argv += ["--timing-profile", str(profile), "--stack-cpu-ms-per-request", "10"]
    argv += ["--shell-cpu-ms-per-request", "6", "--frontend-cpu-ms-per-request", "4.5"]
    argv += ["--save-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "armature: error: --shell-cpu-ms-per-request and --frontend-cpu-ms-per-request (10.5 "
        "ms together) are parts of --stack-cpu-ms-per-request (10) and cannot exceed it"
    ]
    assert not (tmp_path / "out").exists()


def test_a_local_fleet_on_fewer_cores_is_saved_at_its_share(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two workers on one core: each engine gets half of it, so the saved mocker fleet and
    replay run at speedup 0.5, and the replay gives back the saved prediction."""
    profile = tmp_path / "profile.json"
    write_small_profile(profile, model="tiny")
    save = tmp_path / "out"
    argv = ["configure", "--model", str(tiny_dir), "--system", "local", "--host-cores", "1"]
    argv += ["--timing-profile", str(profile), "--isl", "64", "--osl", "16", "--ttft-ms", "5000"]
    argv += ["--itl-ms", "400", "--max-num-seqs", "4", "--finalists", "1", "--modes", "agg"]
    argv += ["--save-dir", str(save)]
    assert main(argv) == 0
    [replay] = _saved_lines(save / "replay.sh")
    assert replay[replay.index("--speedup") + 1] == "0.5"
    serve = _saved_lines(save / "commands.sh")[0]
    assert serve[serve.index("--speedup-ratio") + 1] == "0.5"
    _replays_the_prediction(save)
    capsys.readouterr()


def test_a_trace_whose_requests_all_arrive_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 5, "input_length": 100, "output_length": 20, "hash_ids": [i]}
        for i in range(3)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = write_config(tmp_path / "tiny", TINY_LLAMA)
    _fails(capsys, ["--model", str(model), "--trace", str(trace)], "the same timestamp")


def test_lengths_given_beside_a_trace_are_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i * 100, "input_length": 100, "output_length": 20, "hash_ids": [i]}
        for i in range(3)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = write_config(tmp_path / "tiny", TINY_LLAMA)
    main(["configure", "--model", str(model), "--trace", str(trace), *SMALL])  # --isl, --osl
    err = capsys.readouterr().err
    assert "armature: note: --isl, --osl not used: the trace gives the lengths\n" in err


def test_the_table_puts_simulated_rows_first_and_says_so(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["configure", "--model", str(tiny_dir), *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  configuration"))
    rows = lines[start + 2 : start + 12]
    by = [row.split()[-2] for row in rows]
    assert by == ["sim"] * by.count("sim") + ["est"] * by.count("est")
    assert by.count("sim") == 2 and by.count("est") == 8  # the best of each mode simulated
    assert lines[start + 12] == (
        "sim rows (the simulator's prediction) rank above est rows (the fast estimate, not "
        "simulated: raise --finalists or --sim-budget-s to simulate more)"
    )


def _ranked_rows(out: str) -> list[list[str]]:
    """The ranked table's rows, each split into its cells from the right: GPUs, TTFT ms,
    ITL ms, tokens/s per GPU, tokens/s per user, by, meets (the configuration has spaces)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  configuration"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or not line.split()[0].isdigit():
            break
        rows.append(line.split()[-7:])
    return rows


def test_a_request_rate_ranks_by_fewest_gpus(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --request-rate the first configuration meets the targets at that rate on the
    fewest GPUs of the simulated ones that meet them; without it, by tokens/s per GPU."""
    argv = ["configure", "--model", str(tiny_dir), *SMALL, "--ttft-ms", "5000", "--itl-ms", "200"]
    assert main([*argv, "--finalists", "4", "--request-rate", "40"]) == 0
    rows = _ranked_rows(capsys.readouterr().out)
    meeting = [r for r in rows if r[-2] == "sim" and r[-1] == "yes"]
    assert rows[0] == meeting[0]
    assert int(rows[0][0]) == min(int(r[0]) for r in meeting)


def test_an_e2e_target_takes_the_place_of_the_itl_one(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--e2e-ms judges the whole request instead of its mean ITL (the default ITL target is
    not used beside it); an end-to-end target nothing can meet is named, and both targets at
    once are refused (the ITL one was dropped without a word)."""
    argv = ["--model", str(tiny_dir), *SMALL, "--ttft-ms", "5000"]
    assert main(["configure", *argv, "--e2e-ms", "100000"]) == 0
    assert _ranked_rows(capsys.readouterr().out)[0][-1] == "yes"
    _fails(capsys, [*argv, "--e2e-ms", "0.01"], "relax --ttft-ms/--e2e-ms")
    _fails(
        capsys,
        [*argv, "--e2e-ms", "100000", "--itl-ms", "0.001"],
        "--e2e-ms replaces --itl-ms as the latency target: give one of them",
    )


def test_inputs_under_the_save_dir_are_refused_before_they_are_overwritten(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The deployment writes workload.jsonl (and more) into --save-dir: a trace there was
    rewritten with rescaled timestamps before."""
    save = tmp_path / "deploy"
    save.mkdir()
    trace = save / "workload.jsonl"
    rows = [
        {"timestamp": 1000 * i, "input_length": 200, "output_length": 20, "hash_ids": [i]}
        for i in range(4)
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = trace.read_bytes()
    model = ["--model", str(tiny_dir), *SMALL[: SMALL.index("--isl")], "--trace", str(trace)]
    _fails(capsys, [*model, "--save-dir", str(save)], f"--trace {trace} is under --save-dir")
    assert trace.read_bytes() == before
    _fails(capsys, [*model, "--plot", str(trace)], f"--plot {trace} is the file --trace names")


def test_a_save_over_an_earlier_one_leaves_none_of_its_files(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A disaggregated save, then an aggregated one into the same directory: the prefill
    profile, and the replay report of the first, no longer describe what is saved there
    (they stayed beside the new files). Files the save does not write are left alone."""
    save = tmp_path / "out"
    base = ["configure", "--model", str(tiny_dir), *SMALL, "--save-dir", str(save)]
    assert main([*base, "--modes", "disagg"]) == 0
    assert (save / "prefill_profile.json").exists()
    (save / "replay.json").write_text("{}\n")  # as replay.sh writes it
    (save / "notes.txt").write_text("the team's own\n")
    assert main([*base, "--modes", "agg"]) == 0
    capsys.readouterr()
    names = {p.name for p in save.iterdir()}
    assert "prefill_profile.json" not in names and "replay.json" not in names
    assert {"profile.json", "commands.sh", "prediction.json", "notes.txt"} <= names
    replay = _saved_lines(save / "replay.sh")[0]
    assert "--prefill-workers" not in replay


def test_a_failed_search_leaves_an_earlier_save_and_its_plot_as_they_were(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save = tmp_path / "out"
    base = ["--model", str(tiny_dir), *SMALL, "--save-dir", str(save)]
    assert main(["configure", *base]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in save.iterdir() if p.is_file()}
    _fails(
        capsys,
        [*base, "--ttft-ms", "0.001"],
        f"no deployment saved to {save} (the one saved there before, and its plot, are as "
        "they were)",
    )
    assert {p.name: p.read_bytes() for p in save.iterdir() if p.is_file()} == before


def test_a_stack_that_takes_every_core_is_refused(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    write_small_profile(profile, model="tiny")
    argv = ["--model", str(tiny_dir), "--system", "local", "--timing-profile", str(profile)]
    argv += ["--host-cores", "1", "--stack-idle-cores", "5"]
    _fails(
        capsys,
        argv,
        "--stack-idle-cores 5: the serving stack alone would take every one of the host's 1 "
        "cores (--host-cores), none left for the engines",
    )


def test_the_local_system_refuses_search_flags_it_cannot_honour(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    write_small_profile(profile, model="tiny")  # 32 requests, a 1024-token step
    argv = ["configure", "--model", str(tiny_dir), "--system", "local"]
    argv += ["--timing-profile", str(profile), "--isl", "64", "--osl", "16"]
    for flags, message in [
        (["--tp", "4"], "--tp: --system local runs one engine per worker (tp 1)"),
        (["--max-num-batched-tokens", "16384"], "searches the timing profile's step budget, 1024"),
        (["--step-margin", "0", "--max-ttft-growth", "0.9"], "--max-ttft-growth limits growth"),
    ]:
        assert main([*argv, *flags]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
    # the profile's own values are taken; values above what it measured are left out, said
    fine = ["--tp", "1", "--max-num-batched-tokens", "1024", "--max-num-seqs", "4,64,512"]
    assert main([*argv, *fine, "--ttft-ms", "5000", "--itl-ms", "200", "--finalists", "1"]) == 0
    err = capsys.readouterr().err
    assert "note: --max-num-seqs 64,512 left out: the timing profile measured at most 32" in err


SLO_FLAGS = ("--slo-ttft-ms", "--slo-itl-ms")
LLAMA_8B_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "head_dim": 128,
}


def test_the_saved_planner_starts_each_role_as_its_workers_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Prefill workers at another TP than the decode workers: the saved planner sizes the
    prefill pool by their own profile and starts them with their own flags (their KV pool),
    as commands.sh runs them (it started them with the decode workers' profile and pool)."""
    model = write_config(tmp_path / "llama8b", LLAMA_8B_SHAPE)
    save = tmp_path / "out"
    argv = ["configure", "--model", str(model), "--total-gpus", "8", "--isl", "2000"]
    argv += ["--osl", "200", "--spread", "0.2", "--ttft-ms", "500", "--itl-ms", "30"]
    argv += ["--modes", "disagg", "--finalists", "1", "--sim-budget-s", "5"]
    assert main([*argv, "--save-dir", str(save)]) == 0
    capsys.readouterr()
    workers = {
        line[line.index("--role") + 1]: line
        for line in _saved_lines(save / "commands.sh")
        if line[1] == "worker"
    }
    [planner] = _saved_lines(save / "planner.sh")
    build_parser().parse_args(planner[1:])
    flags = {"decode": "--worker-args", "prefill": "--prefill-worker-args"}
    for role, flag in flags.items():
        started = shlex.split(planner[planner.index(flag) + 1])
        for name in ("--timing-profile", "--num-kv-blocks"):
            ran = workers[role]
            assert started[started.index(name) + 1] == ran[ran.index(name) + 1], (role, name)
    assert planner[planner.index("--prefill-performance-model") + 1] == str(
        save / "prefill_profile.json"
    )
    assert "planner.prefillPerformanceProfile" in (save / "values.yaml").read_text()
    # the frontend judges requests by the planner's targets (it judged none: the planner
    # read no attainment)
    [frontend] = [line for line in _saved_lines(save / "commands.sh") if line[1] == "frontend"]
    slo = {flag: float(frontend[frontend.index(flag) + 1]) for flag in SLO_FLAGS}
    assert slo == {"--slo-ttft-ms": 500.0, "--slo-itl-ms": 30.0}
