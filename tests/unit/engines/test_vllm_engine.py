"""VllmEngine over a fake AsyncLLM (the `AsyncLlm` seam): streaming, cancellation, validation,
load. The real vLLM is exercised by tests/vllm_engine (scripts/check-vllm)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from vllm_fakes import FakeCompletion, FakeLogprob, FakeOutput
from vllm_fakes import make_engine as make_fake_engine

from armature.cli.main import main
from armature.engines.api import EngineDeadError, InvalidRequestError
from armature.engines.validation import validate_request
from armature.engines.vllm.build import _StatLogger
from armature.engines.vllm.engine import VllmEngine, VllmEngineInfo
from armature.engines.vllm.load import SchedulerSnapshot
from armature.engines.vllm.sampling import VllmSampling
from armature.protocols.engine import (
    EngineRequest,
    FinishReason,
    SamplingParams,
    StepRecord,
    TokenLogprob,
)
from polling import wait_until

INFO = VllmEngineInfo(
    block_size=32, num_kv_blocks=10, max_model_len=256, vocab_size=100, max_logprobs=20
)


@dataclass
class FakeLlm:
    """Yields one token per step until max_tokens; records what was aborted."""

    step_s: float = 0.0
    aborted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    errored: bool = False
    shut_down: bool = False

    async def generate(
        self, prompt: Any, sampling_params: VllmSampling, request_id: str
    ) -> AsyncGenerator[FakeOutput, None]:
        done = False
        try:
            for i in range(sampling_params.max_tokens):
                await asyncio.sleep(self.step_s)
                last = i == sampling_params.max_tokens - 1
                reason = "length" if last else None
                yield FakeOutput([FakeCompletion([len(prompt) + i], reason)], num_cached_tokens=0)
            done = True
            self.finished.append(request_id)
        finally:
            if not done:
                self.aborted.append(request_id)

    def shutdown(self) -> None:
        self.shut_down = True


def make_engine(llm: FakeLlm, client_errors: tuple[type[Exception], ...] = ()) -> VllmEngine:
    return make_fake_engine(llm, INFO, client_errors=client_errors)


def request(request_id: str = "r", max_tokens: int = 3, **kw: Any) -> EngineRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return EngineRequest(
        request_id=request_id, prompt_token_ids=kw.pop("prompt", [1, 2, 3]), sampling=sampling, **kw
    )


async def test_streams_until_finished_with_usage_on_the_first_output() -> None:
    llm = FakeLlm()
    engine = make_engine(llm)
    outputs = [o async for o in engine.generate(request())]
    assert [o.new_token_ids for o in outputs] == [[3], [4], [5]]
    assert [o.finish_reason for o in outputs] == [None, None, FinishReason.LENGTH]
    assert [o.num_prompt_tokens for o in outputs] == [3, 0, 0]
    assert llm.finished == ["r"] and llm.aborted == []
    assert engine.get_num_active_requests() == 0
    await engine.stop()
    assert llm.shut_down and not engine.is_alive


async def test_closing_the_stream_aborts_in_vllm_and_frees_the_request() -> None:
    llm = FakeLlm()
    engine = make_engine(llm)
    stream = engine.generate(request(max_tokens=100))
    first = await stream.__anext__()
    assert first.new_token_ids == [3]
    await stream.aclose()  # type: ignore[attr-defined]
    assert llm.aborted == ["r"]
    assert engine.get_num_active_requests() == 0
    assert engine.get_load().num_prefill_tokens_queued == 0


async def test_cancelling_the_consumer_aborts_too() -> None:
    llm = FakeLlm(step_s=0.05)
    engine = make_engine(llm)

    async def consume() -> None:
        async for _ in engine.generate(request(max_tokens=100)):
            pass

    task = asyncio.create_task(consume())
    await wait_until(lambda: engine.get_num_active_requests() == 1, "the request running")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert llm.aborted == ["r"]
    assert engine.get_num_active_requests() == 0


@pytest.mark.parametrize(
    "bad",
    [
        request(prompt=[]),
        request(prompt=[1, 100]),
        request(max_tokens=300),
        request(max_tokens=0),
        msgspec.structs.replace(request(), remote_prefill=True),  # no connector
    ],
)
async def test_bad_requests_fail_before_reaching_vllm(bad: EngineRequest) -> None:
    llm = FakeLlm()
    engine = make_engine(llm)
    with pytest.raises(InvalidRequestError) as raised:
        async for _ in engine.generate(bad):
            pass
    assert llm.finished == [] and llm.aborted == []
    if not bad.remote_prefill:  # the native engine's words for the same mistake
        with pytest.raises(InvalidRequestError) as native:
            validate_request(
                bad, vocab_size=100, max_model_len=256, block_size=32, num_kv_blocks=10
            )
        assert str(raised.value) == str(native.value)


async def test_adapter_requests_get_a_400_naming_the_engine() -> None:
    llm = FakeLlm()
    engine = make_engine(llm)
    with pytest.raises(InvalidRequestError, match="the vllm engine serves no LoRA adapters"):
        async for _ in engine.generate(msgspec.structs.replace(request(), lora_name="sql")):
            pass
    assert llm.finished == [] and llm.aborted == []
    with pytest.raises(InvalidRequestError, match="the vllm engine serves no LoRA adapters"):
        await engine.load_lora("sql", "/adapters/sql")
    assert engine.get_lora_adapters() == []


def test_cli_vllm_refuses_lora_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--engine", "vllm", "--lora", "sql=/adapters/sql"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "armature: error: --lora needs --engine torch (or mocker): the vllm adapter serves no "
        "LoRA adapters"
    ]


async def test_a_request_vllm_refuses_is_invalid_not_a_crash() -> None:
    class Refusing(FakeLlm):
        async def generate(
            self, prompt: Any, sampling_params: VllmSampling, request_id: str
        ) -> AsyncGenerator[FakeOutput, None]:
            raise ValueError("vLLM says no")
            yield  # an async generator, like vLLM's

    engine = make_engine(Refusing(), client_errors=(ValueError,))
    with pytest.raises(InvalidRequestError, match="vLLM says no"):
        await engine.generate(request()).__anext__()
    assert engine.get_num_active_requests() == 0
    assert engine.get_load().num_prefill_tokens_queued == 0


async def test_duplicate_ids_and_a_dead_engine() -> None:
    llm = FakeLlm(step_s=0.05)
    engine = make_engine(llm)
    first = engine.generate(request(max_tokens=10))
    await first.__anext__()
    with pytest.raises(InvalidRequestError, match="duplicate request id"):
        await engine.generate(request(max_tokens=10)).__anext__()
    await first.aclose()  # type: ignore[attr-defined]
    llm.errored = True
    assert not engine.is_alive
    with pytest.raises(EngineDeadError):
        await engine.generate(request("other")).__anext__()


async def test_load_follows_vllm_steps_bounded_by_requests_in_flight() -> None:
    engine = make_engine(FakeLlm())
    streams = [engine.generate(request(f"r{i}", max_tokens=10)) for i in range(3)]
    for stream in streams:
        await stream.__anext__()
    engine.record_step(SchedulerSnapshot(num_running=2, num_waiting=3, kv_cache_usage=0.5))
    load = engine.get_load()
    assert (load.num_running, load.num_waiting, load.num_active_blocks, load.num_steps) == (
        2,
        1,
        5,
        1,
    )
    for stream in streams:
        await stream.aclose()  # type: ignore[attr-defined]
    idle = engine.get_load()
    assert (idle.num_running, idle.num_waiting, idle.num_active_blocks) == (0, 0, 0)
    assert engine.take_kv_events() == []


@dataclass
class FakePrefixCacheStats:
    hits: int = 0


@dataclass
class FakeSchedulerStats:
    """The fields of vLLM's SchedulerStats the adapter reads."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: FakePrefixCacheStats = field(default_factory=FakePrefixCacheStats)
    kv_connector_stats: dict[str, Any] | None = None


