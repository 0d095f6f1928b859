"""The HTTP edge on a real server. API keys: missing, wrong and right keys over HTTP and
through the openai client; /health and /live stay open, /metrics as configured; keys from
flags, a key file and the environment; no key ever appears in the server's logs. Overload
control: 503s with Retry-After when every worker is busy, changed at runtime. A shutdown
whose grace ends with requests in flight ends them in OpenAI's error format."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from fleet import wait_until
from serve_process import parse_metrics, running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MOCKER = ["--engine", "mocker", "--speedup-ratio", "100", "--num-kv-blocks", "256"]
MOCKER += ["--served-model-name", "mock"]
BODY = {"model": "mock", "prompt": "hello there", "max_tokens": 3}


def test_keys_gate_the_api_but_not_health(default_model_dir: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# ops\nsk-from-file\n")
    args = [*MOCKER, "--api-key", "sk-flag-key", "--api-key-file", str(key_file)]
    os.environ["ARMATURE_API_KEYS"] = "sk-env-1,sk-env-2"
    try:
        with running_server(default_model_dir, tmp_path, args) as url:
            missing = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
            wrong = httpx.post(
                f"{url}/v1/completions",
                json=BODY,
                headers={"Authorization": "Bearer sk-nope"},
                timeout=30,
            )
            ok = [
                httpx.post(
                    f"{url}/v1/completions",
                    json=BODY,
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=30,
                )
                for key in ("sk-flag-key", "sk-from-file", "sk-env-2")
            ]
            models = httpx.get(f"{url}/v1/models", timeout=30)
            open_paths = [httpx.get(f"{url}{p}", timeout=30) for p in ("/health", "/live")]
            metrics = httpx.get(f"{url}/metrics", timeout=30)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-flag-key")
            completion = client.completions.create(model="mock", prompt="hi", max_tokens=2)
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong").models.list()
    finally:
        del os.environ["ARMATURE_API_KEYS"]
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in missing.json()["error"]["message"]
    assert wrong.status_code == 401
    assert wrong.json()["error"]["message"] == "Incorrect API key provided"
    assert [r.status_code for r in ok] == [200, 200, 200]
    assert models.status_code == 401
    assert [r.status_code for r in open_paths] == [200, 200]
    assert metrics.status_code == 200
    assert completion.usage is not None and completion.usage.completion_tokens == 2
    logs = (tmp_path / "stderr.log").read_text()
    for key in ("sk-flag-key", "sk-from-file", "sk-env-1", "sk-env-2", "sk-nope", "sk-wrong"):
        assert key not in logs


def test_protected_metrics(default_model_dir: Path, tmp_path: Path) -> None:
    args = [*MOCKER, "--api-key", "sk-m", "--protect-metrics"]
    with running_server(default_model_dir, tmp_path, args) as url:
        assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401
        authorized = {"Authorization": "Bearer sk-m"}
        assert httpx.get(f"{url}/metrics", headers=authorized, timeout=30).status_code == 200
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200


def test_overload_control_over_http(default_model_dir: Path, tmp_path: Path) -> None:
    """Every worker busy (KV threshold 0): no queue room -> a fast 503 with Retry-After; a
    short queue -> 503 after the timeout; thresholds cleared at runtime -> served."""
    args = [*MOCKER, "--busy-kv-usage", "0", "--max-queued-requests", "0"]
    with running_server(default_model_dir, tmp_path, args) as url:
        full = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
        update = {"busy_kv_usage": 0.0, "max_queued_requests": 4, "queue_timeout_s": 0.3}
        assert httpx.post(f"{url}/admin/overload", json=update, timeout=30).status_code == 200
        late = httpx.post(f"{url}/v1/completions", json={**BODY, "priority": -3}, timeout=30)
        bad = httpx.post(f"{url}/admin/overload", json={"busy_kv_usage": 2}, timeout=30)
        cleared = httpx.post(f"{url}/admin/overload", json={"busy_kv_usage": None}, timeout=30)
        served = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert full.status_code == 503 and full.headers["retry-after"] == "5"
    assert full.json()["error"]["code"] == "overloaded"
    assert full.json()["error"]["type"] == "service_unavailable"
    assert late.status_code == 503 and late.json()["error"]["code"] == "queue_timeout"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "busy_kv_usage"
    assert cleared.json()["busy_kv_usage"] is None
    assert served.status_code == 200
    assert 'armature_requests_total{endpoint="completions",status="503"} 2.0' in metrics
    assert "armature_requests_queued 0.0" in metrics


def queued(url: str) -> int:
    return int(httpx.get(f"{url}/admin/overload", timeout=30).json()["queued"])


def test_a_queued_clients_leaving_frees_its_place_and_a_wait_counts_in_its_ttft(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """A client that leaves while its request waits for a busy fleet gives its place up at
    once (it kept it until the queue's timeout, and live clients got 503s), counted as 499;
    a request that waited counts the wait in its TTFT and its SLO judgement (both began
    after the queue)."""
    args = [*MOCKER, "--busy-kv-usage", "0", "--max-queued-requests", "1"]
    args += ["--queue-timeout-s", "600", "--slo-ttft-ms", "500"]
    with running_server(default_model_dir, tmp_path, args) as url:
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps(BODY).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as leaving:
            leaving.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            wait_until(lambda: queued(url) == 1, "the request queued")
        wait_until(lambda: queued(url) == 0, "its place given up")
        # a request that waits, then is served once the thresholds are cleared
        answer: list[httpx.Response] = []
        waiting = threading.Thread(
            target=lambda: answer.append(
                httpx.post(f"{url}/v1/completions", json=BODY, timeout=120)
            )
        )
        waiting.start()
        wait_until(lambda: queued(url) == 1, "the second request queued")
        queued_s = time.monotonic()
        wait_until(lambda: time.monotonic() - queued_s > 1.0, "a second in the queue")
        cleared = httpx.post(f"{url}/admin/overload", json={"busy_kv_usage": None}, timeout=30)
        waited_s = time.monotonic() - queued_s
        waiting.join(120)
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    assert cleared.status_code == 200 and answer[0].status_code == 200
    assert metrics['armature_requests_total{endpoint="completions",status="499"}'] == 1
    assert metrics["armature_time_to_first_token_seconds_count"] == 1
    assert metrics["armature_time_to_first_token_seconds_sum"] >= waited_s
    assert metrics["armature_e2e_request_latency_seconds_sum"] >= waited_s
    assert metrics['armature_slo_requests_total{result="missed"}'] == 1


def test_a_shutdown_grace_that_ends_answers_what_is_in_flight(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM with a stream and a whole request in flight, longer than --shutdown-grace-s:
    the stream ended with an error event and [DONE] (it was cut, neither), the whole request
    got a 503 in OpenAI's format (an empty 499, counted as the client's leaving)."""
    slow = ["--engine", "mocker", "--num-kv-blocks", "4096", "--served-model-name", "mock"]
    args = [*slow, "--shutdown-grace-s", "2", "--max-model-len", "8192", "--max-num-seqs", "2"]
    long_body = {"model": "mock", "prompt": "hello", "max_tokens": 6000, "ignore_eos": True}
    started: list[subprocess.Popen[bytes]] = []
    lines: list[str] = []
    queued_lines: list[str] = []  # a third request, queued behind the two (no output yet)
    whole: list[httpx.Response] = []
    with running_server(default_model_dir, tmp_path, args, started=started) as url:
        first_event = threading.Event()

        def stream() -> None:
            body = {**long_body, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    first_event.set()

        def complete() -> None:
            whole.append(httpx.post(f"{url}/v1/completions", json=long_body, timeout=60))

        def queued() -> None:
            body = {**long_body, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                queued_lines.extend(r.iter_lines())

        threads = [threading.Thread(target=stream), threading.Thread(target=complete)]
        for thread in threads:
            thread.start()
        assert first_event.wait(60)
        deadline_s = time.monotonic() + 60
        while "armature_requests_in_flight 2.0" not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline_s, "both requests in flight"
            time.sleep(0.05)
        threads.append(threading.Thread(target=queued))
        threads[-1].start()
        while "armature_requests_in_flight 3.0" not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline_s, "the third request in flight"
            time.sleep(0.05)
        started[0].send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(60)
        # drained, then uvicorn raises the signal it caught again: killed by it, as asked
        assert started[0].wait(60) == -signal.SIGTERM
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["type"], error["message"]) == (
        "service_unavailable",
        "the server is shutting down and its grace ended: retry the request",
    )
    assert len(events) > 3  # tokens went out before it
    [response] = whole
    assert response.status_code == 503
    assert "the server is shutting down" in response.json()["error"]["message"]
    # the queued stream had nothing yet: woken, it ends the same way (it was cut)
    queued_events = [
        line.removeprefix("data: ") for line in queued_lines if line.startswith("data: ")
    ]
    assert queued_events[-1] == "[DONE]"
    assert json.loads(queued_events[-2])["error"]["type"] == "service_unavailable"
