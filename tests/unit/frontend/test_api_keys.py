"""API keys: Bearer parsing, constant-time comparison against every key, key files."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.frontend.auth import ApiKeys, read_key_file


def test_accepts_only_a_bearer_with_a_known_key() -> None:
    keys = ApiKeys(["sk-one", "sk-two"])
    assert keys.accepts(b"Bearer sk-one") and keys.accepts(b"Bearer sk-two")
    assert keys.accepts(b"Bearer sk-two ")  # surrounding spaces of the header are ignored
    for header in (
        None,
        b"",
        b"sk-one",
        b"Basic sk-one",
        b"Bearer ",
        b"Bearer sk-on",
        b"bearer sk-one",
    ):
        assert not keys.accepts(header), header
    with pytest.raises(ValueError, match="no API key"):
        ApiKeys(["", ""])


def test_key_files_skip_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team a\nsk-a\n\n  sk-b  \n# old: sk-c\n")
    assert read_key_file(path) == ["sk-a", "sk-b"]
