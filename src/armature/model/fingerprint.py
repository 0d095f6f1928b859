"""A model directory's weights fingerprint: what tells two checkpoints apart where their name
and shapes agree (a fine-tune saved under the same name, weights replaced in place), so that
KV blocks one computed are never read as the other's (tiers/block_file.py's namespace).

Content, not paths or times: the same weights give the same fingerprint on every host (a
shared store's workers agree) and from any copy. Reading every byte would take minutes for a
large model at each start, so it reads `config.json`, each safetensors file's header (the
tensors' names, dtypes, shapes and offsets) and three samples of each tensor's data (its
first, middle and last `SAMPLE_BYTES`): a change to a tensor that leaves all three samples
alike goes unseen; retraining, merging an adapter or rescaling a tensor does not."""

from __future__ import annotations

import json
from pathlib import Path

import xxhash

from armature.errors import ConfigError

__all__ = ["SAMPLE_BYTES", "weights_fingerprint"]

SAMPLE_BYTES = 4096
_HEADER_LENGTH_BYTES = 8  # safetensors: a little-endian u64, then that many bytes of JSON
_MAX_HEADER_BYTES = 100 << 20  # what safetensors itself accepts


def weights_fingerprint(model_dir: Path) -> str:
    """16 hex digits of xxh3_64 over the model's config and sampled weights; ConfigError
    when a weights file cannot be read."""
    digest = xxhash.xxh3_64()
    config = model_dir / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0")
        try:
            _sample_file(path, digest)
        except (OSError, ValueError, LookupError, TypeError) as exc:
            raise ConfigError(f"cannot read the weights file {path}: {exc}") from None
    return digest.hexdigest()


def _sample_file(path: Path, digest: xxhash.xxh3_64) -> None:
    with path.open("rb") as f:
        length = int.from_bytes(f.read(_HEADER_LENGTH_BYTES), "little")
        if not 0 < length <= _MAX_HEADER_BYTES:
            raise ValueError(f"a header of {length} bytes")
        header = f.read(length)
        digest.update(header)
        data_at = _HEADER_LENGTH_BYTES + length
        tensors = json.loads(header)
        if not isinstance(tensors, dict):
            raise ValueError("a header that is not a JSON object")
        for name in sorted(tensors):
            if name == "__metadata__":
                continue
            start, end = tensors[name]["data_offsets"]
            middle = (start + end - SAMPLE_BYTES) // 2
            for at in sorted({start, max(start, middle), max(start, end - SAMPLE_BYTES)}):
                f.seek(data_at + at)
                digest.update(f.read(min(SAMPLE_BYTES, end - at)))
