"""Addressing (DESIGN §2): `namespace/component/endpoint[/instance]`, one parser.

A name part is 1-64 characters of [A-Za-z0-9_-] (so addresses are safe as discovery keys,
file names and NATS subjects); an instance id is a 64-bit integer written in lowercase hex.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from armature.errors import ArmatureError

__all__ = ["AddressError", "EndpointAddress"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class AddressError(ArmatureError, ValueError):
    """A malformed address or name."""


def _check_name(kind: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise AddressError(
            f"invalid {kind} {value!r}: use 1-64 characters of letters, digits, '_' or '-'"
        )
    return value


@dataclass(frozen=True)
class EndpointAddress:
    namespace: str
    component: str
    endpoint: str
    instance_id: int | None = None

    def __post_init__(self) -> None:
        _check_name("namespace", self.namespace)
        _check_name("component", self.component)
        _check_name("endpoint", self.endpoint)
        if self.instance_id is not None and not 0 <= self.instance_id < 2**64:
            raise AddressError(f"instance id out of range: {self.instance_id}")

    @classmethod
    def parse(cls, text: str) -> EndpointAddress:
        parts = text.split("/")
        if len(parts) not in (3, 4):
            raise AddressError(
                f"invalid address {text!r}: expected namespace/component/endpoint[/instance]"
            )
        instance: int | None = None
        if len(parts) == 4:
            if not re.fullmatch(r"[0-9a-f]{1,16}", parts[3]):
                raise AddressError(f"invalid instance id {parts[3]!r}: expected lowercase hex")
            instance = int(parts[3], 16)
        return cls(parts[0], parts[1], parts[2], instance)

    def with_instance(self, instance_id: int) -> EndpointAddress:
        return EndpointAddress(self.namespace, self.component, self.endpoint, instance_id)

    def __str__(self) -> str:
        base = f"{self.namespace}/{self.component}/{self.endpoint}"
        return base if self.instance_id is None else f"{base}/{self.instance_id:x}"
