"""The buckets of every request-latency histogram (the frontend's TTFT, ITL and end to end, a
worker's own TTFT), so that the frontend's and a worker's series compare bucket by bucket."""

from __future__ import annotations

__all__ = ["LATENCY_BUCKETS_S"]

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)
