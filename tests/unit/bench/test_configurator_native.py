"""bench.configurator_native's verdicts: a line per figure and pass, the count within 15%, and
the ranking check on tokens/s per worker averaged over the passes; its plot; and a bench run's
requests as the trace the simulator replays."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import msgspec
import pytest
from fixed_server import FixedServer

from armature.cli.main import main
from armature.config.configure import ConfigureConfig
from armature.configurator.estimate import Prediction
from armature.configurator.search import Ranked
from armature.configurator.space import AGG, DISAGG, Deployment
from armature.protocols.timing_profile import LoadCheck
from armature.sim.profile_timing import timing_from_profile
from armature.workload.traces import TRACE_BLOCK_TOKENS, TraceRequest
from bench.configurator_checks import SLOWER_STEPS, Checked, Figures, checks, plot, row
from bench.configurator_native import measured_requests, prompt_factor_relative, run_commands
from bench.configurator_plan import FULL, QUICK, with_targets_scale
from bench.harness import BenchArgs
from bench.paths import DOCS_OUT, REPO_ROOT, SCRATCH_OUT, image_dir
from bench.stack_cpu import StackCpu, per_request_ms
from profiles import make_profile

AGG_2 = Deployment(AGG, 1, 2, 256)
DISAGG_2 = Deployment(DISAGG, 1, 2, 256, prefill_tp=1, num_prefill_workers=1)


def _checked(
    deployment: Deployment,
    rank: int,
    run: int,
    predicted: tuple[float, float],
    measured: tuple[float, float],
    tokens_s: float,
    meets: bool = True,
) -> Checked:
    ranked = Ranked(deployment, 1, Prediction(500.0, 100.0, 1.0, 10.0, 2), 0.5, True)
    p = Figures(predicted[0], predicted[1], predicted[1], 10.0)
    m = Figures(measured[0], measured[1], measured[1], tokens_s)
    return Checked(2, rank, run, ranked, 1.0, 40, p, p, p, p, p, m, meets)


def test_every_figure_of_every_pass_is_checked_and_counted() -> None:
    lines = checks(
        [
            _checked(AGG_2, 1, 1, (500.0, 100.0), (500.0, 90.0), 20.0),
            _checked(AGG_2, 1, 2, (500.0, 100.0), (400.0, 100.0), 20.0),
        ]
    )
    assert lines[:5] == [
        "- PASS: agg tp1, seqs 2, batch 256 x1 (2 workers, pass 1) TTFT p50 +0.0%",
        "- PASS: agg tp1, seqs 2, batch 256 x1 (2 workers, pass 1) ITL p50 +11.1%",
        "- MISS: agg tp1, seqs 2, batch 256 x1 (2 workers, pass 2) TTFT p50 +25.0%",
        "- PASS: agg tp1, seqs 2, batch 256 x1 (2 workers, pass 2) ITL p50 +0.0%",
        "- 3 of 4 figures within 15% of the measured",
    ]


def test_the_other_predictions_are_counted_and_shown() -> None:
    """The one profile made just before a run, and the former prompt-step rule, each give
    a second prediction per run: a count line after the headline's, and a column of its
    errors (blank where none was made)."""
    close = Figures(480.0, 95.0, 95.0, 10.0)  # -4.0% / -5.0%
    far = Figures(300.0, 100.0, 100.0, 10.0)  # -40.0% / +0.0% of 500, -25.0% of 400
    runs = [
        dataclasses.replace(
            _checked(AGG_2, 1, 1, (500.0, 100.0), (500.0, 100.0), 20.0),
            just_before=close,
            prompt_relative=far,
        ),
        dataclasses.replace(
            _checked(AGG_2, 1, 2, (600.0, 100.0), (400.0, 100.0), 20.0),
            just_before=far,
            prompt_relative=far,
        ),
    ]
    lines = checks(runs)
    assert lines[4:7] == [
        "- 3 of 4 figures within 15% of the measured",
        "- 3 of 4 figures within 15% of the measured from the one profile made just before the run",
        "- 2 of 4 figures within 15% of the measured with prompt steps at their ratio to the "
        "decode steps' (the rule until 12-05)",
    ]
    assert row(runs[0])[9:12] == ["-4.0% / -5.0%", "+0.0% / +0.0%", "-40.0% / +0.0%"]
    assert row(runs[1])[9] == "-25.0% / +0.0%"
    plain = _checked(AGG_2, 1, 1, (500.0, 100.0), (500.0, 100.0), 20.0)
    assert row(plain)[9] == row(plain)[11] == ""
    assert len(checks([plain])) == 4  # two figures, the count, the ranking: no other counts


def test_prompt_steps_at_their_ratio_to_the_decode_steps() -> None:
    """The former rule: prompt steps 1.25 of the tables, decode steps 1.25 too, so the prompt
    steps read as modeled (1.25 / 1.25); a profile without both classes is left as it is."""
    load = LoadCheck(
        num_requests=8,
        request_rate_per_s=1.0,
        num_steps=40,
        measured_s=15.0,
        modeled_s=12.0,
        prompt_measured_s=5.0,
        prompt_modeled_s=4.0,
        decode_measured_s=10.0,
        decode_modeled_s=8.0,
    )
    profile = msgspec.structs.replace(make_profile(), load=load)
    assert timing_from_profile(profile).prompt_step_factor == pytest.approx(1.25)
    relative = prompt_factor_relative(profile)
    assert relative.load is not None
    assert relative.load.prompt_step_factor == pytest.approx(1.0)
    assert relative.load.decode_step_factor == pytest.approx(1.25)
    assert timing_from_profile(relative).prompt_step_factor == pytest.approx(1.0)
    assert relative.prefill == profile.prefill and relative.decode == profile.decode
    one_class = msgspec.structs.replace(load, decode_modeled_s=0.0)
    without = msgspec.structs.replace(profile, load=one_class)
    assert prompt_factor_relative(without) is without
    assert prompt_factor_relative(make_profile()).load is None


def test_a_row_shows_how_far_slower_steps_move_the_prediction() -> None:
    """Near the knee, steps 10% slower move the predicted TTFT by far more than 10%."""
    ranked = Ranked(AGG_2, 1, Prediction(500.0, 100.0, 1.0, 10.0, 2), 0.5, True)
    p = Figures(500.0, 100.0, 110.0, 10.0)
    slower = Figures(800.0, 110.0, 121.0, 9.0)
    m = Figures(400.0, 100.0, 100.0, 9.5)
    cells = row(Checked(2, 1, 1, ranked, 3.0, 40, p, p, p, p, slower, m, True))
    assert cells[6] == "500 / 400 (+25.0%)"
    assert cells[-3:] == ["800 (+60.0%)", "10.0 / 9.5", "yes"]


def test_the_ranking_averages_the_passes() -> None:
    # rank 2 beats rank 1 in pass 1 by 10%, but loses over both passes
    runs = [
        _checked(AGG_2, 1, 1, (1.0, 1.0), (1.0, 1.0), 20.0),
        _checked(DISAGG_2, 2, 1, (1.0, 1.0), (1.0, 1.0), 22.0),
        _checked(AGG_2, 1, 2, (1.0, 1.0), (1.0, 1.0), 24.0),
        _checked(DISAGG_2, 2, 2, (1.0, 1.0), (1.0, 1.0), 20.0),
    ]
    assert checks(runs)[-1] == (
        "- PASS: 2 workers: ranked first agg tp1, seqs 2, batch 256 x1 (meets the targets "
        "measured) is 0.0% below the measured best agg tp1, seqs 2, batch 256 x1"
    )
    # the first misses the targets in one pass: it does not meet them, the second is best
    runs[2] = _checked(AGG_2, 1, 2, (1.0, 1.0), (1.0, 1.0), 24.0, meets=False)
    assert checks(runs)[-1] == (
        "- MISS: 2 workers: ranked first agg tp1, seqs 2, batch 256 x1 (misses the targets "
        "measured) is -4.8% below the measured best disagg 1P(tp1):1D(tp1), seqs 2, batch 256 x1"
    )


def test_the_plot_is_written(tmp_path: Path) -> None:
    path = tmp_path / "img" / "native.png"
    plot(
        [
            _checked(AGG_2, 1, 1, (500.0, 100.0), (520.0, 90.0), 20.0),
            _checked(DISAGG_2, 2, 1, (600.0, 110.0), (700.0, 120.0), 18.0),
        ],
        path,
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_runs_requests_become_a_trace_in_send_order_with_unshared_blocks() -> None:
    block = TRACE_BLOCK_TOKENS
    records = [
        {"sent_s": 101.5, "prompt_tokens": 2 * block + 1, "output_tokens": 3, "ttft_ms": 1.0},
        {"sent_s": 100.0, "prompt_tokens": block, "output_tokens": 32, "ttft_ms": 1.0},
        {"sent_s": 100.25, "prompt_tokens": block + 1, "output_tokens": 1, "ttft_ms": 1.0},
    ]
    assert measured_requests(records) == [
        TraceRequest(0.0, block, 32, (0,)),
        TraceRequest(250.0, block + 1, 1, (1, 2)),
        TraceRequest(1500.0, 2 * block + 1, 3, (3, 4, 5)),
    ]


def test_a_run_sends_the_saved_sample_whole_after_its_warm_up(
    tmp_path: Path, default_model_dir: Path
) -> None:
    """The run's bench lines against a server: the warm-up sends the plan's requests, then
    every request of the saved `workload.jsonl` is sent and measured, none before its
    arrival time, none taken as warm-up."""
    arrivals_ms = [0.0, 120.5, 121.0, 400.25]
    trace = tmp_path / "workload.jsonl"
    rows = [
        {"timestamp": t, "input_length": 20 + i, "output_length": 3, "hash_ids": [i]}
        for i, t in enumerate(arrivals_ms)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = BenchArgs(True, tmp_path, "float32", default_model_dir, "m", 0)
    with FixedServer(0.01, 0.001, 3) as url:
        warmup, run = run_commands(args, QUICK, url, trace, len(rows), tmp_path / "run")
        assert warmup[:3] == run[:3] == [sys.executable, "-m", "armature.cli"]
        assert main([*warmup[3:], "--report", str(tmp_path / "warmup")]) == 0
        assert main(run[3:]) == 0
    warmed = json.loads((tmp_path / "warmup" / "report.json").read_text())["steps"][0]
    assert warmed["summary"]["num_requests"] == QUICK.warmup
    step = json.loads((tmp_path / "run" / "report.json").read_text())["steps"][0]
    assert step["shape"]["kind"] == "trace" and step["summary"]["num_ok"] == len(rows)
    sent_s = sorted(r["sent_s"] for r in step["requests"])
    offsets_ms = [(s - sent_s[0]) * 1000.0 for s in sent_s]
    # on the trace's schedule: none early (by more than the first send's own delay), the
    # 120-400 ms gaps kept
    assert all(o >= a - 50.0 for o, a in zip(offsets_ms, arrivals_ms, strict=True))
    assert "--ignore-eos" in run and run[run.index("--tokenizer") + 1] == str(default_model_dir)


def test_a_slower_machine_scales_both_targets() -> None:
    slower = with_targets_scale(FULL, 8.0)
    assert (slower.targets.ttft_ms, slower.targets.itl_ms) == (4000.0, 2400.0)
    assert slower.profile_args == FULL.profile_args and slower.workload == FULL.workload
    with pytest.raises(SystemExit, match="--targets-scale must be positive"):
        with_targets_scale(FULL, 0.0)


def test_the_stacks_cpu_per_request_by_part() -> None:
    # frontend 3 s, shells 1.5 s, client 0.6 s of CPU over 60 finished requests, of which
    # the frontend and the shells would have spent 0.6 s and 0.3 s idle
    spent = per_request_ms([10.0, 4.0, 1.0], [13.0, 5.5, 1.6], 60, [0.6, 0.3, 0.0])
    assert spent == pytest.approx([40.0, 20.0, 10.0])
    assert per_request_ms([1.0], [1.5], 10, [0.9]) == [0.0]  # never below idle
    stack = StackCpu(1.0, 0.015, 40.0, 20.0, 10.0)
    assert stack.total_ms == pytest.approx(70.0)
    assert stack.describe().startswith(
        "0.015 cores idle, and 70.0 ms per request (frontend 40.0, workers' shells 20.0"
    )
    with pytest.raises(RuntimeError, match="no request finished"):
        per_request_ms([1.0], [2.0], 0, [0.0])


def test_the_validation_searches_with_the_configure_default_margin() -> None:
    """The slower-steps column shows the same margin the validation's search held its
    finalists to: `armature configure`'s default."""
    assert ConfigureConfig().step_margin == pytest.approx(SLOWER_STEPS - 1.0)


def test_only_a_published_run_writes_its_plot_into_the_docs(tmp_path: Path) -> None:
    assert image_dir(DOCS_OUT) == REPO_ROOT / "docs" / "img"
    assert image_dir(SCRATCH_OUT) == SCRATCH_OUT.parent
    assert image_dir(tmp_path / "by_hand.md") == tmp_path
