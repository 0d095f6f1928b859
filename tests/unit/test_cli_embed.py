"""CLI: embedding settings that cannot work end with one line on stderr and exit code 2,
before any model loads: a task the engine cannot serve, a disaggregated embedding fleet, an
unknown task or pooling, a profile of embeddings."""

from __future__ import annotations

from pathlib import Path

import pytest

from armature.cli.main import main
from armature.config import EngineConfig, WorkerConfig, to_argv
from armature.protocols.embedding import Pooling, WorkerTask


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits directly
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (
            ["worker", "--engine", "vllm", "--task", "embed", "--role", "decode"],
            "--task embed takes no --role",
        ),
        (
            ["worker", "--engine", "mocker", "--task", "embed", "--role", "prefill"],
            "--task embed takes no --role",
        ),
        (
            ["serve", "--task", "embed", "--prefill-workers", "1", "--decode-workers", "1"],
            "--task embed takes no --role prefill/decode",
        ),
        (["worker", "--task", "embed", "--role", "decode"], "--task embed takes no --role"),
        (
            ["serve", "--task", "classify"],
            "argument --task: expected one of generate, embed, got 'classify'",
        ),
        (
            ["worker", "--pooling", "max"],
            "argument --pooling: expected one of mean, last, cls, got 'max'",
        ),
        (
            ["profile", "--task", "embed", "--output", "unused.json"],
            "--task embed: the profiler sweeps text generation only",
        ),
    ],
)
def test_embedding_mistakes_exit_2_with_one_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if argv[0] == "worker":
        argv = [*argv, "--discovery-dir", str(tmp_path)]
    code, err = run(argv, capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("armature: error: ")
    assert fragment in err


def test_task_and_pooling_reach_a_worker_command_line() -> None:
    config = WorkerConfig(engine=EngineConfig(task=WorkerTask.EMBED, pooling=Pooling.MEAN))
    assert to_argv(config) == ["--task", "embed", "--pooling", "mean"]
