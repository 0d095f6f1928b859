"""EndpointAddress: one parser, round trips, clear errors."""

from __future__ import annotations

import pytest

from armature.protocols.address import AddressError, EndpointAddress


def test_parse_and_format_round_trip() -> None:
    a = EndpointAddress.parse("dyn/worker/generate")
    assert a == EndpointAddress("dyn", "worker", "generate")
    assert str(a) == "dyn/worker/generate"
    b = EndpointAddress.parse("dyn/worker/generate/1f")
    assert b.instance_id == 31 and str(b) == "dyn/worker/generate/1f"
    assert a.with_instance(31) == b


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dyn/worker", "expected namespace/component/endpoint"),
        ("a/b/c/d/e", "expected namespace/component/endpoint"),
        ("dyn//generate", "invalid component"),
        ("dyn/wor ker/generate", "invalid component"),
        ("dyn/worker/gen.erate", "invalid endpoint"),
        ("dyn/worker/generate/XYZ", "invalid instance id"),
        ("dyn/worker/generate/12345678901234567", "invalid instance id"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(AddressError, match=message):
        EndpointAddress.parse(text)
