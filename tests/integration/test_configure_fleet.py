"""`armature configure --save-dir`: the command lines it writes start a working mocker fleet.
The configuration is made for this machine (`--system local`, a small timing profile) and
the default model; the saved lines run unchanged but for the frontend's port."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet import Fleet, wait_until

from armature.cli.main import main
from profiles import write_small_profile
from servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVED = "configured"


def _configure(model_dir: Path, root: Path, mode: str) -> Path:
    profile = root / "measured.json"
    write_small_profile(profile, model=SERVED)
    save = root / "deployment"
    argv = ["configure", "--model", str(model_dir), "--system", "local"]
    argv += ["--timing-profile", str(profile), "--isl", "64", "--osl", "16", "--modes", mode]
    argv += ["--ttft-ms", "5000", "--itl-ms", "200", "--max-num-seqs", "4", "--finalists", "1"]
    argv += ["--served-model-name", SERVED, "--save-dir", str(save)]
    assert main(argv) == 0
    return save


def _lines(save: Path, command: str) -> list[list[str]]:
    lines = [shlex.split(line) for line in (save / "commands.sh").read_text().splitlines()]
    return [line[2:] for line in lines if line[:2] == ["armature", command]]


def _complete(url: str) -> dict[str, object]:
    body = {"model": SERVED, "prompt": "tell me a long story " * 8, "max_tokens": 6}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def test_the_saved_serve_line_serves(
    default_model_dir: Path, tmp_path: Path, serve_process: list[subprocess.Popen[bytes]]
) -> None:
    save = _configure(default_model_dir, tmp_path, "agg")
    [serve] = _lines(save, "serve")
    assert serve[:2] == ["--workers", "2"]  # one per "GPU" of the local system's default 2
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    command = [sys.executable, "-m", "armature.cli", "serve", *serve, "--port", str(port)]
    serve_process.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert serve_process[0].poll() is None, (tmp_path / "serve.log").read_text()
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, "serving")
    usage = _complete(url)["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == 6


def test_the_saved_frontend_and_worker_lines_serve_disaggregated(
    default_model_dir: Path, tmp_path: Path
) -> None:
    save = _configure(default_model_dir, tmp_path, "disagg")
    [frontend] = _lines(save, "frontend")
    workers = _lines(save, "worker")
    roles = sorted(w[w.index("--role") + 1] for w in workers)
    assert roles == ["decode", "prefill"]
    fleet = Fleet(default_model_dir, tmp_path, runtime_args=[], engine_args=[])
    try:
        for i, worker in enumerate(workers):
            fleet.start_worker(f"worker-{i}", extra=worker)
        url = fleet.start_frontend(extra=frontend)
        usage = _complete(url)["usage"]
        assert isinstance(usage, dict) and usage["completion_tokens"] == 6
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'armature_router_prefills_total{where="remote"} 1.0' in metrics
    finally:
        fleet.stop()
    fleet.assert_no_tracebacks()
