"""The frontend's Prometheus text as planner windows: exact numbers from two captured
expositions (the frontend's metric names and prometheus_client's text format)."""

from __future__ import annotations

import msgspec
import pytest

from armature.planner.main import describe_unseen_workers
from armature.planner.observation import FrontendMetrics
from armature.planner.scrape import (
    FrontendSample,
    ScrapeError,
    get_fleet_window_metrics,
    get_window_metrics,
    parse_frontend_sample,
    sum_samples,
)
from armature.protocols.worker import WorkerRole


def exposition(
    *,
    ok: int,
    bad: int,
    left: int,
    in_flight: int,
    queued: int,
    prompt: int,
    cached: int,
    output: int,
    ttft: tuple[int, float],
    itl: tuple[int, float],
    e2e: int,
) -> str:
    """A frontend's /metrics as prometheus_client writes it (the families the planner reads,
    with their neighbours)."""
    return f"""\
# HELP armature_requests_total Finished HTTP requests
# TYPE armature_requests_total counter
armature_requests_total{{endpoint="completions",status="200"}} {ok}.0
armature_requests_total{{endpoint="completions",status="400"}} {bad}.0
armature_requests_total{{endpoint="chat",status="499"}} {left}.0
# HELP armature_requests_created Finished HTTP requests
# TYPE armature_requests_created gauge
armature_requests_created{{endpoint="completions",status="200"}} 1.7e+09
# HELP armature_requests_in_flight Requests being served
# TYPE armature_requests_in_flight gauge
armature_requests_in_flight {in_flight}.0
# HELP armature_requests_queued Requests waiting for a free worker (overload control)
# TYPE armature_requests_queued gauge
armature_requests_queued {queued}.0
# HELP armature_time_to_first_token_seconds Time to first token
# TYPE armature_time_to_first_token_seconds histogram
armature_time_to_first_token_seconds_bucket{{le="0.1"}} 0.0
armature_time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft[0]}.0
armature_time_to_first_token_seconds_count {ttft[0]}.0
armature_time_to_first_token_seconds_sum {ttft[1]}
# HELP armature_inter_token_latency_seconds Time between output tokens
# TYPE armature_inter_token_latency_seconds histogram
armature_inter_token_latency_seconds_bucket{{le="+Inf"}} {itl[0]}.0
armature_inter_token_latency_seconds_count {itl[0]}.0
armature_inter_token_latency_seconds_sum {itl[1]}
# HELP armature_e2e_request_latency_seconds Request latency, end to end
# TYPE armature_e2e_request_latency_seconds histogram
armature_e2e_request_latency_seconds_bucket{{le="+Inf"}} {e2e}.0
armature_e2e_request_latency_seconds_count {e2e}.0
armature_e2e_request_latency_seconds_sum 12.5
# HELP armature_prompt_tokens_total Prompt tokens
# TYPE armature_prompt_tokens_total counter
armature_prompt_tokens_total {prompt}.0
# HELP armature_generation_tokens_total Output tokens
# TYPE armature_generation_tokens_total counter
armature_generation_tokens_total {output}.0
# HELP armature_prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache
# TYPE armature_prefix_cache_hit_tokens_total counter
armature_prefix_cache_hit_tokens_total {cached}.0
# HELP armature_prefix_cache_hit_ratio Prompt tokens served from the prefix cache / prompt tokens
# TYPE armature_prefix_cache_hit_ratio gauge
armature_prefix_cache_hit_ratio 0.2
# HELP armature_model_info Served model
# TYPE armature_model_info gauge
armature_model_info{{model="smollm2"}} 1.0
"""


BEFORE = exposition(
    ok=10,
    bad=2,
    left=1,
    in_flight=3,
    queued=0,
    prompt=5000,
    cached=1000,
    output=1200,
    ttft=(13, 2.6),
    itl=(1187, 23.74),
    e2e=11,
)
AFTER = exposition(
    ok=30,
    bad=5,
    left=2,
    in_flight=5,
    queued=4,
    prompt=15000,
    cached=4000,
    output=5200,
    ttft=(35, 9.2),
    itl=(5165, 103.3),
    e2e=32,
)


def test_a_scrape_reads_the_counters_the_planner_needs() -> None:
    assert parse_frontend_sample(BEFORE) == FrontendSample(
        model_name="smollm2",
        num_finished_requests=11.0,  # 10 ok + 1 client left; the 2 x 400 never reached a worker
        num_in_flight_requests=3.0,
        num_queued_requests=0.0,
        num_prompt_tokens=5000.0,
        num_cached_tokens=1000.0,
        num_output_tokens=1200.0,
        num_first_tokens=13.0,
        ttft_sum_s=2.6,
        num_token_gaps=1187.0,
        itl_sum_s=23.74,
        num_finished_streams=11.0,
    )


