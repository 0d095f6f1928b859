"""Frontend replicas in front of one fleet, as behind a load balancer: standalone `armature
frontend` processes over two mocker worker processes (file discovery, TCP and zmq planes),
and `armature serve --frontends 2` on one port.

Every wait is for a state (a replica's /metrics: its view of the in-flight load, by the
frontend that routed it; its prefix index), never for a time."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet import Fleet, Load, decisions, wait_until
from serve_process import SERVED_MODEL_NAME, parse_metrics, running_server

from profiles import write_small_profile

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MOCKER_ARGS = [
    "--engine",
    "mocker",
    "--num-kv-blocks",
    "4096",
    "--max-model-len",
    "8192",
    "--served-model-name",
    SERVED_MODEL_NAME,
]
# a replica's load expires 1.5 s after its last report; its card would stay 60 s
REPLICA_ARGS = ["--share-load-ttl-s", "1.5", "--lease-ttl-s", "60"]
HOT = "You are the replica test suite's assistant; answer briefly and exactly. " * 8
# a held request stays in flight until its stream is closed: long enough for a replica to
# start on a loaded machine while C's are held (at 3000 tokens they finished first there, and
# the joining replica never counted them); prompt and output within --max-model-len 8192
LONG_TOKENS = 7000


@pytest.fixture(scope="module")
def fleet(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(default_model_dir, tmp_path_factory.mktemp("replicas"), engine_args=MOCKER_ARGS)
    try:
        f.start_worker("worker-a")
        f.start_worker("worker-b")
        yield f
    finally:
        f.stop()
    f.assert_no_tracebacks()


@pytest.fixture(scope="module")
def replicas(fleet: Fleet) -> tuple[str, str]:
    """Two replicas that live for the module (the kill tests start their own)."""
    a, _ = fleet.start_frontend_process("frontend-a", extra=REPLICA_ARGS)
    b, _ = fleet.start_frontend_process("frontend-b", extra=REPLICA_ARGS)
    wait_until(lambda: peers(a) == peers(b) == 1, "the replicas found each other")
    return a, b


def metrics(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)


def peers(url: str) -> int:
    return int(metrics(url).get("armature_frontend_peers", 0))


def in_flight(url: str, by: str | None = None, what: str = "requests") -> int:
    """The replica's view of the requests (or prefill tokens) in flight on every worker,
    routed by it (`this`), by its peers (`peers`), or both."""
    name = f"armature_router_{what}_in_flight{{"
    return int(
        sum(
            v
            for k, v in metrics(url).items()
            if k.startswith(name) and (by is None or f'by="{by}"' in k)
        )
    )


def index_blocks(url: str) -> int:
    return int(metrics(url)["armature_router_index_blocks"])


def complete(url: str, prompt: str, max_tokens: int = 8) -> str:
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens}
    response = httpx.post(f"{url}/v1/completions", json={**body, "ignore_eos": True}, timeout=120)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


class HeldStream:
    """A streamed completion kept in flight in a thread until `close`; `outcome` says how
    it ended: "done" ([DONE] after a finish reason), "closed" (by us), or the exception."""

    def __init__(self, url: str, prompt: str, max_tokens: int = LONG_TOKENS):
        self.url = url
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.first_token = threading.Event()
        self._closing = threading.Event()
        self.outcome: str | BaseException | None = None
        self.finish_reason: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/completions", json=body, timeout=120
            ) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if self._closing.is_set():
                        self.outcome = "closed"
                        return
                    if line == "data: [DONE]":
                        self.outcome = "done"
                        return
                    found = re.search(r'"finish_reason":\s*"(\w+)"', line)
                    if found:
                        self.finish_reason = found.group(1)
                    if line.startswith("data: "):
                        self.first_token.set()
            self.outcome = AssertionError("the stream ended without [DONE]")
        except BaseException as exc:
            self.outcome = exc
        finally:
            self.first_token.set()

    def wait_first_token(self) -> None:
        wait_until(self.first_token.is_set, f"a first token from {self.url}")
        assert self.outcome is None, self.outcome

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=120)

    def join(self) -> None:
        self._thread.join(timeout=120)


def test_a_shared_prefix_lands_on_one_worker_whichever_replica_takes_it(
    replicas: tuple[str, str],
) -> None:
    a, b = replicas
    prefix = "Shared prefix for the affinity test: " + HOT
    first = {**decisions(a)}
    complete(a, prefix + "first question")
    (warm,) = [w for w, n in decisions(a).items() if n != first.get(w, 0)]
    # B reads the same workers' KV events: its index holds what A's does
    wait_until(lambda: index_blocks(b) == index_blocks(a) > 0, "B's index caught up")
    before = Counter(decisions(a)) + Counter(decisions(b))
    for i in range(8):
        complete((a, b)[i % 2], prefix + f"follow-up number {i}")
    after = Counter(decisions(a)) + Counter(decisions(b))
    assert after - before == Counter({warm: 8})


def _staged_run(plan: list[tuple[str, str]], replicas: tuple[str, ...]) -> Counter[str]:
    """Send `plan` (replica url, prompt) one request at a time, each held in flight, the next
    only once every replica counts every earlier one with its prefill done: each routing
    decision sees exactly the load one frontend would. Requests per worker."""
    before = sum((Counter(decisions(r)) for r in replicas), Counter[str]())
    held: list[HeldStream] = []
    try:
        for n, (url, prompt) in enumerate(plan):
            held.append(HeldStream(url, prompt))
            held[-1].wait_first_token()
            for r in replicas:
                wait_until(
                    lambda r=r, n=n: (
                        in_flight(r) == n + 1  # type: ignore[misc]
                        and in_flight(r, what="prefill_tokens") == 0
                    ),
                    f"{r} counting {n + 1} requests in flight",
                )
        after = sum((Counter(decisions(r)) for r in replicas), Counter[str]())
    finally:
        for stream in held:
            stream.close()
    assert all(s.outcome == "closed" for s in held), [s.outcome for s in held]
    for r in replicas:
        wait_until(lambda r=r: in_flight(r) == 0, f"{r} counting nothing in flight")
    return after - before


def _skew(per_worker: Counter[str], workers: int = 2) -> float:
    return max(per_worker.values()) / (sum(per_worker.values()) / workers)


def test_two_replicas_spread_load_like_one_frontend(replicas: tuple[str, str]) -> None:
    """The same requests, long and short prompts sharing a hot prefix, each held in flight:
    through replica A alone, then alternately through A and B. First a warm-up that puts the
    hot prefix on both workers, so that both runs start from the same cache."""
    a, b = replicas
    hot = "Skew test system prompt: " + HOT

    def plan(urls: tuple[str, ...], tag: str) -> list[tuple[str, str]]:
        long_tail, short_tail = " context" * 200, ""
        return [
            (urls[i % len(urls)], hot + f"{tag} {i}" + (long_tail if i % 2 == 0 else short_tail))
            for i in range(10)
        ]

    warm = _staged_run(plan((a,), "warm-up"), (a, b))
    assert len(warm) == 2, warm  # the hot prefix spilled over: both workers cache it
    one = _staged_run(plan((a,), "one frontend"), (a, b))
    two = _staged_run(plan((a, b), "two replicas"), (a, b))
    assert sum(one.values()) == sum(two.values()) == 10
    assert abs(_skew(two) - _skew(one)) <= 0.1 * _skew(one), (one, two)


def test_the_planner_reads_every_replica_at_its_own_address(
    fleet: Fleet, replicas: tuple[str, str], tmp_path: Path
) -> None:
    """A planner given no frontend url reads each replica's /metrics at the address its card
    names, and sums them: it counts every request, whichever replica served it (through one
    replica's port it counted that one's). Before the kill tests: a killed replica's card
    stays listed until its lease ends, and the planner skips its ticks meanwhile."""
    a, b = replicas
    write_small_profile(tmp_path / "profile.json", model=SERVED_MODEL_NAME)
    args = ["planner", "--dry-run", "--planner-mode", "agg", "--load-interval-s", "0.2"]
    args += ["--ttft-ms", "3000", "--itl-ms", "500", "--metrics-port", "0"]
    args += ["--performance-model", str(tmp_path / "profile.json"), *fleet.runtime_args()]
    planner = fleet._spawn("planner-replicas", args)
    try:
        fleet.wait_for_log("planner-replicas", "planner ready", planner)
        log = fleet.log_text("planner-replicas")
        assert "the frontends of namespace 'armature' in discovery (2 now)" in log, log
        found = re.search(r"metrics (http://\S+/metrics)", log)
        assert found, log

        def read() -> dict[str, float]:
            return parse_metrics(httpx.get(found.group(1), timeout=10).text)

        wait_until(lambda: read().get("armature_planner_frontends") == 2, "a tick read both")
        for i, url in enumerate([a, a, a, b, b]):
            complete(url, f"planner count {i}")
        wait_until(
            lambda: read()["armature_planner_observed_requests_total"] >= 5,
            "the planner counting the 5 requests",
        )
        # every one, once: no window counted twice, none left out
        assert read()["armature_planner_observed_requests_total"] == 5
    finally:
        planner.send_signal(signal.SIGTERM)
        planner.wait(timeout=30)
    assert planner.returncode == 0, fleet.log_text("planner-replicas")


def test_an_overload_change_on_one_replica_reaches_the_others(
    fleet: Fleet, replicas: tuple[str, str]
) -> None:
    """POST /admin/overload on one replica changes every replica (through a Service it changed
    whichever one the connection reached); with x-armature-replica-only, that one alone."""
    a, b = replicas
    before = httpx.get(f"{b}/admin/overload", timeout=10).json()
    changed = httpx.post(f"{a}/admin/overload", json={"max_queued_requests": 17}, timeout=30)
    assert changed.status_code == 200, changed.text
    b_name = re.search(r"(frontend-[0-9a-f]+) shares its load", fleet.log_text("frontend-b"))
    assert b_name
    assert changed.json()["peers"] == {b_name.group(1): "changed"}
    assert httpx.get(f"{b}/admin/overload", timeout=10).json()["max_queued_requests"] == 17
    alone = httpx.post(
        f"{a}/admin/overload",
        json={"max_queued_requests": 5},
        headers={"x-armature-replica-only": "1"},
        timeout=30,
    )
    assert alone.json()["max_queued_requests"] == 5 and alone.json()["peers"] == {}
    assert httpx.get(f"{b}/admin/overload", timeout=10).json()["max_queued_requests"] == 17
    restored = {"max_queued_requests": before["max_queued_requests"]}
    assert httpx.post(f"{a}/admin/overload", json=restored, timeout=30).status_code == 200
    assert httpx.get(f"{b}/admin/overload", timeout=10).json() == before


def test_a_replicas_own_address_answers_the_planner_while_it_drains(fleet: Fleet) -> None:
    """A replica's own address serves what the planner and the other replicas read (its
    /metrics, /admin/overload), not the API clients use; it answers until the replica's drain
    has ended, where the planner skipped every tick of the drain (it read a closed port)."""
    url, proc = fleet.start_frontend_process("frontend-f", extra=REPLICA_ARGS)
    found = re.search(r"this replica alone: (http://\S+)\)", fleet.log_text("frontend-f"))
    assert found
    own = found.group(1)
    assert httpx.get(f"{own}/metrics", timeout=10).status_code == 200
    assert httpx.get(f"{own}/admin/overload", timeout=10).status_code == 200
    body = {"model": SERVED_MODEL_NAME, "prompt": "not here", "max_tokens": 2}
    assert httpx.post(f"{own}/v1/completions", json=body, timeout=10).status_code == 404
    held = HeldStream(url, HOT + "held while its frontend drains")
    held.wait_first_token()
    proc.send_signal(signal.SIGTERM)

    def refused() -> bool:
        try:
            httpx.get(f"{url}/health", timeout=10)
        except httpx.ConnectError:
            return True
        return False

    wait_until(refused, "the draining replica's port closed")
    draining = parse_metrics(httpx.get(f"{own}/metrics", timeout=10).text)
    assert draining["armature_requests_in_flight"] == 1  # the held stream, still going
    held.close()
    assert proc.wait(timeout=60) == -signal.SIGTERM  # drained, it ends by the signal it got
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{own}/metrics", timeout=10)


def test_a_stalled_client_of_the_own_address_does_not_keep_the_replica_alive(
    fleet: Fleet,
) -> None:
    """A client that sent half a request to the replica's own address and went silent: the
    replica waited for it for ever after SIGTERM (that server had no grace limit)."""
    _, proc = fleet.start_frontend_process(
        "frontend-g", extra=[*REPLICA_ARGS, "--shutdown-grace-s", "2"]
    )
    found = re.search(r"this replica alone: http://([\d.]+):(\d+)\)", fleet.log_text("frontend-g"))
    assert found
    with socket.create_connection((found.group(1), int(found.group(2))), timeout=10) as stalled:
        stalled.sendall(
            b"POST /admin/overload HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        # one event loop serves the address: once a later connection is answered, the
        # stalled one's bytes (sent before) have been read, and its request has begun
        own = f"http://{found.group(1)}:{found.group(2)}"
        assert httpx.get(f"{own}/live", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM


def test_a_joining_replica_gets_the_load_in_flight_and_a_killed_ones_expires(
    fleet: Fleet, replicas: tuple[str, str]
) -> None:
    _, b = replicas
    c, proc_c = fleet.start_frontend_process("frontend-c", extra=REPLICA_ARGS)
    held = [HeldStream(c, HOT + f"held {i}") for i in range(4)]
    for stream in held:
        stream.wait_first_token()
    assert in_flight(c, by="this") == 4
    wait_until(lambda: in_flight(b, by="peers") == 4, "B counting C's requests")
    # a replica that joins now gets C's current load (C publishes when it hears from it)
    d, proc_d = fleet.start_frontend_process("frontend-d", extra=REPLICA_ARGS)
    wait_until(lambda: in_flight(d, by="peers") == 4, "D, just joined, counting C's requests")
    assert in_flight(d, by="this") == 0
    proc_c.send_signal(signal.SIGKILL)  # no clean exit: its card stays in discovery
    proc_c.wait()
    for stream in held:
        stream.join()
        # its clients see the connection break: an error, never a finished answer
        assert isinstance(stream.outcome, httpx.TransportError), stream.outcome
        assert stream.finish_reason is None
    wait_until(lambda: in_flight(b) == in_flight(d) == 0, "C's load expired at B and D")
    # expired for want of reports: its card is still in discovery (its lease lasts 60 s)
    found = re.search(r"frontend-([0-9a-f]+) shares its load", fleet.log_text("frontend-c"))
    assert found
    assert f"instances/armature/frontend/load/{found.group(1)}" in fleet.registered_keys()
    proc_d.send_signal(signal.SIGTERM)
    proc_d.wait(timeout=30)


def test_killing_a_replica_mid_load_loses_none_of_the_others_requests(
    fleet: Fleet, replicas: tuple[str, str]
) -> None:
    _, b = replicas
    e, proc_e = fleet.start_frontend_process("frontend-e", extra=REPLICA_ARGS)
    wait_until(lambda: peers(e) >= 1, "E found the other replicas")

    def send_b(i: int) -> tuple[str, int]:
        return _answer(b, i)

    def send_e(i: int) -> tuple[str, int] | str:
        try:
            return _answer(e, i)
        except httpx.TransportError as exc:
            return type(exc).__name__

    load_b = Load(send_b, num_clients=4, min_requests=8)
    load_e = Load(send_e, num_clients=4, min_requests=8)
    # both replicas have requests in flight, and each counts the other's
    wait_until(
        lambda: in_flight(e, by="this") > 0 and in_flight(b, by="peers") > 0,
        "E's requests in flight, counted by B",
    )
    wait_until(
        lambda: in_flight(b, by="this") > 0 and in_flight(e, by="peers") > 0,
        "B's requests in flight, counted by E",
    )
    proc_e.send_signal(signal.SIGKILL)
    proc_e.wait()
    results_e = load_e.finish()
    results_b = load_b.finish()
    assert results_b and all(r == ("length", 24) for r in results_b), results_b
    errors = [r for r in results_e if isinstance(r, str)]
    # its clients in flight at the kill saw their connections break; later ones, refused
    assert {"RemoteProtocolError", "ReadError"} & set(errors), results_e
    assert set(errors) <= {"RemoteProtocolError", "ReadError", "ConnectError"}, errors
    assert all(r == ("length", 24) for r in results_e if not isinstance(r, str))
    wait_until(lambda: in_flight(b, by="peers") == 0, "E's load expired at B")


def _answer(url: str, i: int) -> tuple[str, int]:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": HOT + f"load request {i}",
        "max_tokens": 24,
        "ignore_eos": True,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    data = response.json()
    return data["choices"][0]["finish_reason"], data["usage"]["completion_tokens"]


def test_serve_runs_replicas_on_one_port(default_model_dir: Path, tmp_path: Path) -> None:
    """`serve --frontends 2`: two frontend processes on one port, the kernel spreading the
    connections; both route, and each counts the other's requests. Both judge requests by
    serve's --slo-* targets (serve's frontend over worker processes left them out)."""
    args = ["--engine", "mocker", "--workers", "2", "--frontends", "2", "--router", "kv"]
    args += ["--served-model-name", SERVED_MODEL_NAME, "--slo-ttft-ms", "60000"]
    with running_server(default_model_dir, tmp_path, args) as url:
        wait_until(lambda: peers(url) == 1, "a replica that hears from the other")
        for i in range(24):
            complete(url, f"request {i} to whichever replica the kernel picks")
        # each scrape lands on either replica: both routed some of the requests
        scrapes = [metrics(url) for _ in range(40)]
        routed = {sum(decisions(url).values()) for _ in range(40)}
        assert 0 not in routed and 24 not in routed, routed
        assert sum(routed) == 24 if len(routed) == 2 else routed == {12}, routed
        met = {m.get('armature_slo_requests_total{result="met"}') for m in scrapes}
        assert None not in met and 0 not in met, met
        assert sum(met) == 24 if len(met) == 2 else met == {12}, met


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    except ConnectionRefusedError:
        return True
    return False


def test_serve_stops_every_replica_listening_at_sigterm_and_drains_them_all(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM to `serve --frontends 2` while streams run on both frontends: the port stops
    taking connections at once (the replica kept accepting new requests until serve's own
    frontend had drained), and every stream in flight still ends whole."""
    args = ["--engine", "mocker", "--workers", "2", "--frontends", "2"]
    args += ["--served-model-name", SERVED_MODEL_NAME, "--shutdown-grace-s", "120"]
    started: list[subprocess.Popen[bytes]] = []
    with running_server(default_model_dir, tmp_path, args, started=started) as url:
        wait_until(lambda: peers(url) == 1, "a replica that hears from the other")
        streams = [HeldStream(url, f"drain {i}", max_tokens=800) for i in range(12)]
        for stream in streams:
            stream.wait_first_token()
        # both frontends have some in flight (each scrape lands on either)
        wait_until(lambda: 0 < in_flight(url, by="this") < 12, "streams on both frontends")
        started[0].send_signal(signal.SIGTERM)
        wait_until(lambda: refuses_connections(int(url.rsplit(":", 1)[1])), "the port closed")
        assert [s.outcome for s in streams] == [None] * 12  # still in flight
        for stream in streams:
            stream.join()
        assert [(s.outcome, s.finish_reason) for s in streams] == [("done", "length")] * 12
        assert started[0].wait(timeout=120) == -signal.SIGTERM


