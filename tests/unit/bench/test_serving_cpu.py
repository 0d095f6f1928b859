"""bench/serving_cpu's reading of a py-spy collapsed profile."""

from __future__ import annotations

from pathlib import Path

from bench.serving_cpu import top_frames


def test_top_frames_counts_stacks_and_joins_a_stack_split_over_lines(tmp_path: Path) -> None:
    profile = tmp_path / "p.txt"
    profile.write_text(
        "main (a.py:1);encode (b.py:7) 3\n"
        "main (a.py:2);send (c.py:9) 1\n"
        "main (a.py:3);<module> (doc with a\n"  # a frame name holding a newline
        "newline:4) 5\n"
    )
    frames = top_frames(profile, 10)
    assert [(f, round(on_stack, 1), round(own, 1)) for f, on_stack, own in frames] == [
        ("main (a.py)", 100.0, 0.0),
        ("<module> (doc with a\nnewline)", 55.6, 55.6),
        ("encode (b.py)", 33.3, 33.3),
        ("send (c.py)", 11.1, 11.1),
    ]
