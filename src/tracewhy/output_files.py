"""Where a command's output file goes: never over its input, never over a device, FIFO or
socket, through a symlink to its target, and atomically (a reader never sees half a file)."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from tracewhy.errors import UsageError

#: ``-o -`` writes to standard output instead of a file.
STDOUT = "-"


def refuse_overwrite(out: Path, source: Path) -> None:
    """A UsageError if writing ``out`` would replace the input: the same file (by path, or by
    inode through a link); or if ``out`` would go into an input directory of rank traces, new
    or not: the next read of that directory would take the output for one of its inputs."""
    if str(out) == STDOUT:
        return
    try:
        target, input_path = out.resolve(), source.resolve()
        in_input_dir = source.is_dir() and target.parent == input_path
    except (OSError, RuntimeError):  # (a symlink loop: the write names the problem)
        return
    if in_input_dir and not out.exists():
        raise UsageError(f"{out}: the output would go into {source}, a directory read as input (the next read "
                         "would take it for one of its traces); choose -o FILE outside it")
    same = target == input_path or in_input_dir
    if not same and out.exists():
        try:
            same = os.path.samefile(out, source)
        except OSError:
            same = False
    if same:
        raise UsageError(f"{out}: the output would overwrite the input trace; choose another -o FILE")


def refuse_same_output(outputs: dict[str, str | None]) -> None:
    """A UsageError when two output options (option name: path) name one file: the second
    write would replace the first (on standard output, ``-``, the two would run together)."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = STDOUT if path == STDOUT else os.path.realpath(path)
        if key in seen:
            where = "standard output" if key == STDOUT else "this file"
            raise UsageError(f"{path}: {seen[key]} and {option} both name {where}; give each its own")
        seen[key] = option


def refuse_special_output(path: Path) -> None:
    """A UsageError when ``path`` (after its symlinks) exists and is not a regular file: a
    replace would turn a device node, FIFO or socket into a plain file (run as root,
    ``-o /dev/full`` did), and writing into one is not what ``-o`` promises."""
    if str(path) == STDOUT:
        return
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"{path}: cannot write ({e.strerror or e})") from None
    if stat.S_ISREG(mode):
        return
    what = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")
    raise UsageError(f"{path}: is {what}; -o writes only regular files (use -o - to write to standard output)")


def write_output(path: Path, data: bytes) -> None:
    """``data`` to ``path``: standard output for ``-``; otherwise a new regular file, or an
    existing regular file replaced in one rename. A symlink is followed, so its target gets the
    data and the link stays a link."""
    if str(path) == STDOUT:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    refuse_special_output(path)
    target = Path(os.path.realpath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as e:
        raise UsageError(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        try:  # an existing file keeps its permissions; a new one gets what open() would give it
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as e:
        os.unlink(tmp)
        raise UsageError(f"{path}: cannot write ({e.strerror or e})") from None


def write_files(directory: Path, files: Iterable[tuple[str, Callable[[], bytes]]], source: Path,
                option: str = "--parquet") -> list[Path]:
    """Each ``(name, make)`` as ``DIRECTORY/name``, made and written one at a time, atomically;
    the directory is made when absent (``option`` names the option that gave it, for errors)."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory}: {option} needs a directory, and this is a file")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{directory}: cannot make the directory ({e.strerror or e})") from None
    written = []
    for name, make in files:
        path = directory / name
        refuse_overwrite(path, source)
        write_output(path, make())
        written.append(path)
    return written
