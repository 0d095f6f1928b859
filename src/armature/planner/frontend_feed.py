"""The frontends' metrics for the planner: scrapes each frontend replica's Prometheus /metrics
(httpx) and keeps one baseline per window name, so that the load rule's and the throughput
plan's windows are each the difference between two scrapes (scrape.py does the arithmetic).

Which frontends: one url (`--frontend-url`), or every frontend replica of the namespace, at
the address its card in discovery names (`FrontendCard.http_url`): replicas that share a port
each count only the requests they served, so the planner reads them all and sums them. A
replica that joins counts from its start (its counters start at zero); one that was out of
discovery for a while (under the same name: the same process), or was already running when
the planner first listed the fleet without it, counts from its return (its uptime gauge,
`armature_frontend_uptime_seconds`, tells the two apart);
while a replica listed does not answer, the ticks are skipped, as with one frontend that
does not answer (its requests missing from a window would read as less traffic)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import httpx
import msgspec

from armature.errors import ArmatureError
from armature.planner.observation import FrontendMetrics
from armature.planner.scrape import (
    ZERO_SAMPLE,
    FrontendSample,
    ScrapeError,
    get_fleet_window_metrics,
    parse_frontend_sample,
    sum_samples,
)
from armature.protocols.replica import FrontendCard, frontend_prefix
from armature.runtime.discovery import Discovery

__all__ = [
    "FrontendFeed",
    "FrontendScrape",
    "FrontendUnreachableError",
    "discovered_frontends",
    "one_frontend",
]

log = logging.getLogger(__name__)

FORGET_AFTER_S = 3600.0  # a replica unseen this long is forgotten
# replica name -> its base url (http://host:port)
FrontendLister = Callable[[], Awaitable[dict[str, str]]]


class FrontendUnreachableError(ArmatureError):
    """No frontend's /metrics answered, or not with its metrics."""


class FrontendScrape(msgspec.Struct, frozen=True):
    """One scrape of the frontends: each replica's sample, by name (its card's key), and
    the url it was read at; `seq` counts the feed's scrapes (two can share a time)."""

    samples: dict[str, FrontendSample]
    urls: dict[str, str]
    seq: int = 0

    @property
    def total(self) -> FrontendSample:
        """The replicas' samples as one frontend's (`sum_samples`)."""
        return sum_samples(list(self.samples.values()))


def one_frontend(url: str) -> FrontendLister:
    """The frontend at `url` alone."""
    frontends = {url: url}

    async def listed() -> dict[str, str]:
        return frontends

    return listed


def discovered_frontends(discovery: Discovery, namespace: str) -> FrontendLister:
    """Every frontend of `namespace` whose card in `discovery` names its own address
    (ArmatureError when discovery cannot be read)."""
    said: set[str] = set()  # cards left out, said once each

    async def listed() -> dict[str, str]:
        frontends = {}
        for key, value in (await discovery.list(frontend_prefix(namespace))).items():
            try:
                card = msgspec.msgpack.decode(value, type=FrontendCard)
            except msgspec.DecodeError:
                if key not in said:
                    said.add(key)
                    log.warning("frontend card %s is unreadable; not read", key)
                continue
            if card.http_url is not None:
                frontends[key] = card.http_url
            elif key not in said:  # an older frontend: the windows leave its requests out
                said.add(key)
                log.warning(
                    "frontend card %s names no address of its own (an older frontend): its "
                    "requests are not counted",
                    key,
                )
        return frontends

    return listed


