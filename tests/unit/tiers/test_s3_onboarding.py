"""A prompt one engine wrote to an S3 store (moto's real server) is onboarded by another; a
truncated object is refused there and the rest of the prompt computed, with the same tokens."""

from __future__ import annotations

import random
from pathlib import Path

from armature.config import KvTierConfig
from armature.engines.native.config import NativeEngineConfig
from armature.engines.native.core import EngineCore
from armature.kv.event_log import KvEventLog
from armature.kv.hashing import DEFAULT_HASH_SEED, compute_block_hashes
from armature.protocols.engine import EngineOutput, EngineRequest, SamplingParams
from armature.protocols.kv_events import KvTier
from armature.tiers.factory import build_tier_manager
from armature.tiers.manager import KvTierManager
from armature.tiers.s3_store import make_s3_client
from armature.transfer.blocks import KvBlockStore
from servers import MotoS3

BLOCK = 16


def s3_engine(model_dir: Path, tiers: KvTierConfig) -> EngineCore:
    config = NativeEngineConfig(model_dir=model_dir, dtype="float32", num_kv_blocks=64)

    def build(log: KvEventLog, store: KvBlockStore) -> KvTierManager:
        tensors = store.kv_tensors()
        assert tensors is not None
        return build_tier_manager(tiers, log, tensors, store.layout, model_name="tiny", weights="w")

    return EngineCore(config, tiers=build)


def run(core: EngineCore, prompt: list[int], request_id: str) -> tuple[list[int], int]:
    params = SamplingParams(max_tokens=8, temperature=0.0, min_tokens=8)
    core.add_request(EngineRequest(request_id=request_id, prompt_token_ids=prompt, sampling=params))
    outputs: list[EngineOutput] = []
    while core.has_work():
        outputs.extend(core.step())
    return [t for o in outputs for t in o.new_token_ids], outputs[0].num_cached_tokens


def test_a_truncated_object_is_refused_and_the_rest_computed(
    tiny_llama_dir: Path, moto_s3: MotoS3, bucket: str
) -> None:
    url = f"s3://{bucket}/fleet"
    writer = s3_engine(
        tiny_llama_dir,
        KvTierConfig(
            kv_remote=url,
            kv_remote_endpoint=moto_s3.url,
            kv_remote_offload="all",
            kv_offload="write-through",
        ),
    )
    rng = random.Random(11)
    prompt = [rng.randrange(3, 512) for _ in range(200)]  # 12 full blocks
    first, _ = run(writer, prompt, "w")
    writer.close()
    client = make_s3_client(moto_s3.url)
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    [journal] = [
        o["Key"] for o in listed if o["Key"].startswith("fleet/tiny-") and "/journal/" in o["Key"]
    ]
    objects = [o for o in listed if o["Key"] != journal]
    assert len(objects) == 12
    named = client.get_object(Bucket=bucket, Key=journal)["Body"].read().decode().split()
    assert sorted(named) == sorted(o["Key"].rsplit("/", 1)[1] for o in objects)
    bad = compute_block_hashes(prompt, BLOCK, DEFAULT_HASH_SEED, None)[4][0]
    [key] = [o["Key"] for o in objects if f"/{bad:016x}-" in o["Key"]]
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=data[: len(data) // 2])

    reader = s3_engine(tiny_llama_dir, KvTierConfig(kv_remote=url, kv_remote_endpoint=moto_s3.url))
    second, cached = run(reader, prompt, "r")
    assert second == first
    assert cached == 4 * BLOCK  # the blocks before the truncated one
    tiers = reader.tiers
    assert tiers is not None
    assert tiers.counters.blocks_onboarded == {KvTier.EXTERNAL: 4}
    assert tiers.counters.blocks_refused == {"truncated": 1}
    reader.close()
