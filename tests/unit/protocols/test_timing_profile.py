"""The timing profile file: a round trip keeps every field; unreadable files, other versions
and other JSON are refused with one line naming the file."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from armature.protocols.timing_profile import (
    PROFILE_VERSION,
    DecodePoint,
    PrefillPoint,
    ProfileError,
    ProfileSource,
    TimingProfile,
    read_profile,
    write_profile,
)
from profiles import make_load_check

PROFILE = TimingProfile(
    version=PROFILE_VERSION,
    source=ProfileSource(
        machine="Intel(R) Xeon(R) Processor",
        engine="torch",
        model="SmolLM2-135M-Instruct",
        dtype="bfloat16",
        device="cpu",
        flags={"max-num-seqs": "16"},
        created_at="2026-11-24T15:00:00+00:00",
    ),
    max_num_batched_tokens=1024,
    max_num_seqs=16,
    block_size_tokens=16,
    num_kv_blocks=2048,
    prefill=[PrefillPoint(num_requests=1, input_tokens=64, ttft_ms=81.5, tokens_per_s=785.3)],
    decode=[DecodePoint(num_requests=4, context_tokens=137, itl_ms=95.25, tokens_per_s=42.0)],
)


LOAD = make_load_check(41.3, 38.9, num_requests=48, request_rate_per_s=1.62, num_steps=710)


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "profile.json"
    write_profile(PROFILE, path)
    assert read_profile(path) == PROFILE
    assert path.read_text().startswith('{\n  "version": 2,\n  "source": {\n')
    loaded = msgspec.structs.replace(PROFILE, load=LOAD)
    write_profile(loaded, path)
    assert read_profile(path) == loaded


def test_a_file_written_before_load_passes_reads_without_one(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    body = msgspec.json.decode(msgspec.json.encode(PROFILE))
    del body["load"]
    path.write_bytes(msgspec.json.encode(body))
    assert read_profile(path) == PROFILE
    assert read_profile(path).load is None


def test_a_load_pass_without_modeled_time_is_refused(tmp_path: Path) -> None:
    """Its factor (measured over modeled) would not be a number."""
    path = tmp_path / "p.json"
    write_profile(
        msgspec.structs.replace(PROFILE, load=msgspec.structs.replace(LOAD, modeled_s=0.0)), path
    )
    with pytest.raises(ProfileError, match=r"Expected `float` > 0.0 - at `\$.load.modeled_s`"):
        read_profile(path)


def test_a_load_pass_with_negative_class_time_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    bad = msgspec.structs.replace(LOAD, prompt_measured_s=2.0, decode_modeled_s=-1.0)
    write_profile(msgspec.structs.replace(PROFILE, load=bad), path)
    with pytest.raises(ProfileError, match=r">= 0.0 - at `\$.load.decode_modeled_s`"):
        read_profile(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"version": 1, "source": {}}',
            "is a timing profile of version 1; this armature reads version 2 (profile the",
        ),
        ('{"source": {}}', "is not a timing profile (write one with `armature profile"),
        ("not json", "is not a timing profile"),
        ("[1, 2]", "is not a timing profile"),
        ('{"version": 2, "source": {}}', "is not a valid timing profile: Object missing"),
    ],
)
def test_bad_files_are_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ProfileError) as refused:
        read_profile(path)
    assert str(refused.value).startswith(str(path))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_limits_below_one_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_profile(msgspec.structs.replace(PROFILE, num_kv_blocks=0), path)
    with pytest.raises(
        ProfileError,
        match=r"not a valid timing profile: Expected `int` >= 1 - at `\$.num_kv_blocks`",
    ):
        read_profile(path)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"cannot read timing profile .*: No such file"):
        read_profile(tmp_path / "absent.json")
