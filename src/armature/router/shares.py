"""Bounded shares: how many of a router's recent decisions each worker got, and which workers
may take one more when a bound caps each worker's share. Pure.

    window      the last `window_per_worker` x (workers in the window, or routed over when
                more) decisions
    capacity    ceil(bound x (decisions in the window to these workers + 1) / workers)

A worker at its capacity takes no request until its share of the window falls below it. The
window is long (hundreds of requests per worker), so a conversation's next turn or a burst on
one prefix still goes where its cache is; what the bound stops is one worker drawing more than
`bound` x its share for long, which the cost alone allows when a hot prefix keeps winning
(the prefix then gets a second worker, whose cache serves the requests sent there after).

Alone, the bound caps the skew of a whole run whatever the costs prefer: with W workers, a
bound c and L = window x W, after t = q x L + r decisions (0 < r <= L) no worker has more
than ceil(c x r / W) + q x ceil(c x (L + 1) / W) of them, so its count over the mean's is at
most c + (c x q + W x (q + 1)) / t (the first window's counts are capped as they grow, every
later window adds at most its capacity). The kv router applies it only where a worker it
keeps is idle and some worker is busy (`KvPolicy`: a moved request starts at once; a lone
client's turns stay on its cache), so its skew is measured, not capped by construction; and
it uses the shares at a bound of 1 to break its cost's near-ties towards the workers below
their fair share, so that a hot prefix's worker reaches its capacity less often.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from itertools import repeat

from armature.router.cost import within_capacity

__all__ = ["RecentShares"]


class RecentShares:
    """The router's last decisions (worker ids, oldest first) and their counts."""

    def __init__(self, window_per_worker: int) -> None:
        if window_per_worker < 1:
            raise ValueError(f"window_per_worker must be >= 1, got {window_per_worker}")
        self.window_per_worker = window_per_worker
        self._decisions: deque[str] = deque()
        self._counts: Counter[str] = Counter()
        self._known: set[str] = set()  # every worker routed over so far

    def get_count(self, worker: str) -> int:
        return self._counts[worker]

    def bounded(self, workers: Sequence[str], bound: float) -> list[int] | None:
        """The indexes of `workers` below their capacity when some worker is at it; None
        when every worker may take one more. Some worker always may (one at or below the
        mean is below a bound above 1)."""
        return within_capacity(self.get_counts(workers), bound)

    def get_counts(self, workers: Sequence[str]) -> list[int]:
        """The counts of `workers`, in order. A worker not routed over before joins the
        window with the others' mean count (`_credit`)."""
        if not self._known.issuperset(workers):
            joined = [w for w in workers if w not in self._known]
            self._known.update(joined)
            self._credit(joined, [w for w in workers if w not in joined])
        return list(map(self._counts.get, workers, repeat(0)))

    def _credit(self, joined: Sequence[str], staying: Sequence[str]) -> None:
        """Each worker in `joined` counts the staying workers' mean (rounded), as the window's
        oldest decisions, the first to leave it. At 0 beside the others' counts it would take
        every request until it caught up; and a window started afresh would hold a growing
        fleet to the tight capacities of a few decisions, leaving out workers with less in
        flight than the one chosen."""
        if not staying:
            return
        mean = round(sum(self._counts[w] for w in staying) / len(staying))
        for worker in joined:
            self._decisions.extendleft([worker] * mean)
            if mean:
                self._counts[worker] += mean

    def record(self, worker: str, num_workers: int) -> None:
        """`worker` got a request routed over `num_workers` (the window is sized by the
        workers in it when more: a request whose candidates were filtered down does not
        shrink it); the oldest decisions beyond the window leave it."""
        self._decisions.append(worker)
        self._counts[worker] += 1
        self._known.add(worker)
        limit = self.window_per_worker * max(1, num_workers, len(self._counts))
        while len(self._decisions) > limit:
            oldest = self._decisions.popleft()
            self._counts[oldest] -= 1
            if not self._counts[oldest]:
                del self._counts[oldest]
