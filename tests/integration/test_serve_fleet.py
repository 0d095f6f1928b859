"""`armature serve --workers N` as a frontend with N worker processes: serving works (and
refuses what the workers' cards say they cannot do), and stopping it (SIGTERM, or even
SIGKILL) leaves no worker process and no registration.

Each serve here gets its own $XDG_RUNTIME_DIR under the test's tmp_path, so its private
directory is the only one the test looks at: what other runs left elsewhere cannot matter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serve_process import _free_port, _wait_healthy


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def start(
    model_dir: Path, log: Path, extra: tuple[str, ...] = (), workers: int = 2
) -> tuple[subprocess.Popen[bytes], str]:
    """Serve with `workers` mocker workers, logging to `log`; its private directory lies
    under `runtime_dir(log)`."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "armature.cli",
        "serve",
        "--model",
        str(model_dir),
        "--engine",
        "mocker",
        "--workers",
        str(workers),
        "--num-kv-blocks",
        "256",
        "--speedup-ratio",
        "100",
        "--port",
        str(port),
        *extra,
    ]
    with open(log, "wb") as out:
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir(log))}
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(proc, url, log)
    return proc, url


def runtime_dir(log: Path) -> Path:
    """The $XDG_RUNTIME_DIR of the serve that logs to `log`: its own, beside the log."""
    path = log.parent / "run"
    path.mkdir(exist_ok=True)
    return path


def serve_dirs(log: Path) -> list[Path]:
    return sorted(runtime_dir(log).glob("armature-serve-*"))


def workers_of(proc: subprocess.Popen[bytes], count: int = 2) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = children(proc.pid)
        if len(kids) == count:
            return kids
        time.sleep(0.1)
    pytest.fail(f"expected {count} worker processes, found {children(proc.pid)}")


def complete(url: str) -> tuple[str, httpx.Response]:
    """The served model's name, and its answer to a 3-token completion of "Hi there"."""
    served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": served, "prompt": "Hi there", "max_tokens": 3},
        timeout=30,
    )
    return served, response


@pytest.mark.integration
def assert_guides_refused(url: str, served: str) -> None:
    """The workers' cards say their (mocker) engine enforces no guides: the frontend refuses
    structured output and forced tool calls with a 400 naming the field and the engine."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for fields, param in (
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [tool], "tool_choice": "required"}, "tool_choice"),
    ):
        chat = {"model": served, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        body = {**chat, **fields}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param, error
        assert f"{param} needs structured output" in error["message"]
        assert "the mocker engine serving this model does not enforce" in error["message"]


@pytest.mark.parametrize("how", ["term", "kill", "kill-all"])
def test_serve_workers_are_processes_that_end_with_it(
    how: str, default_model_dir: Path, tmp_path: Path
) -> None:
    """term: a clean stop removes its private directory. kill: the serve killed outright, its
    workers (SIGTERM from the kernel as their parent dies) remove it as they stop. kill-all:
    the workers killed outright too, nothing ran to remove it: the next serve to start does."""
    log = tmp_path / "serve.log"
    proc, url = start(default_model_dir, log)
    try:
        kids = workers_of(proc)
        [directory] = serve_dirs(log)
        assert directory.name.startswith(f"armature-serve-{proc.pid}-")
        assert f"the workers meet in {directory}" in log.read_text()
        served, response = complete(url)
        assert response.status_code == 200, response.text
        assert_guides_refused(url, served)
        if how == "kill-all":
            for kid in kids:
                os.kill(kid, signal.SIGKILL)
        sig = signal.SIGTERM if how == "term" else signal.SIGKILL
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig  # ended by the signal, as uvicorn leaves it
        deadline = time.monotonic() + 60
        while any(alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(k) for k in kids), "orphaned worker processes"
        if how == "kill-all":  # nothing ran to remove it
            assert serve_dirs(log) == [directory]
        else:  # the serve, or its last worker to stop, removed it
            assert serve_dirs(log) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if how == "term":
        assert "Traceback" not in log.read_text(errors="replace")
    if how != "kill-all":
        return
    after, _ = start(default_model_dir, tmp_path / "after.log")
    try:
        [own] = serve_dirs(log)  # the same runtime directory: the log's parent
        assert own.name.startswith(f"armature-serve-{after.pid}-")
        assert not directory.exists()
    finally:
        after.terminate()
        after.wait(timeout=30)
    assert serve_dirs(log) == []


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@pytest.mark.integration
def test_serve_forwards_worker_flags_to_the_worker_processes(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """`serve --workers 2 --max-num-seqs 7 --num-kv-blocks 999 --engine mocker`: each worker's
    own command line carries both flags, and the workers run with them."""
    extra = ("--max-num-seqs", "7", "--num-kv-blocks", "999")
    proc, url = start(default_model_dir, tmp_path / "serve.log", extra)
    try:
        kids = workers_of(proc)
        for kid in kids:
            argv = cmdline(kid)
            assert argv[argv.index("--max-num-seqs") + 1] == "7", argv
            assert argv[argv.index("--num-kv-blocks") + 1] == "999", argv
            assert argv[argv.index("--engine") + 1] == "mocker", argv
            assert "--plane-secret" not in argv  # the secret travels in the environment
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        totals = [
            line
            for line in metrics.splitlines()
            if line.startswith("armature_worker_kv_capacity_blocks{")
        ]
        assert len(totals) == 2 and all(line.endswith(" 999.0") for line in totals), totals
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.integration
@pytest.mark.parametrize("as_process", [True, False])
def test_a_lone_worker_runs_as_a_process_with_worker_processes(
    as_process: bool, default_model_dir: Path, tmp_path: Path
) -> None:
    """`serve --workers 1 --worker-processes`: the one worker is an `armature worker` child
    (its engine on an interpreter of its own) serving the requests; without the flag the
    lone worker runs in the serve's process and there is no child."""
    extra = ("--worker-processes",) if as_process else ()
    proc, url = start(default_model_dir, tmp_path / "serve.log", extra, workers=1)
    try:
        _, response = complete(url)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 3
        if as_process:
            [kid] = workers_of(proc, 1)
            assert cmdline(kid)[1:4] == ["-m", "armature.cli", "worker"], cmdline(kid)
        else:
            assert children(proc.pid) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
