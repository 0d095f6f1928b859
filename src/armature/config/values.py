"""Value parsers for settings: text (a flag or a variable) -> value, or a ConfigError that
says what was wrong."""

from __future__ import annotations

import enum
import itertools
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import TypeVar

from armature.errors import ConfigError
from armature.protocols.worker import WorkerRole

__all__ = [
    "TRANSFER_BACKENDS",
    "api_key",
    "float_at_least",
    "float_at_most",
    "fraction",
    "http_url",
    "int64",
    "int_at_least",
    "int_between",
    "integer",
    "lora_module",
    "non_negative_float",
    "non_negative_int",
    "one_of",
    "parse_bytes",
    "port",
    "positive_float",
    "positive_int",
    "positive_ints",
    "positive_ints_or_none",
    "transfer_backends",
    "worker_role",
]

TRANSFER_BACKENDS = ("shm", "nixl", "tcp")
E = TypeVar("E", bound=enum.StrEnum)

# a number, then a unit: B, or a prefix (k, m, g, t, with i for powers of two) and an
# optional B; `i` needs a prefix before it (`1ib` is no size)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*((?:[kmgt]i?)?b?)\s*$", re.IGNORECASE)
MAX_BYTES = 2**63  # sizes end up in C long longs and numpy int64s
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}


def parse_bytes(text: str) -> int:
    """'1073741824', '1GiB', '512MiB', '2G' -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1000000)")
    unit = (match.group(2) or "").lower().removesuffix("b")
    number = match.group(1)
    # whole numbers exactly; a fraction through a float (inf past float's range)
    scaled = int(number) * _UNITS[unit] if "." not in number else float(number) * _UNITS[unit]
    if not scaled < MAX_BYTES:  # inf included (NaN cannot be written)
        given = text.strip()
        shown = given if len(given) <= 32 else f"{given[:20]}... ({len(given)} characters)"
        raise ConfigError(f"size {shown} is too large (at most 2**63 - 1 bytes)")
    value = int(scaled)
    if value <= 0:
        raise ConfigError("size must be positive")
    return value


def _number(text: str, kind: type[int] | type[float], *, allow_zero: bool) -> float:
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise ConfigError(f"not {noun}: {text!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {text.strip()}")
    if not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "positive"
        raise ConfigError(f"must be {bound}, got {text.strip()}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, allow_zero=False))


MAX_KV_BLOCKS = 2**31 - 2
"""The most blocks one KV cache holds: the block pool's native core numbers them in 32 bits."""


def kv_blocks(text: str) -> int:
    """A count of KV blocks: positive, at most MAX_KV_BLOCKS."""
    return _at_most_kv_blocks(positive_int(text), "32-bit block ids")


def tier_blocks(text: str) -> int:
    """A lower KV tier's capacity in blocks: positive, at most MAX_KV_BLOCKS, as a cache's
    (the router's index counts a tier's blocks in machine integers)."""
    return _at_most_kv_blocks(positive_int(text), "as many as a KV cache")


def _at_most_kv_blocks(value: int, why: str) -> int:
    if value > MAX_KV_BLOCKS:
        raise ConfigError(f"must be at most {MAX_KV_BLOCKS:,} ({why}), got {value:,}")
    return value


def non_negative_int(text: str) -> int:
    return int(_number(text, int, allow_zero=True))


def positive_float(text: str) -> float:
    return _number(text, float, allow_zero=False)


def non_negative_float(text: str) -> float:
    return _number(text, float, allow_zero=True)


def at_least_one(text: str) -> float:
    """A finite number >= 1 (a factor that only grows)."""
    value = positive_float(text)
    if value < 1.0:
        raise ConfigError(f"must be >= 1, got {text.strip()}")
    return value


def load_bound(text: str) -> float:
    """0 (no bound) or a finite number above 1 (a multiple of the mean)."""
    value = non_negative_float(text)
    if value != 0 and value <= 1.0:
        raise ConfigError(f"must be 0 (none) or above 1, got {text.strip()}")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"not an integer: {text!r}") from None


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise ConfigError(f"port must be 1..65535, got {value}")
    return value


