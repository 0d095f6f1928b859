"""Lower KV tiers over HTTP with the default model (float32, greedy): a long prompt evicted from
a small G1 comes back from host memory; a server killed and restarted on the same disk
directory serves its blocks again; a shared S3 store killed mid-run and a disk that refuses
writes only turn the tier's writes off, and serving goes on with the same text."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve_process import running_server

from servers import MotoS3, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BLOCK = 16
BASE = ["--dtype", "float32", "--max-num-batched-tokens", "512"]
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def long_prompt(topic: str) -> str:
    """About 1,300 tokens of text no other prompt here shares."""
    lines = [
        f"Note {i} on {topic}: the value of {topic} item {i} is {i * 7 % 101}." for i in range(90)
    ]
    return "\n".join(lines) + f"\nSummarize the notes on {topic} in one sentence."


def complete(url: str, prompt: str) -> tuple[str, int, int]:
    """Greedy text, prompt tokens and cached prompt tokens."""
    body = {"model": model_name(url), "prompt": prompt, "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    usage = out["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return out["choices"][0]["text"], usage["prompt_tokens"], cached


def model_name(url: str) -> str:
    return str(httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"])


def assert_mostly_cached(num_prompt: int, num_cached: int) -> None:
    full_blocks_tokens = (num_prompt - 1) // BLOCK * BLOCK
    assert num_prompt >= 1024
    assert num_cached >= 0.9 * full_blocks_tokens, (num_prompt, num_cached)


def test_a_long_prompt_evicted_from_g1_comes_back_from_host(
    default_model_dir: Path, tmp_path: Path
) -> None:
    # G1 holds about 1.5 prompts: the second and third evict the first
    args = [*BASE, "--num-kv-blocks", "130", "--kv-host-blocks", "512"]
    with running_server(default_model_dir, tmp_path, args) as url:
        a = long_prompt("apples")
        first, num_prompt, cached = complete(url, a)
        assert cached == 0
        complete(url, long_prompt("bridges"))
        complete(url, long_prompt("comets"))
        second, num_prompt_again, cached = complete(url, a)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert num_prompt_again == num_prompt
    assert_mostly_cached(num_prompt, cached)
    assert second == first
    # the in-process engine's tiers on the serve's own /metrics (no worker process serves
    # them: they were nowhere)
    offloaded = sample(metrics, 'armature_worker_kv_offloaded_blocks_total{path="g1->g2"}')
    onboarded = sample(metrics, 'armature_worker_kv_onboarded_blocks_total{path="g2->g1"}')
    assert offloaded > 0 and 0 < onboarded <= cached // BLOCK
    assert sample(metrics, 'armature_worker_kv_tier_capacity_blocks{tier="host"}') == 512


def sample(metrics: str, series: str) -> float:
    [line] = [line for line in metrics.splitlines() if line.startswith(series + " ")]
    return float(line.split()[-1])


def _wait_for_files(directory: Path, num_files: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(list(directory.rglob("*.kvb"))) >= num_files:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {num_files} blocks landed in {directory}")


def test_a_server_killed_and_restarted_on_its_disk_dir_serves_its_blocks(
    default_model_dir: Path, tmp_path: Path
) -> None:
    disk = tmp_path / "kv"
    args = [*BASE, "--kv-disk-dir", str(disk), "--kv-disk-blocks", "1024"]
    args += ["--kv-offload", "write-through"]
    a = long_prompt("apples")
    port = free_port()
    command = [sys.executable, "-m", "armature.cli", "serve", "--model", str(default_model_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), *args]
    with open(tmp_path / "first.log", "wb") as log:
        env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # its fleet's directory: here
        proc = subprocess.Popen(command, stdout=log, stderr=log, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        first, num_prompt, _ = complete(url, a)
        _wait_for_files(disk, (num_prompt - 1) // BLOCK)  # every full prompt block is written
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (tmp_path / "second").mkdir()
    with running_server(default_model_dir, tmp_path / "second", args) as url:
        second, _, cached = complete(url, a)
    assert_mostly_cached(num_prompt, cached)
    assert second == first
    log = (tmp_path / "second" / "stderr.log").read_text()
    assert re.search(r"KV disk tier: found \d+ blocks", log), log


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited at start"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become healthy")


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[MotoS3]:
    server = MotoS3(tmp_path / "moto")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_serving_goes_on_when_the_shared_store_dies_mid_run(
    default_model_dir: Path, tmp_path: Path, moto: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    from armature.tiers.s3_store import make_s3_client

    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    make_s3_client(moto.url).create_bucket(Bucket="kv-fleet")
    args = [*BASE, "--num-kv-blocks", "130", "--kv-remote", "s3://kv-fleet/serve"]
    args += ["--kv-remote-endpoint", moto.url, "--kv-remote-offload", "all"]
    args += ["--kv-offload", "write-through"]
    (tmp_path / "serve").mkdir()
    with running_server(default_model_dir, tmp_path / "serve", args, env=S3_ENV) as url:
        first, _, _ = complete(url, long_prompt("apples"))
        body = {"model": model_name(url), "prompt": long_prompt("bridges"), "max_tokens": 40}
        body |= {"temperature": 0, "stream": True, "min_tokens": 40}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as stream:
            chunks = stream.iter_lines()
            assert any(line.startswith("data: {") for line in chunks)  # a token is out
            moto.kill()  # the store dies while this request is being served
            rest = [line for line in chunks if line]
        assert rest[-1] == "data: [DONE]"
        again, _, _ = complete(url, long_prompt("apples"))
        complete(url, long_prompt("comets"))  # its blocks' writes fail
    assert again == first
    log = (tmp_path / "serve" / "stderr.log").read_text()
    assert "KV external tier unavailable: its writes are off" in log, log


def _small_files_only() -> None:
    """In the server process: any file write beyond 64 KiB fails with EFBIG (a disk full for
    KV blocks, which are larger; the server's own logs stay far below it)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def test_serving_goes_on_when_the_disk_refuses_writes(
    default_model_dir: Path, tmp_path: Path
) -> None:
    args = [*BASE, "--num-kv-blocks", "130", "--kv-disk-dir", str(tmp_path / "kv")]
    args += ["--kv-disk-blocks", "1024", "--kv-offload", "write-through"]
    (tmp_path / "serve").mkdir()
    with running_server(
        default_model_dir, tmp_path / "serve", args, preexec_fn=_small_files_only
    ) as url:
        first, _, _ = complete(url, long_prompt("apples"))
        again, _, _ = complete(url, long_prompt("apples"))
    assert again == first
    log = (tmp_path / "serve" / "stderr.log").read_text()
    assert "KV disk tier full: its writes are off" in log, log
    assert not list((tmp_path / "kv").rglob("*.kvb"))
