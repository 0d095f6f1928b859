"""The frontend's metrics for the planner: scrapes its Prometheus /metrics (httpx) and keeps
one baseline per window name, so that the load rule's and the throughput plan's windows are
each the difference between two scrapes (scrape.py does the arithmetic)."""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from armature.errors import ArmatureError
from armature.planner.observation import FrontendMetrics
from armature.planner.scrape import (
    FrontendSample,
    ScrapeError,
    get_window_metrics,
    parse_frontend_sample,
)

__all__ = ["FrontendFeed", "FrontendUnreachableError"]


class FrontendUnreachableError(ArmatureError):
    """The frontend's /metrics did not answer, or not with its metrics."""


class FrontendFeed:
    """Owns an httpx client and, per window, the last scrape and its window."""

    def __init__(
        self,
        frontend_url: str,
        windows: Sequence[str],
        *,
        timeout_s: float = 5.0,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: sent as a bearer token (a frontend whose /metrics needs one)."""
        self.metrics_url = frontend_url.rstrip("/") + "/metrics"
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=headers)
        self._baselines: dict[str, tuple[FrontendSample, float]] = {}
        self._last: dict[str, FrontendMetrics] = {}
        self._windows = tuple(windows)

    async def scrape(self) -> FrontendSample:
        """One scrape; FrontendUnreachableError when it fails (never "no traffic")."""
        try:
            response = await self._client.get(self.metrics_url)
        except httpx.HTTPError as exc:
            raise FrontendUnreachableError(
                f"cannot read {self.metrics_url}: {str(exc) or type(exc).__name__}"
            ) from None
        if response.status_code == 401:
            raise FrontendUnreachableError(
                f"{self.metrics_url} needs an API key (the frontend runs --protect-metrics): "
                "give the planner one of its keys (--frontend-api-key, or "
                "ARMATURE_FRONTEND_API_KEY)"
                if "Authorization" not in self._client.headers
                else f"{self.metrics_url} refused the planner's API key (HTTP 401)"
            )
        if response.status_code != 200:
            raise FrontendUnreachableError(
                f"{self.metrics_url} answered HTTP {response.status_code}"
            )
        try:
            return parse_frontend_sample(response.text)
        except ScrapeError as exc:
            raise FrontendUnreachableError(f"{self.metrics_url}: {exc}") from None

    def start(self, sample: FrontendSample, now_s: float) -> None:
        """Every window starts at `sample`, taken at `now_s`."""
        for window in self._windows:
            self._baselines[window] = (sample, now_s)

    def take_window(self, window: str, sample: FrontendSample, now_s: float) -> FrontendMetrics:
        """`window` from its baseline to `sample` (taken at `now_s`), which becomes the new
        baseline."""
        before, then_s = self._baselines[window]
        metrics = get_window_metrics(
            before, sample, max(now_s - then_s, 1e-6), self._last.get(window)
        )
        self._baselines[window] = (sample, now_s)
        self._last[window] = metrics
        return metrics

    async def close(self) -> None:
        await self._client.aclose()