@dataclass
class FakeIterationStats:
    """The fields of vLLM's IterationStats the adapter reads."""

    num_prompt_tokens: int = 0
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)


async def test_each_vllm_step_leaves_a_step_record() -> None:
    """vLLM's stat logger hands each step's stats over; the engine keeps one StepRecord per
    step (engines/vllm/steps.py maps the fields) until they are taken."""
    engine = make_engine(FakeLlm(step_s=60.0))
    stream = engine.generate(request("w", prompt=[1] * 40))
    first = asyncio.create_task(anext(stream))  # 40 prompt tokens queued until its output
    for _ in range(100):
        if engine.get_load().num_prefill_tokens_queued == 40:
            break
        await asyncio.sleep(0.01)
    logger = _StatLogger([engine])
    scheduler = FakeSchedulerStats(
        num_running_reqs=1,
        num_waiting_reqs=2,
        kv_cache_usage=0.2,
        prefix_cache_stats=FakePrefixCacheStats(hits=32),
    )
    iteration = FakeIterationStats(
        num_prompt_tokens=100,
        time_to_first_tokens_iter=[0.1, 0.2],
        inter_token_latencies_iter=[0.03, 0.02, 0.05],
    )
    logger.record(scheduler, iteration)
    logger.record(FakeSchedulerStats(num_running_reqs=1, kv_cache_usage=0.1), None)
    assert engine.take_step_records() == [
        StepRecord(
            num_scheduled_prefill_requests=2,
            num_scheduled_prefill_tokens=68,  # 100 prompt tokens, 32 of them cached
            num_queued_prefill_requests=0,  # vLLM's 2 waiting, bounded by the 1 in flight
            num_queued_prefill_tokens=40,
            num_decode_requests=3,
            num_decode_kv_tokens=0,  # vLLM does not say
            num_kv_tokens_used=64,  # 20% of 10 blocks of 32 tokens
            step_wall_s=0.02,
        ),
        StepRecord(num_queued_prefill_tokens=40, num_kv_tokens_used=32),
    ]
    assert engine.take_step_records() == []
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await stream.aclose()  # type: ignore[attr-defined]
    assert engine.get_load().num_prefill_tokens_queued == 0


