"""Queueing delay from arrival rate, service time and servers: M/M/c (Erlang C), with the
Allen-Cunneen scaling for other service-time spreads (M/G/c). Pure math.

For `c` servers, arrivals `lam` per second and a mean service time `s` (offered load
`a = lam * s` Erlangs, utilization `rho = a / c`), the probability that an arrival waits is
Erlang C, computed from Erlang B by the stable recursion

    B(0) = 1,  B(k) = a B(k-1) / (k + a B(k-1)),   C = B(c) / (1 - rho (1 - B(c)))

and the waiting time's tail is `P(W > t) = C exp(-(c/s - lam) t)`. Allen-Cunneen: an M/G/c
queue waits about `(1 + cv2) / 2` times as long as M/M/c, `cv2` being the squared
coefficient of variation of service times (1: exponential; 0: constant), so its tail decays
that much slower: `P(W > t) ~ C exp(-(c/s - lam) t * 2 / (1 + cv2))`.
"""

from __future__ import annotations

import math

__all__ = ["erlang_c", "get_min_servers", "get_wait_attainment"]


def erlang_c(num_servers: int, offered_load: float) -> float:
    """The probability that an arrival waits, for `num_servers` servers at `offered_load`
    Erlangs; 1.0 when the load reaches the servers (the queue grows without bound)."""
    assert num_servers >= 1 and offered_load >= 0.0
    if offered_load >= num_servers:
        return 1.0
    blocking = 1.0
    for k in range(1, num_servers + 1):
        blocking = _next_blocking(blocking, k, offered_load)
    return _erlang_c_of(num_servers, offered_load, blocking)


def _next_blocking(blocking: float, num_servers: int, offered_load: float) -> float:
    """Erlang B for `num_servers` from its value for one server fewer."""
    return offered_load * blocking / (num_servers + offered_load * blocking)


def _erlang_c_of(num_servers: int, offered_load: float, blocking: float) -> float:
    """Erlang C from Erlang B (`blocking`) at the same count; 1.0 at or past saturation."""
    if offered_load >= num_servers:
        return 1.0
    rho = offered_load / num_servers
    return blocking / (1.0 - rho * (1.0 - blocking))


def _tail_attainment(
    num_servers: int,
    arrival_rate_per_s: float,
    service_s: float,
    slack_s: float,
    service_cv2: float,
    waits: float,
) -> float:
    """1 - P(wait > slack) given the probability `waits` that an arrival waits at all."""
    if waits >= 1.0:
        return 0.0
    drain_per_s = num_servers / service_s - arrival_rate_per_s
    return 1.0 - waits * math.exp(-drain_per_s * slack_s * 2.0 / (1.0 + service_cv2))


def get_wait_attainment(
    num_servers: int,
    arrival_rate_per_s: float,
    service_s: float,
    slack_s: float,
    service_cv2: float = 1.0,
) -> float:
    """The fraction of arrivals that wait at most `slack_s` seconds for a server."""
    if arrival_rate_per_s <= 0.0 or service_s <= 0.0:
        return 1.0
    if slack_s < 0.0:
        return 0.0
    waits = erlang_c(num_servers, arrival_rate_per_s * service_s)
    return _tail_attainment(num_servers, arrival_rate_per_s, service_s, slack_s, service_cv2, waits)


def get_min_servers(
    arrival_rate_per_s: float,
    service_s: float,
    slack_s: float,
    attainment: float,
    *,
    max_servers: int,
    service_cv2: float = 1.0,
) -> int | None:
    """The fewest servers (1..max_servers) for which `attainment` of arrivals wait at most
    `slack_s`; None when even `max_servers` fall short. Erlang B is carried from one server
    count to the next (the recursion `erlang_c` runs for each), so the search costs
    O(max_servers), not O(max_servers^2); each count's attainment is `get_wait_attainment`'s
    to the bit."""
    start = max(1, math.floor(arrival_rate_per_s * service_s))
    if arrival_rate_per_s <= 0.0 or service_s <= 0.0 or attainment <= 0.0:
        return start if start <= max_servers else None  # nothing waits, or nothing asked
    if slack_s < 0.0:
        return None
    offered = arrival_rate_per_s * service_s
    blocking = 1.0
    for num_servers in range(1, max_servers + 1):
        blocking = _next_blocking(blocking, num_servers, offered)
        if num_servers < start:
            continue
        waits = _erlang_c_of(num_servers, offered, blocking)
        met = _tail_attainment(
            num_servers, arrival_rate_per_s, service_s, slack_s, service_cv2, waits
        )
        if met >= attainment:
            return num_servers
    return None