def test_two_scrapes_make_a_window_by_differences() -> None:
    window = get_window_metrics(parse_frontend_sample(BEFORE), parse_frontend_sample(AFTER), 10.0)
    # 21 finished (20 ok + 1 left) and 2 more in flight: 23 arrived
    assert window.num_requests == 23
    assert window.get_request_rate_per_s() == pytest.approx(2.3)
    assert window.mean_input_tokens == pytest.approx(10000 / 22)  # per first token
    assert window.mean_output_tokens == pytest.approx(4000 / 21)  # per finished stream
    assert window.prefix_hit_rate == pytest.approx(0.3)
    assert window.mean_ttft_ms == pytest.approx(300.0)  # 6.6 s / 22
    assert window.mean_itl_ms == pytest.approx(20.0)  # 79.56 s / 3978
    assert window.num_queued_requests == 4
    assert window.window_s == 10.0


def test_an_idle_window_has_no_latencies_and_keeps_the_last_lengths() -> None:
    sample = parse_frontend_sample(AFTER)
    previous = FrontendMetrics(
        window_s=5.0, num_requests=3, mean_input_tokens=400.0, mean_output_tokens=90.0
    )
    window = get_window_metrics(sample, sample, 5.0, previous)
    assert window == FrontendMetrics(
        window_s=5.0,
        num_requests=0,
        mean_input_tokens=400.0,
        mean_output_tokens=90.0,
        prefix_hit_rate=0.0,
        mean_ttft_ms=None,
        mean_itl_ms=None,
        num_queued_requests=4,
    )


def with_lengths(text: str, total_tokens: int, count: int) -> str:
    """`text` with the output-length histogram of a frontend that exports it."""
    return (
        text
        + f"""\
# HELP armature_request_generation_tokens Output tokens of each finished request
# TYPE armature_request_generation_tokens histogram
armature_request_generation_tokens_bucket{{le="+Inf"}} {count}.0
armature_request_generation_tokens_count {count}.0
armature_request_generation_tokens_sum {total_tokens}.0
"""
    )


def test_output_length_is_the_finished_requests_own() -> None:
    # 4,000 tokens streamed in the window, much of it by requests still decoding; the 21
    # that finished in it had 2,100 tokens between them
    before = parse_frontend_sample(with_lengths(BEFORE, 1000, 11))
    after = parse_frontend_sample(with_lengths(AFTER, 3100, 32))
    assert (before.finished_output_tokens, before.num_output_lengths) == (1000.0, 11.0)
    window = get_window_metrics(before, after, 10.0)
    assert window.mean_output_tokens == pytest.approx(100.0)
    assert window.num_requests == 23


def test_no_output_length_is_measured_before_a_request_finishes() -> None:
    # requests arrived and stream tokens, none finished: no length, not a guess
    sample = parse_frontend_sample(with_lengths(BEFORE, 0, 0))
    later = parse_frontend_sample(with_lengths(AFTER, 0, 0))
    window = get_window_metrics(sample, later, 10.0)
    assert window.num_requests > 0
    assert window.mean_output_tokens == 0.0  # not measured yet
    previous = FrontendMetrics(
        window_s=10.0, num_requests=4, mean_input_tokens=400.0, mean_output_tokens=90.0
    )
    assert get_window_metrics(sample, later, 10.0, previous).mean_output_tokens == 90.0


def test_a_restarted_frontend_counts_from_zero() -> None:
    window = get_window_metrics(parse_frontend_sample(AFTER), parse_frontend_sample(BEFORE), 10.0)
    # every counter went down: the window is BEFORE's counts themselves
    assert window.mean_ttft_ms == pytest.approx(2.6 / 13 * 1000.0)
    assert window.mean_input_tokens == pytest.approx(5000 / 13)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("# TYPE up gauge\nup 1\n", "not an armature frontend"),
        ("<html>not metrics</html>", "not"),
    ],
)
def test_what_is_not_a_frontends_metrics_is_a_scrape_error(text: str, fragment: str) -> None:
    with pytest.raises(ScrapeError, match=fragment):
        parse_frontend_sample(text)


