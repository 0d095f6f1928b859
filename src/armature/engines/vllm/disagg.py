"""Disaggregated prefill/decode with vLLM workers: our KvHandle <-> vLLM's NIXL connector.
Pure: no vLLM import.

vLLM's NixlConnector moves the blocks; this module only maps our protocol onto its
`kv_transfer_params`:

- The prefill leg runs with `max_tokens` 1 and `{"do_remote_decode": true}`. vLLM keeps the
  prompt's blocks after the request ends (until a decode engine has read them, or its lease
  runs out) and returns the params a decode engine needs (`remote_engine_id`,
  `remote_block_ids`, `remote_host`/`remote_port` of its side channel...). They ride,
  msgpack-encoded, in the handle's `ConnectorTransfer(connector="vllm-nixl", params=...)`,
  which only this module reads.
- The decode leg gets our usual request: the prompt plus the first token the prefill sampled
  (so sampling stays consistent: the decode continues from *that* token). vLLM's decode side
  wants the KV of every context token it is given, pulls them from the prefill engine, and
  always recomputes the last one. The prefill engine computed all but that last token, so its
  blocks hold everything the decode needs; the last token's slot is overwritten by the
  recompute. When the extra token starts a new block (prompt length a multiple of the block
  size) the decode side needs one more block than the prefill has: the last remote block id is
  repeated for it, whose copy lands only in slots the recompute rewrites or never reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from armature.errors import ArmatureError
from armature.protocols.kv_transfer import ConnectorTransfer, KvHandle, KvLayout

__all__ = [
    "NIXL_BACKEND",
    "PREFILL_PARAMS",
    "ConnectorParamsError",
    "decode_transfer_params",
    "to_kv_handle",
]


# the connector named in our handles, and the transfer backend in stats and the ready line
class ConnectorParamsError(ArmatureError, ValueError):
    """vLLM's transfer parameters cannot be used (missing fields, unreadable)."""


NIXL_BACKEND = "vllm-nixl"
PREFILL_PARAMS: Mapping[str, Any] = {"do_remote_decode": True}
_REQUIRED = ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")


def to_kv_handle(
    params: Mapping[str, Any], *, request_id: str, worker_id: str, layout: KvLayout, ttl_s: float
) -> KvHandle:
    """The handle a prefill leg returns for vLLM's `kv_transfer_params`. It names no block
    hashes: vLLM frees the blocks itself once a decode engine read them (or at its lease's
    end), so there is nothing for the frontend to release."""
    missing = [key for key in _REQUIRED if key not in params]
    if missing:
        raise ConnectorParamsError(f"vLLM returned transfer params without {', '.join(missing)}")
    return KvHandle(
        handle_id=request_id,
        worker_id=worker_id,
        layout=layout,
        seq_hashes=[],
        transfer=ConnectorTransfer(
            connector=NIXL_BACKEND, params=msgspec.msgpack.encode(dict(params))
        ),
        ttl_s=ttl_s,
    )


def decode_transfer_params(
    handle: KvHandle, *, num_context_tokens: int, block_size: int
) -> dict[str, Any] | None:
    """vLLM's `kv_transfer_params` for a decode leg whose context (prompt + the tokens already
    generated) is `num_context_tokens` long; None when the handle is not vLLM's (the decode
    then computes the prompt itself). ValueError for a handle that cannot be read."""
    transfer = handle.transfer
    if not isinstance(transfer, ConnectorTransfer) or transfer.connector != NIXL_BACKEND:
        return None
    try:
        params = msgspec.msgpack.decode(transfer.params)
    except msgspec.DecodeError as exc:
        raise ConnectorParamsError(f"unreadable vLLM transfer params: {exc}") from None
    if not isinstance(params, dict) or any(key not in params for key in _REQUIRED):
        raise ConnectorParamsError("vLLM transfer params lack the remote engine or its blocks")
    groups = params["remote_block_ids"]
    if groups and isinstance(groups[0], int):  # one KV cache group, written flat
        groups = [groups]
    num_blocks = -(-num_context_tokens // block_size)
    padded = []
    for group in groups:
        if not group:
            raise ConnectorParamsError("vLLM transfer params name no remote block")
        padded.append(list(group) + [group[-1]] * max(0, num_blocks - len(group)))
    return {
        **params,
        "remote_block_ids": padded,
        "do_remote_prefill": True,
        "do_remote_decode": False,
    }
