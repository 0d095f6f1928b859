"""Writing benchmark results: markdown tables, machine facts, and one marked section per
script in a markdown file.

A section is everything between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; a run
replaces its own section in place (or appends it) and leaves every other section alone.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.paths import REPO_ROOT

__all__ = [
    "MachineFacts",
    "Section",
    "command_line",
    "get_machine_facts",
    "markdown_table",
    "write_section",
]

_DOC_HEADER = (
    "# Benchmarks\n\n"
    "Each section below is written by one script in `bench/`, run from the repository root as "
    "`python -m bench.NAME` (full runs only; `--quick` smoke runs write to `bench/out/`). "
    "Re-running a script replaces its own section.\n"
)


@dataclass(frozen=True)
class MachineFacts:
    cpu_model: str
    num_cpus: int  # logical CPUs this process may run on
    num_torch_threads: int
    torch_version: str
    transformers_version: str
    python_version: str
    git_revision: str

    def as_markdown(self, dtype: str, device: str) -> str:
        return (
            f"{self.cpu_model}, {self.num_cpus} CPUs, torch threads {self.num_torch_threads}; "
            f"torch {self.torch_version}, transformers {self.transformers_version}, "
            f"Python {self.python_version}; dtype {dtype}, device {device}; "
            f"git {self.git_revision}"
        )


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    match = re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or "unknown CPU"


def _git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{rev}{' (dirty)' if dirty else ''}"


def get_machine_facts() -> MachineFacts:
    import torch
    import transformers

    return MachineFacts(
        cpu_model=_cpu_model(),
        num_cpus=len(os.sched_getaffinity(0)),
        num_torch_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        python_version=platform.python_version(),
        git_revision=_git_revision(),
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; floats are shown with up to 2 decimals."""

    def cell(value: object) -> str:
        return f"{value:,.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line(argv: Sequence[str], main_module: str | None) -> str:
    """A command as a section quotes it: `python -m MODULE ARGS` for a script run as a module
    (`main_module`, how bench/ is run), else `python SCRIPT ARGS`."""
    program = ["-m", main_module] if main_module is not None else list(argv[:1])
    return shlex.join(["python", *program, *argv[1:]])


def _this_command_line() -> str:
    spec = sys.modules["__main__"].__spec__
    return command_line(sys.argv, spec.name if spec is not None else None)


@dataclass(frozen=True)
class Section:
    name: str  # the marker name: <!-- bench:NAME -->
    title: str
    body: str  # markdown: tables and notes
    dtype: str
    device: str = "cpu"

    def render(self, facts: MachineFacts) -> str:
        command = _this_command_line()
        date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        return (
            f"<!-- bench:{self.name} -->\n"
            f"## {self.title}\n\n"
            f"- Command: `{command}`\n"
            f"- Date: {date}\n"
            f"- Machine: {facts.as_markdown(self.dtype, self.device)}\n\n"
            f"{self.body.strip()}\n"
            f"<!-- /bench:{self.name} -->\n"
        )


def write_section(path: Path, section: Section, facts: MachineFacts) -> None:
    """Replace `section`'s marked block in `path` (creating the file or appending the block
    if absent). Everything outside the markers is kept byte for byte."""
    text = path.read_text() if path.exists() else _DOC_HEADER
    block = section.render(facts)
    name = re.escape(section.name)
    pattern = re.compile(rf"<!-- bench:{name} -->\n.*?<!-- /bench:{name} -->\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
