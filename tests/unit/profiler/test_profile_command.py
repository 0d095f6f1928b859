"""`armature profile` for real on the tiny model: the mocker and the native engine each give a
valid profile and plots, and a mocker run from the native engine's profile takes its times."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from armature.cli.main import main
from armature.protocols.timing_profile import TimingProfile, read_profile
from armature.sim.profile_timing import load_profile_timing
from armature.sim.timing import PolynomialTiming, StepWork

SWEEP = [
    "--prefill-input-tokens",
    "16,64",
    "--prefill-repeats",
    "2",
    "--prefill-batch-requests",
    "2",
    "--decode-requests",
    "1,3",
    "--decode-context-tokens",
    "16,48",
    "--decode-output-tokens",
    "4",
    "--max-num-seqs",
    "4",
    "--num-kv-blocks",
    "64",
    "--prefill-context-tokens",
    "32",
]


def _profile(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> TimingProfile:
    report = out.with_suffix("")
    code = main(["profile", *argv, *SWEEP, "--output", str(out), "--report", str(report)])
    printed = capsys.readouterr().out
    assert code == 0
    assert f"profile: {out}" in printed
    assert sorted(p.name for p in report.iterdir()) == ["decode.png", "prefill.png"]
    assert all(p.stat().st_size > 10_000 for p in report.iterdir())
    profile = read_profile(out)
    # then each length alone again after 32 tokens of its prompt were cached
    assert [(p.num_requests, p.input_tokens, p.context_tokens) for p in profile.prefill] == [
        (1, 16, 0),
        (2, 16, 0),
        (1, 64, 0),
        (2, 64, 0),
        (1, 16, 32),
        (1, 64, 32),
    ]
    # timed: tokens 4..7, over context + 3 .. context + 6 tokens: mean context + 4
    assert [(d.num_requests, d.context_tokens) for d in profile.decode] == [
        (1, 20),
        (3, 20),
        (1, 52),
        (3, 52),
    ]
    assert all(p.ttft_ms > 0 and p.tokens_per_s > 0 for p in profile.prefill)
    assert all(d.itl_ms > 0 and d.tokens_per_s > 0 for d in profile.decode)
    return profile


def test_profile_the_mocker(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--engine", "mocker", "--model", str(tiny_llama_dir), "--speedup-ratio", "10"]
    argv += ["--served-model-name", "tiny-mock"]
    profile = _profile(argv, tmp_path / "mocker.json", capsys)
    source = profile.source
    assert (source.engine, source.model, source.device) == ("mocker", "tiny-mock", "cpu")
    assert source.flags == {
        "model": str(tiny_llama_dir),
        "engine": "mocker",
        "served-model-name": "tiny-mock",
        "speedup-ratio": "10.0",
        "max-num-seqs": "4",
        "num-kv-blocks": "64",
    }
    # the engine's limits as it ran: the step budget, batch size and KV pool
    assert profile.max_num_batched_tokens == 1024
    assert (profile.max_num_seqs, profile.block_size_tokens, profile.num_kv_blocks) == (4, 16, 64)
    # the mocker sleeps its modeled step times: no prompt alone is timed shorter (a decode
    # gap seen by a client can be: test_sweep bounds the requests' whole times instead)
    model = PolynomialTiming(speedup_ratio=10)
    for p in profile.prefill:
        if p.num_requests == 1:
            assert p.ttft_ms >= model.prefill_ms(p.input_tokens) / 10


def test_profile_the_native_engine_then_run_the_mocker_from_it(
    tiny_llama_dir: Path,
    tiny_qwen2_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = ["--model", str(tiny_llama_dir)]
    torch_path = tmp_path / "torch.json"
    engine = ["--engine", "torch", *model, "--device", "cpu", "--dtype", "float32"]
    native = _profile([*engine, "--load-requests", "6"], torch_path, capsys)
    assert (native.source.engine, native.source.dtype) == ("torch", "float32")
    assert (native.block_size_tokens, native.num_kv_blocks, native.max_num_seqs) == (16, 64, 4)
    # the load pass: six requests of 16-64 prompt and 4-12 output tokens, every step timed
    load = native.load
    assert load is not None
    assert load.num_requests == 6 and load.request_rate_per_s > 0
    # a request of n outputs: its prefill gives the first, n - 1 decodes the rest
    assert 4 <= load.num_steps <= 6 * 12
    assert load.factor == load.measured_s / load.modeled_s
    # prompt steps and decode steps apart, which sum to all of them
    assert load.prompt_measured_s + load.decode_measured_s == pytest.approx(load.measured_s)
    assert load.prompt_modeled_s + load.decode_modeled_s == pytest.approx(load.modeled_s)
    prompt_factor = load.prompt_step_factor
    assert prompt_factor is not None
    timing = load_profile_timing(torch_path, model=tiny_llama_dir.name)
    assert timing.prefill_tokens == (16.0, 64.0)
    assert (timing.load_factor, timing.prompt_step_factor) == (1.0, prompt_factor)
    # the mocker driven by that profile, profiled in turn, sleeps the native engine's times:
    # its decode steps the sweep's, its prompt steps with the load pass's factor on each.
    # What it sleeps is the timing model's (pinned against the native profile here); what a
    # client sees is bounded below only: a late wake on a loaded machine adds to it
    argv = ["--engine", "mocker", *model, "--timing-profile", str(torch_path)]
    mocked = _profile(argv, tmp_path / "mocked.json", capsys)
    assert mocked.load is None
    for real, sim in zip(native.decode, mocked.decode, strict=True):
        assert (sim.num_requests, sim.context_tokens) == (real.num_requests, real.context_tokens)
        step = StepWork(0, sim.num_requests, 0.0, sim.num_requests * sim.context_tokens)
        assert timing.step_ms(step) == pytest.approx(real.itl_ms)
        assert sim.itl_ms >= real.itl_ms * 0.95
    # and its prefills after a cached prefix what the fitted cost per context pair adds
    assert timing.prefill_ms_per_context_pair >= 0.0
    for sim in (p for p in mocked.prefill if p.context_tokens):
        pairs = sim.input_tokens * sim.context_tokens
        modeled_ms = timing.get_prefill_ms(sim.input_tokens)
        expected_ms = (modeled_ms + timing.prefill_ms_per_context_pair * pairs) * prompt_factor
        step = StepWork(sim.input_tokens, 0, 0.0, num_prefill_context_pairs=pairs)
        assert timing.step_ms(step) == pytest.approx(expected_ms)
        assert sim.ttft_ms >= expected_ms * 0.95
    # a profile of another model is refused in one line
    other = ["--engine", "mocker", "--model", str(tiny_qwen2_dir), "--timing-profile"]
    code = main(["profile", *other, str(torch_path), "--output", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"armature: error: timing profile {torch_path} was measured on model "
        f"'{tiny_llama_dir.name}', not '{tiny_qwen2_dir.name}' (profile this model, or serve "
        "that one)\n"
    )
    # the name compared is the served one: the same model served as another name is refused
    aliased = [*model, "--engine", "mocker", "--served-model-name", "alias", "--timing-profile"]
    code = main(["profile", *aliased, str(torch_path), "--output", str(tmp_path / "y.json")])
    assert code == 2
    assert f"'{tiny_llama_dir.name}', not 'alias'" in capsys.readouterr().err


def test_sweep_passes_measure_every_point_that_many_times(
    tiny_llama_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`--sweep-passes 3`: three whole sweeps, one after another, and the same points."""
    argv = ["--engine", "mocker", "--model", str(tiny_llama_dir), "--speedup-ratio", "50"]
    argv += ["--sweep-passes", "3"]
    with caplog.at_level(logging.INFO, logger="armature.profiler.sweep"):
        _profile(argv, tmp_path / "passes.json", capsys)
    passes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sweep pass")]
    assert passes == ["sweep pass 1 of 3", "sweep pass 2 of 3", "sweep pass 3 of 3"]
    timed = [r for r in caplog.records if r.getMessage().startswith("decode ")]
    assert len(timed) == 3 * 4  # the 4 decode points, once a pass