def children_of(pid: int) -> dict[int, str]:
    """The live child processes of `pid`: their pid -> the armature command they run."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        ppid = int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
        state = re.search(r"^State:\s+(\S)", status, re.M).group(1)  # type: ignore[union-attr]
        if ppid == pid and state != "Z" and b"armature.cli" in argv:
            found[int(entry.name)] = argv[argv.index(b"armature.cli") + 1].decode()
    return found


def test_serve_starts_again_a_replica_or_worker_that_failed(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """A frontend replica and a worker killed outright (the OOM killer's SIGKILL): serve
    went on with fewer, silently; it logs each and starts it again, and the fleet serves
    every request after."""
    args = ["--engine", "mocker", "--workers", "2", "--frontends", "2"]
    args += ["--served-model-name", SERVED_MODEL_NAME]
    started: list[subprocess.Popen[bytes]] = []
    with running_server(default_model_dir, tmp_path, args, started=started) as url:
        serve = started[0].pid
        wait_until(lambda: peers(url) == 1, "a replica that hears from the other")
        before = children_of(serve)
        assert sorted(before.values()) == ["frontend", "worker", "worker"]
        replica = next(pid for pid, kind in before.items() if kind == "frontend")
        worker = next(pid for pid, kind in before.items() if kind == "worker")
        os.kill(replica, signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)

        def replaced() -> bool:
            now = children_of(serve)
            return sorted(now.values()) == ["frontend", "worker", "worker"] and not (
                {replica, worker} & set(now)
            )

        wait_until(replaced, "the killed replica and worker started again")
        wait_until(lambda: peers(url) == 1, "the new replica heard from")
        for i in range(16):
            complete(url, f"request {i} after the restarts")
        log = (tmp_path / "stderr.log").read_text()
        assert f"frontend replica 1 (pid {replica}) failed (exit code -9)" in log
        assert re.search(rf"worker \d \(agg\) \(pid {worker}\) failed \(exit code -9\)", log)


def test_a_replica_still_starting_on_a_shared_port_takes_no_connection(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A replica joining a shared port (`--reuse-port`) listens once it serves: while it
    waits for workers, every connection to the port goes to the replica serving (a listener
    of the group gets its share at once, and they waited out the other's start)."""
    url, _ = fleet.start_frontend_process("frontend-shared", extra=[*REPLICA_ARGS, "--reuse-port"])
    port = url.rsplit(":", 1)[1]
    empty = tmp_path / "no-workers"
    empty.mkdir()
    args = ["frontend", "--port", port, "--reuse-port", "--host", "127.0.0.1"]
    args += ["--discovery", "file", "--discovery-dir", str(empty)]
    joining = fleet._spawn("frontend-joining", args)
    try:
        fleet.wait_for_log("frontend-joining", "waiting for workers", joining)
        for _ in range(32):  # each a connection of its own
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        joining.terminate()
        joining.wait(30)