def non_empty(text: str) -> str:
    """A path or URL given as text: not empty (an empty one read as "none" turned nothing on
    without a word)."""
    if not text.strip():
        raise ConfigError(f"must not be empty, got {text!r}")
    return text


def api_key(text: str) -> str:
    """One API key: no comma. The keys travel on as one comma list (ARMATURE_API_KEYS: to
    serve's frontend replicas, from the Helm chart's Secret), which would split such a key in
    two. The key is never shown: it is a secret."""
    if "," in text:
        raise ConfigError(
            "an API key must hold no comma (ARMATURE_API_KEYS, a comma list, would split it in two)"
        )
    return text


def listen_host(text: str) -> str:
    """An address to listen on: not empty (a server given "" listens on every interface),
    no spaces (0.0.0.0 says every interface on purpose)."""
    value = text.strip()
    if not value or any(c.isspace() for c in value):
        raise ConfigError(f"must be a host name or an IP address, got {text!r}")
    return value


def http_url(text: str) -> str:
    """An http(s) URL with a host (and a valid port, if any)."""
    url = text.strip()
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range or not a number
    except ValueError as exc:
        raise ConfigError(f"not a valid URL: {url!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"must be an http:// or https:// URL with a host, got {url!r}")
    return url


def int_at_least(low: int) -> Callable[[str], int]:
    """A parser of integers from `low` up."""

    def parse(text: str) -> int:
        value = integer(text)
        if value < low:
            raise ConfigError(f"must be at least {low}, got {value}")
        return value

    return parse


def int_between(low: int, high: int) -> Callable[[str], int]:
    """A parser of integers in low..high (both included)."""

    def parse(text: str) -> int:
        value = integer(text)
        if not low <= value <= high:
            raise ConfigError(f"must be {low}..{high}, got {value}")
        return value

    return parse


def float_at_least(low: float) -> Callable[[str], float]:
    """A parser of positive numbers from `low` (included) up."""

    def parse(text: str) -> float:
        value = positive_float(text)
        if value < low:
            raise ConfigError(f"must be at least {low:g}, got {text.strip()}")
        return value

    return parse


def float_at_most(high: float) -> Callable[[str], float]:
    """A parser of positive numbers up to `high` (included)."""

    def parse(text: str) -> float:
        value = positive_float(text)
        if value > high:
            raise ConfigError(f"must be at most {high:g}, got {text.strip()}")
        return value

    return parse


def int64(text: str) -> int:
    """A 64-bit signed integer (seeds: torch generators take no larger one)."""
    return int_between(-(2**63), 2**63 - 1)(text)


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"expected a number in 0..1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"expected a number in 0..1, got {text!r}")
    return value


def worker_role(text: str) -> WorkerRole:
    return one_of(WorkerRole)(text)


def one_of(kind: type[E]) -> Callable[[str], E]:
    """A parser of the values of the string enum `kind`."""

    def parse(text: str) -> E:
        try:
            return kind(text)
        except ValueError:
            known = ", ".join(kind)
            raise ConfigError(f"expected one of {known}, got {text!r}") from None

    parse.__name__ = kind.__name__
    return parse


def positive_ints(text: str) -> tuple[int, ...]:
    """'64,256,1024' -> (64, 256, 1024): positive, strictly increasing."""
    parts = text.split(",")
    if any(not part.strip() for part in parts):  # '1,,2': a value left out
        raise ConfigError(f"expected increasing positive integers like 64,256,1024, got {text!r}")
    values = tuple(positive_int(part) for part in parts)
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ConfigError(f"expected increasing positive integers like 64,256,1024, got {text!r}")
    return values


def positive_ints_or_none(text: str) -> tuple[int, ...]:
    """As `positive_ints`; '0' -> () (none)."""
    return () if text.strip() == "0" else positive_ints(text)


def transfer_backends(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in TRANSFER_BACKENDS]
    if unknown or "tcp" not in names:
        raise ConfigError(f"expected a comma list of shm,nixl,tcp that includes tcp, got {text!r}")
    return names


def lora_module(text: str) -> str:
    """`NAME=DIR`: a LoRA adapter's name and directory (kept as written; see
    `EngineConfig.get_lora_modules`)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ConfigError(f"expected NAME=DIR (a LoRA adapter's name and directory), got {text!r}")
    return text