def test_engines_at_once_profile_in_processes_of_their_own_and_merge(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--engines-at-once 2`: two `armature profile` processes of the same sweep, their
    profiles beside the plots, each point of the written one the median (of two: the mean)
    of theirs."""
    argv = ["--engine", "mocker", "--model", str(tiny_llama_dir), "--speedup-ratio", "50"]
    out, report = tmp_path / "pair.json", tmp_path / "pair"
    argv += [*SWEEP, "--engines-at-once", "2", "--output", str(out), "--report", str(report)]
    assert main(["profile", *argv]) == 0
    printed = capsys.readouterr().out
    assert f"engine 2's profile: {report / 'engine2.json'}" in printed
    assert sorted(p.name for p in report.iterdir()) == [
        "decode.png",
        "engine1.json",
        "engine2.json",
        "prefill.png",
    ]
    merged = read_profile(out)
    first, second = (read_profile(report / f"engine{i}.json") for i in (1, 2))
    assert (merged.source.engines_at_once, first.source.engines_at_once) == (2, 1)
    # each engine ran the whole sweep with the command's flags (not the parent's own)
    assert first.source.flags == second.source.flags == merged.source.flags
    assert "engines-at-once" not in first.source.flags
    assert len(merged.prefill) == len(first.prefill) == len(second.prefill) == 6
    for m, a, b in zip(merged.prefill, first.prefill, second.prefill, strict=True):
        assert (m.num_requests, m.input_tokens, m.context_tokens) == (
            a.num_requests,
            a.input_tokens,
            a.context_tokens,
        )
        assert m.ttft_ms == pytest.approx((a.ttft_ms + b.ttft_ms) / 2)
    for m, a, b in zip(merged.decode, first.decode, second.decode, strict=True):
        assert m.itl_ms == pytest.approx((a.itl_ms + b.itl_ms) / 2)
        assert m.tokens_per_s == pytest.approx(m.num_requests / (m.itl_ms / 1000.0))


def test_an_engine_that_fails_among_several_is_one_line(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each engine checks the sweep against itself (its context: the model's 512 tokens); the
    first failure is the command's one line (exit 2), and nothing is written."""
    argv = ["--engine", "mocker", "--model", str(tiny_llama_dir), *SWEEP]
    out = tmp_path / "never.json"
    argv += ["--decode-context-tokens", "64,600", "--engines-at-once", "3", "--output", str(out)]
    assert main(["profile", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("armature: error: engine 1 of 3: --decode-context-tokens 600 plus ")
    assert err.endswith(" does not fit the context of 512 tokens\n") and err.count("\n") == 1
    assert not out.exists()


def test_a_sweep_above_the_batch_limit_is_refused_before_any_engine_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The flags alone settle it: told at once, without building an engine or reading the
    model (a path that does not exist is not even looked at)."""
    argv = ["--engine", "mocker", "--model", str(tmp_path / "absent"), *SWEEP]
    argv += ["--decode-requests", "1,8", "--engines-at-once", "3"]
    assert main(["profile", *argv, "--output", str(tmp_path / "never.json")]) == 2
    assert capsys.readouterr().err == (
        "armature: error: --decode-requests 8 is above --max-num-seqs 4\n"
    )


def test_a_load_pass_on_vllm_is_refused_in_one_line(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's step records carry no context lengths: nothing to set against the tables."""
    argv = ["profile", "--engine", "vllm", "--model", str(tiny_llama_dir)]
    code = main([*argv, "--load-requests", "4", "--output", str(tmp_path / "v.json")])
    assert code == 2
    assert capsys.readouterr().err == (
        "armature: error: --load-requests: vLLM does not report its steps' context lengths "
        "or wall times, which the load pass sets against the tables; profile it without one\n"
    )
    assert not (tmp_path / "v.json").exists()
