"""The planner's performance model read from a small JSON table file (until `armature
profile` writes its profiles, which will implement the same `PerformanceModel`).

    {
      "format": "armature-planner-table/1",
      "model": "my-model",                 (optional: the served model name it was measured on)
      "prefill_tokens": [128, 1024, 4096], "prefill_s": [0.02, 0.08, 0.35],
      "decode_requests": [1, 64], "decode_context_tokens": [512, 4096],
      "decode_step_s": [[0.008, 0.010], [0.020, 0.045]],
      "max_num_seqs": 256, "max_kv_tokens": 200000
    }

Each table is `TablePerformanceModel`'s (performance.py): times in seconds, one row of
`decode_step_s` per batch size, one column per context length.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from armature.errors import ConfigError
from armature.planner.performance import TablePerformanceModel

__all__ = ["TABLE_FORMAT", "PerformanceModelFile", "read_performance_model"]

TABLE_FORMAT = "armature-planner-table/1"


class _Header(msgspec.Struct, frozen=True):
    format: str


class PerformanceModelFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: str
    prefill_tokens: list[float]
    prefill_s: list[float]
    decode_requests: list[int]
    decode_context_tokens: list[float]
    decode_step_s: list[list[float]]
    max_num_seqs: int
    max_kv_tokens: int
    model: str | None = None

    def to_model(self) -> TablePerformanceModel:
        return TablePerformanceModel(
            prefill_tokens=tuple(self.prefill_tokens),
            prefill_s=tuple(self.prefill_s),
            decode_requests=tuple(self.decode_requests),
            decode_context_tokens=tuple(self.decode_context_tokens),
            decode_step_s=tuple(tuple(row) for row in self.decode_step_s),
            max_num_seqs=self.max_num_seqs,
            max_kv_tokens=self.max_kv_tokens,
        )


def read_performance_model(path: Path) -> tuple[TablePerformanceModel, str | None]:
    """The model in `path` and the served model name it names (None: any); a ConfigError
    naming the file when it cannot be read or is not a table of this format."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--performance-model {path}: {exc.strerror or exc}") from None
    try:
        header = msgspec.json.decode(data, type=_Header)
        if header.format != TABLE_FORMAT:
            raise ConfigError(
                f"--performance-model {path}: format {header.format!r}, expected {TABLE_FORMAT!r}"
            )
        table = msgspec.json.decode(data, type=PerformanceModelFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"--performance-model {path}: {exc}") from None
    try:
        return table.to_model(), table.model
    except ConfigError as exc:
        raise ConfigError(f"--performance-model {path}: {exc}") from None
