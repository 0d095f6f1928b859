"""Request-plane frames: a Fail frame carries a FailureCode by its value, and a code this
build does not know is refused at decode."""

from __future__ import annotations

import msgspec
import pytest

from armature.protocols.failures import FailureCode
from armature.runtime.frames import Fail, FrameError, decode_frame, encode_message


@pytest.mark.parametrize("code", list(FailureCode))
def test_a_fail_frame_round_trips_each_code(code: FailureCode) -> None:
    body = encode_message(Fail(3, code, "why"))
    assert body == msgspec.msgpack.encode(
        {"type": "fail", "stream_id": 3, "code": code.value, "message": "why"}
    )
    decoded = decode_frame(body)
    assert decoded == Fail(3, code, "why") and decoded.code is code  # type: ignore[union-attr]


def test_the_codes_are_the_wire_strings() -> None:
    assert [c.value for c in FailureCode] == [
        "invalid_request",
        "not_found",
        "unavailable",
        "internal",
    ]


def test_an_unknown_code_is_refused_at_decode() -> None:
    body = msgspec.msgpack.encode(
        {"type": "fail", "stream_id": 3, "code": "overloaded", "message": "why"}
    )
    with pytest.raises(FrameError, match="Invalid enum value 'overloaded'"):
        decode_frame(body)
