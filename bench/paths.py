"""Where the benchmarks read and write: the repository, the results file, the traces."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DOCS_OUT", "REPO_ROOT", "SCRATCH_OUT", "TRACES_DIR", "image_dir", "results_path"]

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS_OUT = REPO_ROOT / "docs" / "benchmarks.md"
SCRATCH_OUT = REPO_ROOT / "bench" / "out" / "benchmarks.md"  # git-ignored
# the Mooncake traces (DESIGN §4), beside the repository
TRACES_DIR = REPO_ROOT.parent / "shared" / "data" / "traces"


def results_path(quick: bool) -> Path:
    """The file a run writes its section into: the scratch file for a --quick smoke run."""
    return SCRATCH_OUT if quick else DOCS_OUT


def image_dir(results: Path) -> Path:
    """Where a run's plots go: docs/img/ beside the published results, else the folder of the
    file the run writes (a smoke run's, or one by hand with --out), so that only a published
    run replaces the published plots."""
    return REPO_ROOT / "docs" / "img" if results == DOCS_OUT else results.parent
