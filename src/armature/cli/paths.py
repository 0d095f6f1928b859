"""The files a command reads and writes, as one-line errors: a trace it cannot read, and the
outputs it writes after its work (a search, a sweep, a replay), checked before it starts so
that a path that cannot be written is not a traceback once the work is lost."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from armature.cli.options import CliError

if TYPE_CHECKING:
    from armature.workload.traces import TraceRequest

__all__ = ["check_apart", "check_file", "check_image", "make_dir", "read_trace", "writing"]


def read_trace(
    path: Path, *, limit: int | None = None, time_scale: float = 1.0
) -> list[TraceRequest]:
    """`read_mooncake_trace` of `path`; CliError when it is not a readable trace file."""
    from armature.workload.traces import TraceFormatError, read_mooncake_trace

    if path.is_dir():
        raise CliError(f"trace file {path} is a directory")
    if not path.exists():  # a pipe (`<(...)`) or a device is read as it comes
        raise CliError(f"trace file {path} does not exist")
    try:
        return read_mooncake_trace(path, limit=limit, time_scale=time_scale)
    except TraceFormatError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot read trace {path}: {exc.strerror}") from None


def check_apart(
    outputs: Mapping[str, str | None],
    inputs: Mapping[str, str | None],
    directory: tuple[str, str | None] = ("", None),
) -> None:
    """CliError where a file a command writes (`outputs`, by flag) is one it reads
    (`inputs`) or another output, or where an input lies under the `directory` (flag, path)
    whose files it writes: the output would overwrite it. Unset flags (None) are skipped."""
    taken = {Path(value).resolve(): flag for flag, value in inputs.items() if value}
    flag_dir, value_dir = directory
    if value_dir:
        under = Path(value_dir).resolve()
        for path, flag in taken.items():
            if path.is_relative_to(under):
                raise CliError(
                    f"{flag} {path} is under {flag_dir} {value_dir}, whose files this command "
                    "writes; give another directory"
                )
    for flag, value in outputs.items():
        if not value:
            continue
        path = Path(value).resolve()
        if path in taken:
            raise CliError(
                f"{flag} {value} is the file {taken[path]} names; writing it would lose that"
            )
        taken[path] = flag


@contextlib.contextmanager
def writing(flag: str, path: Path | str) -> Iterator[None]:
    """Within: an OSError writing the output `flag` names (`path`, a file or a directory) is
    a one-line CliError naming the flag and the file (outputs are written whole or not at
    all, armature.outputs: the file that was there is kept)."""
    try:
        yield
    except OSError as exc:
        name = exc.filename
        what = "it" if name is None or str(name) == str(path) else str(name)
        raise CliError(f"{flag} {path}: cannot write {what}: {exc.strerror or exc}") from None


def make_dir(path: Path, flag: str) -> None:
    """Make directory `path` (and its parents) if missing; CliError when it cannot be made
    or written."""
    _make_dir(path, f"{flag} {path}", "the directory")


def check_file(path: Path, flag: str) -> None:
    """`path` can be written as a file: not a directory, its directory made, and the file
    opened for writing (then left as it was: a file made for the check is removed)."""
    if path.is_dir():
        raise CliError(f"{flag} {path} is a directory (give a file)")
    _make_dir(path.parent, f"{flag} {path}", f"its directory {path.parent}")
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise CliError(f"{flag} {path}: cannot write it: {exc.strerror}") from None
    if not existed:
        path.unlink(missing_ok=True)


def _make_dir(path: Path, what: str, directory: str) -> None:
    """`make_dir`, its errors led by `what` (the flag and the path it was given) and naming
    the directory as `directory`."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CliError(f"{what}: {_first_file(path)} is not a directory") from None
    except OSError as exc:
        raise CliError(f"{what}: cannot make {directory}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliError(f"{what}: {directory} is not writable")


def check_image(path: Path, flag: str) -> None:
    """`check_file` for a plot, whose format is its extension (one matplotlib writes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if path.is_dir():
        raise CliError(f"{flag} {path} is a directory (give an image file, e.g. a .png)")
    formats = set(FigureCanvasAgg.get_supported_filetypes())
    if path.suffix.lstrip(".").lower() not in formats:
        raise CliError(
            f"{flag} {path}: give the image's format as its extension, one of "
            f"{', '.join(sorted(formats))}"
        )
    check_file(path, flag)


def _first_file(path: Path) -> Path:
    """The first of `path` and its parents that exists (a file, where a directory was
    wanted)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return path