def test_the_frontends_workers_are_counted_and_unseen_ones_named() -> None:
    """Workers the frontend routes to (its per-worker KV series) that the planner's discovery
    does not list: it warns, since it can neither read nor scale them."""
    workers = """\
# HELP armature_worker_kv_capacity_blocks KV blocks of the worker
# TYPE armature_worker_kv_capacity_blocks gauge
armature_worker_kv_capacity_blocks{worker="in-process-0"} 512.0
armature_worker_kv_capacity_blocks{worker="in-process-1"} 512.0
"""
    sample = parse_frontend_sample(BEFORE + workers)
    assert sample.num_workers == 2
    warning = describe_unseen_workers(sample, {})
    assert warning.startswith("the frontend routes to 2 worker(s) that the planner does not ")
    assert describe_unseen_workers(sample, {WorkerRole.AGG: 2}) == ""
    assert describe_unseen_workers(parse_frontend_sample(BEFORE), {}) == ""  # none to route to
    # a frontend from before the series' rename (a rolling upgrade) is read alike
    old_name = workers.replace("kv_capacity_blocks", "kv_blocks_total")
    assert parse_frontend_sample(BEFORE + old_name).num_workers == 2


def test_replicas_windows_are_each_ones_differences_summed() -> None:
    """Two frontend replicas, each counting only its own requests: the fleet's window is the
    sum of each one's differences, a reset (a replica restarted) found in its own counters:
    the second replica went from AFTER's counts down to BEFORE's, which count from zero."""
    before, after = parse_frontend_sample(BEFORE), parse_frontend_sample(AFTER)
    window = get_fleet_window_metrics([(before, after), (after, before)], 10.0)
    # 23 arrived at the first (see above); the second's window is BEFORE itself: 11
    # finished + 3 in flight, less the 5 it had in flight before (its gauge is not a count)
    assert window.num_requests == 23 + 11 + (3 - 5)
    assert window.mean_ttft_ms == pytest.approx((6.6 + 2.6) / (22 + 13) * 1000.0)
    assert window.mean_input_tokens == pytest.approx((10000 + 5000) / (22 + 13))
    assert window.prefix_hit_rate == pytest.approx((3000 + 1000) / (10000 + 5000))
    assert window.num_queued_requests == 4 + 0  # the gauges as they are at the end
    # one replica alone is get_window_metrics
    assert get_fleet_window_metrics([(before, after)], 10.0) == get_window_metrics(
        before, after, 10.0
    )


def test_replicas_that_do_not_all_export_lengths_fall_back_together() -> None:
    """The output length is the finished requests' own where every replica exports it, else
    the streamed tokens of every replica (not a mix of the two measures)."""
    with_hist = (
        parse_frontend_sample(with_lengths(BEFORE, 1000, 11)),
        parse_frontend_sample(with_lengths(AFTER, 3100, 32)),
    )
    plain = (parse_frontend_sample(BEFORE), parse_frontend_sample(AFTER))
    assert get_fleet_window_metrics([with_hist, with_hist], 10.0).mean_output_tokens == (
        pytest.approx(100.0)
    )
    # streamed tokens over the streams that ended, both replicas: 2 x 4,000 / 2 x 21
    assert get_fleet_window_metrics([with_hist, plain], 10.0).mean_output_tokens == (
        pytest.approx(4000 / 21)
    )


def test_replicas_scrapes_sum_into_one_frontends() -> None:
    first = parse_frontend_sample(with_lengths(BEFORE, 1000, 11))
    second = msgspec.structs.replace(
        parse_frontend_sample(with_lengths(AFTER, 3100, 32)),
        num_workers=3,
        slo_ttft_target_s=0.5,
        slo_itl_target_s=0.05,
    )
    total = sum_samples([first, second])
    assert total == FrontendSample(
        model_name="smollm2",
        num_finished_requests=11.0 + 32.0,
        num_in_flight_requests=3.0 + 5.0,
        num_queued_requests=0.0 + 4.0,
        num_prompt_tokens=5000.0 + 15000.0,
        num_cached_tokens=1000.0 + 4000.0,
        num_output_tokens=1200.0 + 5200.0,
        num_first_tokens=13.0 + 35.0,
        ttft_sum_s=pytest.approx(2.6 + 9.2),
        num_token_gaps=1187.0 + 5165.0,
        itl_sum_s=pytest.approx(23.74 + 103.3),
        num_finished_streams=11.0 + 32.0,
        finished_output_tokens=1000.0 + 3100.0,
        num_output_lengths=11.0 + 32.0,
        slo_ttft_target_s=None,  # the replicas judge against different targets: none
        slo_itl_target_s=None,
        num_workers=3,  # one fleet: the most any replica routes to
    )
    assert sum_samples([second, second]).slo_ttft_target_s == 0.5
    assert sum_samples([first, parse_frontend_sample(BEFORE)]).num_output_lengths is None
    other_model = msgspec.structs.replace(first, model_name="other")
    assert sum_samples([first, other_model]).model_name is None
    assert sum_samples([first]) == first