def test_cli_without_vllm_says_how_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    assert main(["worker", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "armature: error: the vllm engine needs vLLM: pip install 'armature[vllm]' "
        "(a ~3.5 GB environment; see README, 'vLLM engine')"
    ]


def test_cli_disaggregated_vllm_workers_need_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    argv = ["serve", "--engine", "vllm", "--prefill-workers", "1", "--decode-workers", "1"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "armature: error: the vllm engine needs vLLM: pip install 'armature[vllm]' "
        "(a ~3.5 GB environment; see README, 'vLLM engine')"
    ]


def test_engine_flags_map_to_vllm_settings(tmp_path: Path) -> None:
    from armature.cli.main import build_parser
    from armature.cli.options import read_settings
    from armature.config import WorkerConfig
    from armature.engines.vllm.build import VllmEngineConfig
    from armature.engines.vllm.factory import vllm_config
    from armature.model.source import ResolvedModel

    argv = ["worker", "--engine", "vllm", "--dtype", "float32", "--max-model-len", "1024"]
    argv += ["--num-kv-blocks", "40", "--max-num-seqs", "8", "--no-prefix-caching"]
    argv += ["--seed", "3", "--enforce-eager"]
    worker = read_settings(build_parser().parse_args(argv), WorkerConfig)
    config = vllm_config(worker.engine, worker.kv, ResolvedModel(tmp_path, "m"))
    assert config == VllmEngineConfig(
        model_dir=tmp_path,
        dtype="float32",
        block_size=None,  # vLLM's own
        kv_cache_bytes=None,  # --num-kv-blocks wins
        num_kv_blocks=40,
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        max_model_len=1024,
        enable_prefix_caching=False,
        seed=3,
        enforce_eager=True,
    )


@dataclass
class ScoringLlm:
    """Sends the prompt's logprobs in two chunks, the first alone (no token yet), as vLLM's
    deltas may: position 0 has none, each later one its token and the top 1 by rank."""

    errored: bool = False

    async def generate(
        self, prompt: Any, sampling_params: VllmSampling, request_id: str
    ) -> AsyncGenerator[FakeOutput, None]:
        assert sampling_params.prompt_logprobs == 1

        def entry(token: int) -> dict[int, FakeLogprob]:
            return {token: FakeLogprob(-float(token), 2), 0: FakeLogprob(-0.1, 1)}

        yield FakeOutput([FakeCompletion([])], prompt_logprobs=[None, entry(prompt[1])])
        rest = [entry(t) for t in prompt[2:]]
        yield FakeOutput([FakeCompletion([50])], prompt_logprobs=rest, num_cached_tokens=0)
        yield FakeOutput([FakeCompletion([51], "length")])

    def shutdown(self) -> None:
        pass


async def test_prompt_logprobs_come_whole_with_the_first_token() -> None:
    engine = make_fake_engine(ScoringLlm(), INFO)
    sampling = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    scored = EngineRequest(request_id="s", prompt_token_ids=[7, 8, 9, 10], sampling=sampling)
    outputs = [o async for o in engine.generate(scored)]
    assert [o.new_token_ids for o in outputs] == [[50], [51]]
    assert outputs[0].prompt_logprobs == [
        TokenLogprob(t, -float(t), [(0, -0.1)]) for t in (8, 9, 10)
    ]
    assert outputs[1].prompt_logprobs is None
    assert outputs[0].num_prompt_tokens == 4
    await engine.stop()
