"""Building the native engine. Where a worker files its blocks in a disk tier or a shared
store: under the name clients call the model by (a worker that `serve` starts loads the
converted default model from its cache directory, whose name carries a digest, as
SmolLM2-135M-Instruct; it filed its blocks under the directory's name while serve's
in-process engine used the served one, so the blocks one stored were the other's misses).
Memory that cannot be had is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.config import EngineConfig, KvCacheConfig, KvTierConfig, TransferConfig
from armature.engines.registry import get_kind
from armature.engines.spec import EngineSpec
from armature.errors import ConfigError
from armature.model.source import ResolvedModel


def namespaces(model_dir: Path, disk: Path, served_model_name: str | None) -> list[str]:
    engine = EngineConfig(
        engine="torch", dtype="float32", device="cpu", served_model_name=served_model_name
    )
    spec = EngineSpec(
        engine=engine,
        kv=KvCacheConfig(num_kv_blocks=32),
        transfer=TransferConfig(),
        model=ResolvedModel(model_dir, model_dir.name),
        worker_id="w",
        tiers=KvTierConfig(kv_disk_dir=str(disk), kv_disk_blocks=64),
    )
    built = get_kind("torch").build(spec)
    built.engine.core.close()  # type: ignore[attr-defined]
    return sorted(p.name for p in disk.iterdir())


def test_blocks_are_filed_under_the_served_name(tiny_llama_dir: Path, tmp_path: Path) -> None:
    [served] = namespaces(tiny_llama_dir, tmp_path / "a", "smol")
    assert served.startswith("smol-")
    [own] = namespaces(tiny_llama_dir, tmp_path / "b", None)
    assert own.startswith(f"{tiny_llama_dir.name}-")  # without one, the model's own name
    # the same served name, whichever directory it is loaded from: one namespace
    link = tmp_path / "SmolLM2-135M-Instruct-2b4642d961"
    link.symlink_to(tiny_llama_dir)
    assert namespaces(link, tmp_path / "c", "smol") == [served]


def test_another_checkpoint_under_the_same_name_has_blocks_of_its_own(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """Weights replaced under one served name (a fine-tune, an upgrade in place): the KV the
    old ones computed must not be found by the new (its greedy output went wrong)."""
    import shutil

    from safetensors.torch import load_file, save_file

    changed = tmp_path / "changed"
    shutil.copytree(tiny_llama_dir, changed)
    [weights] = changed.glob("*.safetensors")
    tensors = load_file(weights)
    name = "model.layers.0.self_attn.k_proj.weight"
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, weights, metadata={"format": "pt"})
    [before] = namespaces(tiny_llama_dir, tmp_path / "disk", "smol")
    both = namespaces(changed, tmp_path / "disk", "smol")  # the same disk directory
    assert len(both) == 2 and before in both
    assert all(n.startswith("smol-") for n in both)  # one name, two namespaces


def test_a_kv_cache_larger_than_memory_is_one_line(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The CPU allocator's failure is a RuntimeError (a traceback before), not torch's
    OutOfMemoryError: a G1 of 2**31 - 2 blocks, or a host tier of 2**40 (terabytes)."""
    engine = EngineConfig(engine="torch", dtype="float32", device="cpu")
    for kv, tiers in [
        (KvCacheConfig(num_kv_blocks=2**31 - 2), KvTierConfig()),
        (KvCacheConfig(num_kv_blocks=32), KvTierConfig(kv_host_blocks=2**40)),
    ]:
        spec = EngineSpec(
            engine=engine,
            kv=kv,
            transfer=TransferConfig(),
            model=ResolvedModel(tiny_llama_dir, tiny_llama_dir.name),
            worker_id="w",
            tiers=tiers,
        )
        with pytest.raises(ConfigError, match=r"^out of memory while allocating the model, the KV"):
            get_kind("torch").build(spec)


@pytest.mark.parametrize("remote", ["{disk}", "{disk}/..", "{disk}/shared"])
def test_a_disk_tier_overlapping_a_shared_directory_is_refused(
    tiny_llama_dir: Path, tmp_path: Path, remote: str
) -> None:
    """G3 and a file:// G4 in one directory (or one inside the other): the disk tier deleted
    the shared store's files as it evicted its own blocks, and G4's loads failed."""
    disk = tmp_path / "tiers"
    spec = EngineSpec(
        engine=EngineConfig(engine="torch", dtype="float32", device="cpu"),
        kv=KvCacheConfig(num_kv_blocks=32),
        transfer=TransferConfig(),
        model=ResolvedModel(tiny_llama_dir, tiny_llama_dir.name),
        worker_id="w",
        tiers=KvTierConfig(
            kv_disk_dir=str(disk),
            kv_disk_blocks=64,
            kv_remote="file://" + remote.format(disk=disk),
        ),
    )
    with pytest.raises(ConfigError, match=r"^--kv-disk-dir .* overlap: the disk tier would"):
        get_kind("torch").build(spec)
