"""Observability against live processes: every metric the Grafana dashboard queries is
exported by a frontend, a worker or the planner, and docs/metrics.md lists every metric they
export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from fleet import SERVED_MODEL_NAME, Fleet
from serve_process import parse_metrics

from profiles import write_small_profile

REPO = Path(__file__).resolve().parents[2]
MOCKER = ["--engine", "mocker", "--speedup-ratio", "100", "--num-kv-blocks", "256"]
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def family(sample_name: str) -> str:
    for suffix in SUFFIXES:
        if sample_name.endswith(suffix):
            return sample_name.removesuffix(suffix)
    return sample_name


@pytest.mark.integration
def test_dashboard_and_docs_match_the_live_metrics(default_model_dir: Path, tmp_path: Path) -> None:
    fleet = Fleet(
        default_model_dir, tmp_path, engine_args=[*MOCKER, "--served-model-name", SERVED_MODEL_NAME]
    )
    try:
        fleet.start_worker("worker-a")
        # both requests are judged: a mocker at 100x answers far within these targets
        url = fleet.start_frontend(extra=["--slo-ttft-ms", "3000", "--slo-itl-ms", "500"])
        for prompt in ("hello", "hello again"):
            body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": 3}
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
        bad = {"model": SERVED_MODEL_NAME, "prompt": "x", "max_tokens": -1}
        assert httpx.post(f"{url}/v1/completions", json=bad, timeout=30).status_code == 400
        worker_log = (tmp_path / "worker-a.log").read_text()
        metrics_url = re.search(r"metrics (http://\S+/metrics)", worker_log)
        assert metrics_url, worker_log
        frontend = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        worker = parse_metrics(httpx.get(metrics_url.group(1), timeout=10).text)
        planner = _planner_metrics(fleet, url, tmp_path)
    finally:
        fleet.stop()
    assert planner['armature_planner_target_workers{role="agg"}'] == 1
    assert planner['armature_planner_wanted_workers{role="agg"}'] == 1  # nothing held
    samples = {key.split("{")[0] for key in [*frontend, *worker, *planner]}
    assert frontend['armature_requests_total{endpoint="completions",status="400"}'] == 1
    assert frontend['armature_slo_requests_total{result="met"}'] == 2
    assert frontend['armature_slo_target_seconds{target="ttft"}'] == 3.0
    assert frontend['armature_slo_target_seconds{target="itl"}'] == 0.5
    assert worker['armature_worker_requests_total{reason="length"}'] == 2
    assert worker["armature_worker_generation_tokens_total"] == 6
    # the worker times each request's first token from its arrival there: inside the
    # frontend's TTFT of the same two requests (the path to the worker and back is the rest)
    assert worker["armature_worker_time_to_first_token_seconds_count"] == 2
    worker_ttft_s = worker["armature_worker_time_to_first_token_seconds_sum"]
    assert 0 < worker_ttft_s < frontend["armature_time_to_first_token_seconds_sum"]

    dashboard = json.loads(
        (REPO / "deploy" / "helm" / "armature" / "dashboards" / "armature.json").read_text()
    )
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"armature_[a-z0-9_]+", target["expr"])
    }
    assert queried and queried <= samples, f"not exported: {sorted(queried - samples)}"

    documented = set(
        re.findall(r"`(armature_[a-z0-9_]+)`", (REPO / "docs" / "metrics.md").read_text())
    )
    exported = {family(s) for s in samples}
    assert exported <= {family(d) for d in documented}, sorted(
        exported - {family(d) for d in documented}
    )


def _planner_metrics(fleet: Fleet, url: str, tmp_path: Path) -> dict[str, float]:
    """A dry-run planner over the fleet: its /metrics after its first load tick."""
    write_small_profile(tmp_path / "profile.json", model=SERVED_MODEL_NAME)
    args = ["planner", "--dry-run", "--planner-mode", "agg", "--load-interval-s", "0.2"]
    args += ["--ttft-ms", "3000", "--itl-ms", "500"]  # the frontend's SLO targets
    args += ["--performance-model", str(tmp_path / "profile.json"), "--frontend-url", url]
    proc = fleet._spawn("planner", [*args, *fleet.runtime_args()])
    fleet.wait_for_log("planner", "planner ready", proc)
    found = re.search(r"metrics (http://\S+/metrics)", (tmp_path / "planner.log").read_text())
    assert found
    return parse_metrics(httpx.get(found.group(1), timeout=10).text)