class FrontendFeed:
    """Owns an httpx client and, per window, the last scrape and its window."""

    def __init__(
        self,
        frontends: FrontendLister,
        describe: str,
        windows: Sequence[str],
        *,
        timeout_s: float = 5.0,
        api_key: str | None = None,
    ) -> None:
        """`frontends` lists the replicas to read; `describe` says which, for messages.
        `api_key`: sent as a bearer token (a frontend whose /metrics needs one)."""
        self._frontends = frontends
        self.describe = describe
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=headers)
        self._baselines: dict[str, tuple[FrontendScrape, float]] = {}
        self._last: dict[str, FrontendMetrics] = {}
        self._windows = tuple(windows)
        self._num_scrapes = 0
        self._first_seen: dict[str, int] = {}  # replica name -> the scrape that first had it
        self._last_seen_s: dict[str, float] = {}

    async def scrape(self) -> FrontendScrape:
        """One scrape of every replica listed; FrontendUnreachableError when one does not
        answer (a window without some replica's requests would read as less traffic)."""
        try:
            frontends = await self._frontends()
        except ArmatureError as exc:
            raise FrontendUnreachableError(f"cannot list the frontends: {exc}") from None
        if not frontends:
            raise FrontendUnreachableError("no frontend is listed")
        names = sorted(frontends)
        answers = await asyncio.gather(
            *(self._scrape_one(frontends[name]) for name in names), return_exceptions=True
        )
        errors = [str(a) for a in answers if isinstance(a, FrontendUnreachableError)]
        if errors:
            raise FrontendUnreachableError("; ".join(errors))
        samples = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer
            samples[name] = answer
        self._num_scrapes += 1
        return FrontendScrape(samples, {name: frontends[name] for name in names}, self._num_scrapes)

    async def _scrape_one(self, base_url: str) -> FrontendSample:
        metrics_url = base_url.rstrip("/") + "/metrics"
        try:
            response = await self._client.get(metrics_url)
        except httpx.HTTPError as exc:
            raise FrontendUnreachableError(
                f"cannot read {metrics_url}: {str(exc) or type(exc).__name__}"
            ) from None
        if response.status_code == 401:
            raise FrontendUnreachableError(
                f"{metrics_url} needs an API key (the frontend runs --protect-metrics): "
                "give the planner one of its keys (--frontend-api-key, or "
                "ARMATURE_FRONTEND_API_KEY)"
                if "Authorization" not in self._client.headers
                else f"{metrics_url} refused the planner's API key (HTTP 401)"
            )
        if response.status_code != 200:
            raise FrontendUnreachableError(f"{metrics_url} answered HTTP {response.status_code}")
        try:
            return parse_frontend_sample(response.text)
        except ScrapeError as exc:
            raise FrontendUnreachableError(f"{metrics_url}: {exc}") from None

    def start(self, scrape: FrontendScrape, now_s: float) -> None:
        """Every window starts at `scrape`, taken at `now_s`."""
        self._see(scrape, now_s)
        for window in self._windows:
            self._baselines[window] = (scrape, now_s)

    def take_window(self, window: str, scrape: FrontendScrape, now_s: float) -> FrontendMetrics:
        """`window` from its baseline to `scrape` (taken at `now_s`), which becomes the new
        baseline: each replica's differences, summed. A replica first seen since the window
        began counts from zero where its counters started since then (its uptime within the
        window; a frontend that exports no uptime is taken as started then); one seen before
        but missing from the baseline (out of discovery for a while: a lease lost, a Pod not
        ready), or running before the window unlisted, counts from this scrape on (what it
        served while unseen is not known to this window)."""
        before, then_s = self._baselines[window]
        window_s = max(now_s - then_s, 1e-6)
        self._see(scrape, now_s)
        pairs = []
        for name, sample in scrape.samples.items():
            if name in before.samples:
                pairs.append((before.samples[name], sample))
            elif self._first_seen[name] > before.seq and _started_within(sample, window_s):
                pairs.append((ZERO_SAMPLE, sample))
        metrics = get_fleet_window_metrics(pairs, window_s, self._last.get(window))
        self._baselines[window] = (scrape, now_s)
        self._last[window] = metrics
        self._forget_unseen(now_s)
        return metrics

    def _see(self, scrape: FrontendScrape, now_s: float) -> None:
        for name in scrape.samples:
            self._first_seen.setdefault(name, scrape.seq)
            self._last_seen_s[name] = now_s

    def _forget_unseen(self, now_s: float) -> None:
        """Replicas unseen for FORGET_AFTER_S are forgotten (a restart has a new name)."""
        gone = [n for n, seen_s in self._last_seen_s.items() if now_s - seen_s > FORGET_AFTER_S]
        for name in gone:
            del self._last_seen_s[name]
            del self._first_seen[name]

    async def close(self) -> None:
        await self._client.aclose()


def _started_within(sample: FrontendSample, window_s: float) -> bool:
    """Whether the replica's counters started within the last `window_s` (its uptime, read at
    the window's end, is no longer); True where it exports none."""
    return sample.uptime_s is None or sample.uptime_s <= window_s
