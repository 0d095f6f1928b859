"""API keys: Bearer parsing, constant-time comparison against every key, key files."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.config.edge import SecurityConfig
from armature.errors import ConfigError
from armature.frontend.auth import ApiKeys, load_api_keys, read_key_file


def test_accepts_only_a_bearer_with_a_known_key() -> None:
    keys = ApiKeys(["sk-one", "sk-two"])
    assert keys.accepts(b"Bearer sk-one") and keys.accepts(b"Bearer sk-two")
    assert keys.accepts(b"Bearer sk-two ")  # surrounding spaces of the header are ignored
    # the scheme is case-insensitive (RFC 9110; lowercase was refused)
    assert keys.accepts(b"bearer sk-one") and keys.accepts(b"BEARER sk-two")
    for header in (
        None,
        b"",
        b"sk-one",
        b"Basic sk-one",
        b"Bearer ",
        b"Bearer sk-on",
        b"Bearer SK-ONE",  # the key itself is not
        b"bearersk-one",
    ):
        assert not keys.accepts(header), header
    with pytest.raises(ValueError, match="no API key"):
        ApiKeys(["", ""])


def test_key_files_skip_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team a\nsk-a\n\n  sk-b  \n# old: sk-c\n")
    assert read_key_file(path) == ["sk-a", "sk-b"]


@pytest.mark.parametrize(
    ("keys", "content", "fragment"),
    [
        (("sk-\udcff",), None, "--api-key must be printable ASCII"),  # bytes argv cannot decode
        (("sk-é",), None, "--api-key must be printable ASCII"),
        ((), b"sk-\xff\xfe\n", "is not UTF-8 text"),
        ((), "sk-\u00e9\n".encode(), "holds a key that is not printable ASCII"),
    ],
)
def test_a_key_no_client_can_send_is_a_config_error(
    tmp_path: Path, keys: tuple[str, ...], content: bytes | None, fragment: str
) -> None:
    path = None
    if content is not None:
        path = tmp_path / "keys"
        path.write_bytes(content)
    security = SecurityConfig(api_keys=keys, api_key_file=None if path is None else str(path))
    with pytest.raises(ConfigError, match=fragment):
        load_api_keys(security)
