"""A mocker worker's engine never loads torch: it computes no tensors, and torch's import alone
costs a worker seconds of CPU and about 200 MB. Built by the registry as `armature worker
--engine mocker` builds it, in an interpreter where torch cannot be imported, it serves sampled
and greedy requests, keeps blocks in a modeled host tier, and hands a prefill's KV blocks to a
decode worker over TCP."""

from __future__ import annotations

from pathlib import Path

from without_extension import run_without

SCRIPT = """
import asyncio, sys
from pathlib import Path
from armature.config import EngineConfig, KvCacheConfig, KvTierConfig, TransferConfig
from armature.engines.registry import get_kind
from armature.engines.spec import EngineSpec
from armature.model.source import ResolvedModel
from armature.protocols.engine import EngineRequest, FinishReason, SamplingParams
from armature.protocols.worker import WorkerRole

MODEL = ResolvedModel(Path(sys.argv[1]), "tiny")
kind = get_kind("mocker")


def build(worker_id, role, tiers=KvTierConfig()):
    engine = EngineConfig(engine="mocker", speedup_ratio=1000.0)
    kv = KvCacheConfig(num_kv_blocks=32)
    kind.check(engine, [role])
    spec = EngineSpec(
        engine=engine, kv=kv, transfer=TransferConfig(), model=MODEL, worker_id=worker_id,
        role=role, serve_kv_transfers=True, tiers=tiers,
    )
    return kind.build(spec)


async def run(engine, request):
    outputs = [o async for o in engine.generate(request)]
    return [t for o in outputs for t in o.new_token_ids], outputs[-1]


async def main():
    prompt = list(range(1, 65))
    agg = build("agg", WorkerRole.AGG, KvTierConfig(kv_host_blocks=64))
    assert agg.info.dtype == "bfloat16" and agg.info.device == "cpu", agg.info
    agg.engine.start()
    sampled = SamplingParams(max_tokens=4, temperature=0.7, seed=3, ignore_eos=True)
    tokens, last = await run(agg.engine, EngineRequest(
        request_id="s", prompt_token_ids=prompt, sampling=sampled))
    assert len(tokens) == 4 and last.finish_reason is FinishReason.LENGTH
    for i in range(3):  # other prompts push the first out of the 32 G1 blocks into G2
        other = [100 * (i + 2) + t for t in prompt]
        await run(agg.engine, EngineRequest(request_id=f"o{i}", prompt_token_ids=other,
                  sampling=SamplingParams(max_tokens=1, ignore_eos=True)))
    _, last = await run(agg.engine, EngineRequest(request_id="again", prompt_token_ids=prompt,
                        sampling=SamplingParams(max_tokens=1, ignore_eos=True)))
    assert last.num_cached_tokens == 48, last  # 3 of 4 full blocks: the last is recomputed
    await agg.engine.stop()

    prefill = build("p", WorkerRole.PREFILL)
    decode = build("d", WorkerRole.DECODE)
    prefill.engine.start(); decode.engine.start()
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    first, last = await run(prefill.engine, EngineRequest(
        request_id="x", prompt_token_ids=prompt, sampling=greedy, remote_prefill=True))
    assert last.finish_reason is FinishReason.TRANSFER and last.kv_handle is not None
    rest, last = await run(decode.engine, EngineRequest(
        request_id="x", prompt_token_ids=prompt, output_token_ids=first, sampling=greedy,
        kv_handle=last.kv_handle))
    assert decode.engine.num_kv_pulls == 1 and decode.engine.num_kv_blocks_pulled == 4
    assert len(first) == 1 and len(rest) == 3, (first, rest)  # the decode leg: 3 more
    await prefill.engine.stop(); await decode.engine.stop()

asyncio.run(main())
loaded = sorted(
    m for m, module in sys.modules.items() if module is not None and m.split(".")[0] == "torch"
)
print("torch modules:", loaded)
"""


def test_a_mocker_worker_serves_without_torch(tiny_llama_dir: Path) -> None:
    out = run_without("torch", f"import sys\nsys.argv[1:] = [{str(tiny_llama_dir)!r}]\n{SCRIPT}")
    assert out.strip() == "torch modules: []"


def test_a_replay_runs_without_torch() -> None:
    """`armature replay` simulates a fleet of mockers without loading torch (it once spent
    seconds of every replay's start importing it)."""
    script = (
        "import runpy, sys\n"
        "sys.argv = ['armature', 'replay', '--synthetic', 'prefix-groups', '--num-requests', "
        "'40', '--router', 'kv', '--workers', '2', '--prefill-workers', '1']\n"
        "try:\n"
        "    runpy.run_module('armature.cli', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
    )
    out = run_without("torch", script)
    assert "num_requests: 40" in out, out
