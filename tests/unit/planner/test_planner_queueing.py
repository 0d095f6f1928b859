"""Erlang C and the waiting-time tail, against hand-worked values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armature.planner.queueing import erlang_c, get_min_servers, get_wait_attainment


def test_erlang_c_two_servers_one_erlang() -> None:
    """c = 2, a = 1: B(1) = 1/(1+1) = 1/2, B(2) = 1 (1/2) / (2 + 1/2) = 1/5; rho = 1/2;
    C = (1/5) / (1 - (1/2)(4/5)) = (1/5) / (3/5) = 1/3 (the textbook value)."""
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 2.0) == 1.0  # saturated: everyone waits


def test_wait_attainment_and_min_servers() -> None:
    """lam = 1/s, s = 1 s, slack 1 s. c = 2: 1 - (1/3) e^-(2 - 1) = 0.87737.
    c = 3: B(3) = 1 (1/5) / (3 + 1/5) = 1/16, rho = 1/3, C = (1/16) / (1 - (1/3)(15/16))
    = 1/11; 1 - (1/11) e^-(3 - 1) = 0.98770. So 0.95 needs 3 servers."""
    assert get_wait_attainment(2, 1.0, 1.0, 1.0) == pytest.approx(1 - math.exp(-1) / 3)
    assert get_wait_attainment(3, 1.0, 1.0, 1.0) == pytest.approx(1 - math.exp(-2) / 11)
    assert get_min_servers(1.0, 1.0, 1.0, 0.95, max_servers=10) == 3
    assert get_min_servers(1.0, 1.0, 1.0, 0.95, max_servers=2) is None


def test_m_g_c_scaling_and_edges() -> None:
    """Constant service (cv2 = 0) doubles the tail's decay: 1 - (1/3) e^-2."""
    assert get_wait_attainment(2, 1.0, 1.0, 1.0, service_cv2=0.0) == pytest.approx(
        1 - math.exp(-2) / 3
    )
    assert get_wait_attainment(1, 0.0, 1.0, 0.0) == 1.0  # no arrivals never wait
    assert get_wait_attainment(4, 1.0, 1.0, -0.1) == 0.0  # service alone misses the target
    assert get_wait_attainment(2, 3.0, 1.0, 10.0) == 0.0  # overloaded


@settings(max_examples=300, deadline=None)
@given(
    rate=st.one_of(st.just(0.0), st.floats(0.01, 60.0)),
    service_s=st.one_of(st.just(0.0), st.floats(0.01, 20.0)),
    slack_s=st.one_of(st.just(-1.0), st.just(0.0), st.floats(0.0, 10.0)),
    attainment=st.sampled_from([0.0, 0.5, 0.9, 0.95, 0.99, 1.0]),
    max_servers=st.integers(1, 400),
    cv2=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
)
def test_min_servers_is_the_first_count_whose_attainment_meets(
    rate: float,
    service_s: float,
    slack_s: float,
    attainment: float,
    max_servers: int,
    cv2: float,
) -> None:
    """The search (Erlang B carried from count to count) against its definition: the first
    count from floor(lam s) whose `get_wait_attainment` meets, each computed alone."""
    start = max(1, math.floor(rate * service_s))
    expected = next(
        (
            c
            for c in range(start, max_servers + 1)
            if get_wait_attainment(c, rate, service_s, slack_s, cv2) >= attainment
        ),
        None,
    )
    found = get_min_servers(
        rate, service_s, slack_s, attainment, max_servers=max_servers, service_cv2=cv2
    )
    assert found == expected
