"""Pooling: a prompt's last hidden states -> one L2-normalised float32 vector (embeddings).

Prompts lie flat, one span of rows each, as `encode` returns them:

    rows: [ prompt 0 (n_0 rows) | prompt 1 (n_1 rows) | ... ]
            ^cls          ^last
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from armature.protocols.embedding import Pooling

__all__ = ["pool"]


def pool(hidden: torch.Tensor, spans: list[tuple[int, int]], pooling: Pooling) -> torch.Tensor:
    """[len(spans), hidden] float32, each row of unit L2 norm: per (row_start, num_tokens)
    span of `hidden` [rows, hidden], the mean of its rows, its last row or its first row."""
    hidden = hidden.float()
    if pooling is Pooling.MEAN:
        pooled = torch.stack([hidden[start : start + n].mean(0) for start, n in spans])
    else:
        offset = 0 if pooling is Pooling.CLS else -1
        rows = [start + (offset % n) for start, n in spans]
        pooled = hidden.index_select(0, torch.tensor(rows, device=hidden.device))
    return F.normalize(pooled, p=2.0, dim=-1)
