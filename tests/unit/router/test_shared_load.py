"""Frontend replicas' shared load, the pure core: peers' snapshots replace their whole
contribution, older ones are ignored, silent peers expire and come back, totals are exact
(hypothesis against a naive sum); ActiveLoad adds the peers' totals to its own; and two
replicas' kv policies sharing load route a hot prefix like one frontend does."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from armature.kv.hashing import DEFAULT_HASH_SEED, compute_seq_hashes
from armature.protocols.kv_events import KvStored, StoredBlock
from armature.protocols.replica import ReplicaLoad, WorkerShare
from armature.router.load import ActiveLoad, WorkerLoad
from armature.router.policies import KvPolicy, RouteRequest
from armature.router.prefix_index import PrefixIndex
from armature.router.shared_load import PeerLoads, get_shares


def snap(replica: int, seq: int, *shares: tuple[str, int, int, int]) -> ReplicaLoad:
    return ReplicaLoad(replica_id=replica, seq=seq, shares=[WorkerShare(*s) for s in shares])


def test_a_snapshot_replaces_the_replicas_whole_contribution() -> None:
    peers = PeerLoads()
    peers.watch(1, ttl_s=3.0, now_s=0.0)
    peers.watch(2, ttl_s=3.0, now_s=0.0)
    assert peers.apply(snap(1, 0, ("w0", 100, 10, 2), ("w1", 0, 4, 1)), now_s=0.1)
    assert peers.apply(snap(2, 0, ("w0", 16, 1, 1)), now_s=0.1)
    assert dict(peers.get_totals()) == {"w0": WorkerLoad(116, 11, 3), "w1": WorkerLoad(0, 4, 1)}
    # replica 1's requests on w1 finished, those on w0 got their first tokens
    assert peers.apply(snap(1, 1, ("w0", 0, 10, 2)), now_s=0.2)
    assert dict(peers.get_totals()) == {"w0": WorkerLoad(16, 11, 3)}
    assert peers.get_num_requests(1) == 2


def test_old_repeated_and_unwatched_snapshots_are_ignored() -> None:
    peers = PeerLoads()
    peers.watch(1, ttl_s=3.0, now_s=0.0)
    assert peers.apply(snap(1, 5, ("w0", 0, 3, 1)), now_s=0.0)
    assert not peers.apply(snap(1, 5, ("w0", 0, 9, 3)), now_s=0.1)
    assert not peers.apply(snap(1, 4), now_s=0.1)
    assert not peers.apply(snap(7, 0, ("w0", 0, 50, 5)), now_s=0.1)  # no card: not a peer
    assert dict(peers.get_totals()) == {"w0": WorkerLoad(0, 3, 1)}


def test_a_silent_replica_expires_after_its_ttl_and_comes_back_with_its_next_report() -> None:
    peers = PeerLoads()
    peers.watch(1, ttl_s=3.0, now_s=0.0)
    peers.watch(2, ttl_s=1.5, now_s=0.0)
    peers.apply(snap(1, 0, ("w0", 0, 8, 2)), now_s=1.0)
    peers.apply(snap(2, 0, ("w1", 0, 2, 1)), now_s=1.0)
    assert peers.expire(now_s=2.4) == []
    assert peers.expire(now_s=2.5) == [2]  # 1.5 s since its last report
    assert dict(peers.get_totals()) == {"w0": WorkerLoad(0, 8, 2)}
    assert peers.expire(now_s=3.9) == []
    assert peers.expire(now_s=4.0) == [1]
    assert dict(peers.get_totals()) == {}
    assert peers.expire(now_s=100.0) == []  # nothing left to expire
    assert peers.apply(snap(1, 1, ("w1", 0, 1, 1)), now_s=100.0)  # it was only slow
    assert dict(peers.get_totals()) == {"w1": WorkerLoad(0, 1, 1)}
    assert peers.get_replicas() == [1, 2]


def test_a_replica_that_leaves_takes_its_load_with_it() -> None:
    peers = PeerLoads()
    peers.watch(1, ttl_s=3.0, now_s=0.0)
    peers.apply(snap(1, 0, ("w0", 32, 2, 1)), now_s=0.0)
    peers.remove(1)
    peers.remove(99)
    assert dict(peers.get_totals()) == {}
    assert peers.get_replicas() == []
    assert not peers.apply(snap(1, 1, ("w0", 0, 2, 1)), now_s=0.1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["apply", "expire", "remove"]),
            st.integers(0, 3),  # replica
            st.lists(
                st.tuples(st.sampled_from(["w0", "w1", "w2"]), st.integers(0, 500)),
                max_size=3,
            ),
        ),
        max_size=40,
    )
)
def test_totals_are_the_sum_of_the_live_contributions(ops: list) -> None:  # type: ignore[type-arg]
    """Against a naive model: each replica's last snapshot, dropped when it expires or
    leaves."""
    peers = PeerLoads()
    latest: dict[int, dict[str, WorkerLoad]] = {}
    heard: dict[int, float] = {}
    seqs: dict[int, int] = {}
    now_s = 0.0
    for op, replica, shares in ops:
        now_s += 0.5
        if op == "apply":
            if replica not in seqs:
                peers.watch(replica, ttl_s=2.0, now_s=now_s)
            seqs[replica] = seqs.get(replica, -1) + 1
            by_worker = {w: WorkerLoad(t, t // 16 + 1, 1) for w, t in shares}
            snapshot = ReplicaLoad(
                replica_id=replica, seq=seqs[replica], shares=get_shares(by_worker)
            )
            assert peers.apply(snapshot, now_s)
            latest[replica], heard[replica] = by_worker, now_s
        elif op == "expire":
            peers.expire(now_s)
            for r in [r for r in latest if now_s - heard[r] >= 2.0]:
                latest[r] = {}
        else:
            peers.remove(replica)
            latest.pop(replica, None)
            seqs.pop(replica, None)
        expected: dict[str, WorkerLoad] = {}
        for loads in latest.values():
            for w, x in loads.items():
                old = expected.get(w, WorkerLoad())
                expected[w] = WorkerLoad(
                    old.active_prefill_tokens + x.active_prefill_tokens,
                    old.active_blocks + x.active_blocks,
                    old.num_requests + x.num_requests,
                )
        assert dict(peers.get_totals()) == expected


def test_active_load_adds_the_peers_to_its_own_and_reports_its_own_alone() -> None:
    load = ActiveLoad()
    load.start("r1", "w0", prefill_tokens=48, blocks=4)
    peers = PeerLoads()
    peers.watch(9, ttl_s=3.0, now_s=0.0)
    peers.apply(snap(9, 0, ("w0", 16, 2, 1), ("w1", 0, 5, 2)), now_s=0.0)
    load.set_peer_loads(peers.get_totals())
    assert dict(load.get_loads()) == {"w0": WorkerLoad(64, 6, 2), "w1": WorkerLoad(0, 5, 2)}
    assert dict(load.get_own_loads()) == {"w0": WorkerLoad(48, 4, 1)}
    assert load.get("w1") == WorkerLoad(0, 5, 2)
    load.first_token("r1")
    load.start("r2", "w1", prefill_tokens=16, blocks=1)
    assert dict(load.get_loads()) == {"w0": WorkerLoad(16, 6, 2), "w1": WorkerLoad(16, 6, 3)}
    load.finish("r1")
    load.finish("r2")
    assert dict(load.get_own_loads()) == {}
    assert dict(load.get_loads()) == {"w0": WorkerLoad(16, 2, 1), "w1": WorkerLoad(0, 5, 2)}
    peers.remove(9)
    load.set_peer_loads(peers.get_totals())
    assert dict(load.get_loads()) == {}
    assert get_shares({"w1": WorkerLoad(3, 2, 1)}) == [WorkerShare("w1", 3, 2, 1)]


HOT = list(range(1000, 1000 + 16 * 24))  # a 24-block prefix every request shares


def _route_all(num_replicas: int, num_requests: int, share: bool = True) -> list[str]:
    """Requests with the hot prefix, sent to replica i % num_replicas in turn, each staying
    in flight; with `share`, replicas share their load exactly (each decision sees every
    earlier one)."""
    workers = ["w0", "w1", "w2"]
    index = PrefixIndex()  # one: every replica reads the same workers' KV events
    for w in workers:
        index.add_worker(w, 10_000)
    loads = [ActiveLoad() for _ in range(num_replicas)]
    peers = [PeerLoads() for _ in range(num_replicas)]
    for i, p in enumerate(peers):
        for j in range(num_replicas):
            if j != i:
                p.watch(j, ttl_s=3.0, now_s=0.0)
        loads[i].set_peer_loads(p.get_totals())
    policies = [KvPolicy(index, load, 16, DEFAULT_HASH_SEED, seed=3) for load in loads]
    for p in policies:
        p.routed = None
    chosen = []
    event_ids: dict[str, int] = {}
    for n in range(num_requests):
        r = n % num_replicas
        tokens = HOT + [n + 1] * 16
        decision = policies[r].select(RouteRequest(f"q{n}", tokens), workers)
        loads[r].start(f"q{n}", decision.worker, 0, len(tokens) // 16)
        chosen.append(decision.worker)
        _store(index, event_ids, decision.worker, tokens)
        for i, p in enumerate(peers):  # r's snapshot reaches every other replica
            if i != r and share:
                shares = get_shares(loads[r].get_own_loads())
                p.apply(ReplicaLoad(replica_id=r, seq=n, shares=shares), now_s=0.0)
                loads[i].set_peer_loads(p.get_totals())
    return chosen


def _store(index: PrefixIndex, event_ids: dict[str, int], worker: str, tokens: list[int]) -> None:
    """The worker's KV event for the prompt's blocks, as every replica's index applies it."""
    hashes = compute_seq_hashes(tokens, 16, DEFAULT_HASH_SEED)
    event_ids[worker] = event_ids.get(worker, -1) + 1
    stored = KvStored(event_ids[worker], None, [StoredBlock(h, h) for h in hashes])
    assert index.apply(worker, stored)


def test_replicas_sharing_load_spread_a_hot_prefix_like_one_frontend() -> None:
    """The same spread (ties are broken at random, so not the same sequence); without the
    shared load each replica piles more onto the workers it alone sees as idle."""
    one = Counter(_route_all(1, 12))
    assert one == {"w0": 4, "w1": 4, "w2": 4}  # the load spilled over from the prefix's worker
    for num_replicas in (2, 4, 8):
        assert Counter(_route_all(num_replicas, 12)) == one
    assert Counter(_route_all(4, 12, share=False)) == {"w0": 8, "w1": 4}
    assert Counter(_route_all(8, 12, share=False)) == {"w0": 12}
