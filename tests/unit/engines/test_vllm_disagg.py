"""Prefill and decode legs of the vllm engine over a fake AsyncLLM: what reaches vLLM's NIXL
connector (its `kv_transfer_params`) and what comes back as our KvHandle. The real transfer
between two vLLM engines is tests/vllm_engine/test_vllm_disagg_live.py (scripts/check-vllm)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from vllm_fakes import FakeCompletion, FakeOutput
from vllm_fakes import make_engine as make_fake_engine

from armature.engines.api import InvalidRequestError
from armature.engines.vllm.disagg import (
    NIXL_BACKEND,
    ConnectorParamsError,
    decode_transfer_params,
    to_kv_handle,
)
from armature.engines.vllm.engine import VllmEngine, VllmEngineInfo, VllmTransfer
from armature.engines.vllm.sampling import VllmSampling
from armature.protocols.engine import EngineRequest, EngineStats, FinishReason, SamplingParams
from armature.protocols.kv_transfer import ConnectorTransfer, KvHandle, KvLayout, NativeTransfer

BLOCK_SIZE = 4
INFO = VllmEngineInfo(
    block_size=BLOCK_SIZE, num_kv_blocks=50, max_model_len=128, vocab_size=100, max_logprobs=20
)
LAYOUT = KvLayout(num_layers=2, block_size=BLOCK_SIZE, num_kv_heads=1, head_dim=8, dtype="float32")
TRANSFER = VllmTransfer(worker_id="worker-p", layout=LAYOUT, lease_s=30)
PARAMS = {  # what vLLM's NIXL connector returns for a prefill of 8 tokens (2 blocks)
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[11, 12]],
    "remote_engine_id": "engine-p",
    "remote_request_id": "r",
    "remote_host": "127.0.0.1",
    "remote_port": 5601,
    "tp_size": 1,
}


@dataclass
class FakeLlm:
    """One token per step (token = its position); records the sampling params and prompts it
    was given. `stop_first`: the first token is EOS. Its prefill legs return PARAMS."""

    stop_first: bool = False
    num_cached_tokens: int = 0
    calls: list[tuple[list[int], VllmSampling]] = field(default_factory=list)
    errored: bool = False

    async def generate(
        self, prompt: Any, sampling_params: VllmSampling, request_id: str
    ) -> AsyncGenerator[FakeOutput, None]:
        self.calls.append((list(prompt), sampling_params))
        extra = sampling_params.extra_args or {}
        prefill = extra.get("kv_transfer_params", {}).get("do_remote_decode", False)
        for i in range(sampling_params.max_tokens):
            last = self.stop_first or i == sampling_params.max_tokens - 1
            reason = ("stop" if self.stop_first else "length") if last else None
            yield FakeOutput(
                [FakeCompletion([len(prompt) + i], reason)],
                num_cached_tokens=self.num_cached_tokens if i == 0 else 0,
                kv_transfer_params=dict(PARAMS) if prefill and last else None,
            )
            if last:
                return

    def shutdown(self) -> None:
        pass


def make_engine(llm: FakeLlm, transfer: VllmTransfer | None = TRANSFER) -> VllmEngine:
    return make_fake_engine(llm, INFO, transfer=transfer)


def request(prompt_len: int = 8, max_tokens: int = 5, **kw: Any) -> EngineRequest:
    return EngineRequest(
        request_id="r",
        prompt_token_ids=list(range(1, prompt_len + 1)),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, min_tokens=2),
        **kw,
    )


def handle(params: dict[str, Any] | None = None) -> KvHandle:
    return to_kv_handle(
        params or PARAMS, request_id="r", worker_id="worker-p", layout=LAYOUT, ttl_s=30
    )


async def test_a_prefill_leg_runs_one_token_and_hands_vllms_params_over() -> None:
    llm = FakeLlm()
    engine = make_engine(llm)
    outputs = [o async for o in engine.generate(request(remote_prefill=True))]
    ((prompt, sampling),) = llm.calls
    assert prompt == list(range(1, 9))
    assert (sampling.max_tokens, sampling.min_tokens) == (1, 1)
    assert sampling.extra_args == {"kv_transfer_params": {"do_remote_decode": True}}
    (out,) = outputs
    assert out.new_token_ids == [8] and out.finish_reason is FinishReason.TRANSFER
    assert out.kv_handle == handle()
    assert out.kv_handle.transfer == ConnectorTransfer(
        connector=NIXL_BACKEND, params=msgspec.msgpack.encode(PARAMS)
    )
    assert out.kv_handle.seq_hashes == []  # nothing for the frontend to release


async def test_a_prefill_that_stops_at_its_first_token_hands_nothing_over() -> None:
    llm = FakeLlm(stop_first=True)
    (out,) = [o async for o in make_engine(llm).generate(request(remote_prefill=True))]
    assert out.finish_reason is FinishReason.STOP and out.kv_handle is None


async def test_a_prefill_vllm_kept_nothing_for_still_hands_over_to_decode() -> None:
    """No usable params (vLLM freed the blocks): still TRANSFER, so the client's output is not
    cut at one token; with no handle the decode worker computes the prompt."""

    class Forgetful(FakeLlm):
        async def generate(
            self, prompt: Any, sampling_params: VllmSampling, request_id: str
        ) -> AsyncGenerator[FakeOutput, None]:
            async for out in super().generate(prompt, sampling_params, request_id):
                out.kv_transfer_params = None
                yield out

    (out,) = [o async for o in make_engine(Forgetful()).generate(request(remote_prefill=True))]
    assert out.finish_reason is FinishReason.TRANSFER and out.kv_handle is None


async def test_a_one_token_request_sent_to_prefill_is_served_whole() -> None:
    llm = FakeLlm()
    engine = make_engine(llm)
    (out,) = [o async for o in engine.generate(request(max_tokens=1, remote_prefill=True))]
    assert llm.calls[0][1].extra_args is None
    assert out.finish_reason is FinishReason.LENGTH and out.kv_handle is None


async def test_a_decode_leg_continues_after_the_first_token_and_pulls_the_prompt() -> None:
    llm = FakeLlm()
    engine = make_engine(llm)
    decode = request(output_token_ids=[8], max_tokens=4, kv_handle=handle())
    outputs = [o async for o in engine.generate(decode)]
    ((prompt, sampling),) = llm.calls
    assert prompt == [*range(1, 9), 8]  # the prompt, then the prefill's token
    assert sampling.min_tokens == 1 and sampling.max_tokens == 4
    # 9 context tokens need 3 blocks of 4: the prefill's last block is repeated for the third
    assert sampling.extra_args == {
        "kv_transfer_params": {
            **PARAMS,
            "remote_block_ids": [[11, 12, 12]],
            "do_remote_prefill": True,
            "do_remote_decode": False,
        }
    }
    assert [o.new_token_ids for o in outputs] == [[9], [10], [11], [12]]
    engine.record_transfers(num_bytes=3 * LAYOUT.bytes_per_block, num_failures=0)  # vLLM's stats
    assert engine.stats() == EngineStats(
        num_kv_pulls_by_backend={"vllm-nixl": 1}, num_kv_blocks_pulled=3, num_kv_pull_failures=0
    )


async def test_a_handle_from_another_engine_or_no_connector_computes_the_prompt() -> None:
    native = KvHandle(
        handle_id="h",
        worker_id="w",
        layout=LAYOUT,
        seq_hashes=[1, 2],
        transfer=NativeTransfer(endpoints={"tcp": "tcp://127.0.0.1:1"}),
    )
    for engine_transfer, kv_handle in ((TRANSFER, native), (None, handle())):
        llm = FakeLlm()
        engine = make_engine(llm, engine_transfer)
        decode = request(output_token_ids=[8], max_tokens=2, kv_handle=kv_handle)
        outputs = [o async for o in engine.generate(decode)]
        assert llm.calls[0][1].extra_args is None
        assert outputs[-1].finish_reason is FinishReason.LENGTH


async def test_a_worker_without_the_connector_refuses_prefill_legs() -> None:
    llm = FakeLlm()
    with pytest.raises(InvalidRequestError, match="start it with --role prefill"):
        async for _ in make_engine(llm, None).generate(request(remote_prefill=True)):
            pass
    assert llm.calls == []


@pytest.mark.parametrize(
    ("num_context_tokens", "expected"),
    [
        (5, [[11, 12]]),  # within the prefill's blocks
        (8, [[11, 12]]),
        (9, [[11, 12, 12]]),  # the first token opens a block the prefill never had
    ],
)
def test_decode_params_cover_every_context_block(
    num_context_tokens: int, expected: list[list[int]]
) -> None:
    params = decode_transfer_params(
        handle(), num_context_tokens=num_context_tokens, block_size=BLOCK_SIZE
    )
    assert params is not None and params["remote_block_ids"] == expected


def test_flat_block_ids_are_one_group() -> None:
    params = decode_transfer_params(
        handle({**PARAMS, "remote_block_ids": [3]}), num_context_tokens=5, block_size=BLOCK_SIZE
    )
    assert params is not None and params["remote_block_ids"] == [[3, 3]]


def test_the_adapter_reads_its_own_params_back_exactly() -> None:
    """What the prefill leg packed is what the decode leg's params are built from: every key
    and value vLLM returned, as it returned them (only the block ids are padded)."""
    params = {**PARAMS, "remote_block_ids": [[11, 12], [21, 22]], "extra": {"a": [1.5, None]}}
    out = decode_transfer_params(handle(params), num_context_tokens=8, block_size=BLOCK_SIZE)
    assert out == {**params, "do_remote_prefill": True, "do_remote_decode": False}


def test_another_connectors_handle_is_not_vllms() -> None:
    other = msgspec.structs.replace(
        handle(), transfer=ConnectorTransfer(connector="sglang", params=msgspec.msgpack.encode({}))
    )
    assert decode_transfer_params(other, num_context_tokens=5, block_size=BLOCK_SIZE) is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (b"\xc1", "unreadable vLLM transfer params"),  # 0xc1: never used in msgpack
        (msgspec.msgpack.encode({"remote_host": "h"}), "lack the remote engine"),
        (msgspec.msgpack.encode([1, 2]), "lack the remote engine"),
        (msgspec.msgpack.encode({**PARAMS, "remote_block_ids": [[]]}), "no remote block"),
    ],
)
def test_unreadable_handles_are_refused(params: bytes, message: str) -> None:
    transfer = ConnectorTransfer(connector=NIXL_BACKEND, params=params)
    bad = msgspec.structs.replace(handle(), transfer=transfer)
    with pytest.raises(ConnectorParamsError, match=message):
        decode_transfer_params(bad, num_context_tokens=5, block_size=BLOCK_SIZE)


def test_vllm_params_without_a_remote_engine_make_no_handle() -> None:
    with pytest.raises(ConnectorParamsError, match="without remote_engine_id"):
        to_kv_handle(
            {"remote_block_ids": [[1]]}, request_id="r", worker_id="w", layout=LAYOUT, ttl_s=1
        )
