"""`armature serve --workers N` (N > 1): N `armature worker` processes and the frontend in
this process, on the embedded runtime (file discovery in a private directory, the TCP request
plane, the zmq event plane). The workers die with this process (SIGTERM on exit, and the
kernel's parent-death signal should it be killed outright); no registration outlives it."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from armature.cli_args import CliError, check_port_free

__all__ = ["serve_fleet"]

log = logging.getLogger("armature")

_ENGINE_FLAGS = (
    "engine",
    "speedup_ratio",
    "dtype",
    "device",
    "block_size",
    "kv_cache_bytes",
    "num_kv_blocks",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "seed",
    "cache_dir",
    "served_model_name",
    "log_level",
)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _worker_command(
    args: argparse.Namespace, model: Path, index: int, directory: Path, role: str
) -> list[str]:
    command = [sys.executable, "-m", "armature.cli", "worker", "--model", str(model)]
    for name in _ENGINE_FLAGS:
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    if args.no_prefix_caching:
        command.append("--no-prefix-caching")
    if args.enforce_eager:
        command.append("--enforce-eager")
    return [
        *command,
        "--role",
        role,
        "--kv-transfer-backends",
        ",".join(args.kv_transfer_backends),
        "--kv-pin-ttl-s",
        str(args.kv_pin_ttl_s),
        "--namespace",
        "serve",
        "--discovery",
        "file",
        "--discovery-dir",
        str(directory),
        "--request-plane",
        "tcp",
        "--event-plane",
        "zmq",
        "--instance-id",
        str(index),
    ]


def serve_fleet(args: argparse.Namespace) -> None:
    from armature.cli_frontend import run_frontend
    from armature.cli_serve_vllm import check_vllm_roles
    from armature.model.source import ModelSourceError, resolve_model

    check_vllm_roles(args)
    check_port_free(args.host, args.port)
    try:  # once, here: N workers must not convert the default model side by side
        resolved = resolve_model(
            args.model, cache_dir=Path(args.cache_dir) if args.cache_dir else None, log=log.info
        )
    except ModelSourceError as exc:
        raise CliError(str(exc)) from None
    if args.served_model_name is None:
        args.served_model_name = resolved.served_name
    directory = Path(tempfile.mkdtemp(prefix="armature-serve-"))
    # a fresh secret per run: only this frontend and its workers speak on their planes
    secret = secrets.token_hex(16)
    env = {**os.environ, "ARMATURE_PLANE_SECRET": secret}
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for index, role in enumerate(args.roles):
            command = _worker_command(args, resolved.path, index, directory, role)
            workers.append(subprocess.Popen(command, preexec_fn=_die_with_parent, env=env))
        frontend_args = argparse.Namespace(
            **vars(args),
            namespace="serve",
            discovery="file",
            discovery_dir=str(directory),
            request_plane="tcp",
            event_plane="zmq",
            wait_for_workers_s=600.0,
            min_workers=args.workers,
            worker_processes=workers,
            plane_secret=secret,
        )
        run_frontend(frontend_args)
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(directory, ignore_errors=True)
