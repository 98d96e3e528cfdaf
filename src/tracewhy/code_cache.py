"""The methods ``dataclasses`` writes for a command's classes, compiled once and kept.

For every dataclass, the standard library writes the source of ``__init__``, ``__repr__``,
``__eq__`` (and, frozen, ``__hash__``, ``__setattr__``, ``__delattr__``) and compiles it with
``exec`` as the class is made. A diagnosis imports about 110 of them: 585 functions, whose
compiling took 54-66 ms of the 67-83 ms the classes took to make (Python 3.11), about a tenth of
a command on a 1 MB trace, and the same text every time. Python keeps a module's compiled code in
``__pycache__``; these functions are not in any module's code, so a command keeps them itself:
while it runs, ``dataclasses`` compiles through ``_exec`` here, which looks the source text up in
a table of code objects kept from earlier runs of that command (``marshal``, the format of
``.pyc`` files) and compiles only what the table lacks, as ``exec`` would (file ``<string>``, no
``__future__`` flags inherited: the same code object). The table is written back when something
was missing, so the first run of a command on a machine, or after an upgrade, fills it.

The table is code, so it is trusted as ``.pyc`` files are and no further: it is read only if it
and its directory belong to this user and nobody else can write to them, and only for the
interpreter whose bytecode it holds (``importlib.util.MAGIC_NUMBER``). A table that cannot be
read, is of another shape or cannot be written costs the compiling, nothing else.
``TRACEWHY_NO_CODE_CACHE=1`` turns it off. Standard library only: the command line starts it
before its own imports.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib.util
import marshal
import os
import stat
import sys
import types
from pathlib import Path
from typing import Any, Final

from tracewhy.cache_place import default_cache_dir, open_regular

ENV_DISABLE: Final = "TRACEWHY_NO_CODE_CACHE"
#: Under the cache directory: one table per interpreter bytecode and command.
SUBDIR: Final = "code"


class _Table:
    """The table of one command while it runs: what was read, what it used, what it compiled."""

    def __init__(self, path: Path, codes: dict[str, types.CodeType]) -> None:
        self.path = path
        self.codes = codes
        self.used: dict[str, types.CodeType] = {}
        self.compiled = 0

    def code(self, source: str) -> types.CodeType:
        found = self.codes.get(source)
        if found is None:
            # As exec(source) compiles it inside dataclasses, whose module has no __future__ import.
            found = compile(source, "<string>", "exec", dont_inherit=True)
            self.codes[source] = found
            self.compiled += 1
        self.used[source] = found
        return found


_active: list[_Table] = []


def start(command: str) -> None:
    """Compile the dataclasses made from now on through the table of ``command`` (a name made of
    letters and dashes), read if there is one this process can trust. Does nothing when turned
    off, where it cannot tell who owns a file (not POSIX), or when already started."""
    if _active or os.environ.get(ENV_DISABLE) or not hasattr(os, "getuid") or not command.replace("-", "").isalpha():
        return
    try:
        folder = default_cache_dir() / SUBDIR / f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}"
    except RuntimeError:  # no home directory to keep it in
        return
    path = folder / f"{command}.marshal"
    _active.append(_Table(path, _read(path)))
    dataclasses.exec = _exec  # type: ignore[attr-defined]  # (a module global shadows the builtin there)


def _exec(source: Any, namespace: dict[str, Any] | None = None, local: dict[str, Any] | None = None,
          **rest: Any) -> None:
    """``exec`` as ``dataclasses`` calls it, its source text compiled through the table (anything
    else it may pass goes on to ``exec`` as it came)."""
    if type(source) is str and _active:
        source = _active[0].code(source)
    builtins.exec(source, namespace, local, **rest)


def finish() -> None:
    """Stop compiling through the table, and write it where this run compiled something: with
    what it read (a command's runs on other inputs make other classes), unless that is more than
    twice what this run used (functions no class makes any more, after upgrades), then without."""
    if not _active:
        return
    table = _active.pop()
    if getattr(dataclasses, "exec", None) is _exec:
        delattr(dataclasses, "exec")
    if table.compiled:
        kept = table.codes if len(table.codes) <= 2 * len(table.used) else table.used
        with contextlib.suppress(OSError, ValueError):  # (no room, no right: the next run compiles again)
            _write(table.path, kept)


def _read(path: Path) -> dict[str, types.CodeType]:
    """The table at ``path`` if it can be trusted and is one, else an empty one."""
    try:
        if not (_private(path.parent) and _private(path)):
            return {}
        with open_regular(path) as f:  # (a FIFO or device in its place would block a plain open)
            if not _private_stat(os.fstat(f.fileno())):
                return {}
            table = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if type(table) is not dict or not all(type(k) is str and type(v) is types.CodeType for k, v in table.items()):
        return {}
    return table


def _private(path: Path) -> bool:
    """Whether ``path`` (not followed if a link) is this user's and nobody else may write to it."""
    return _private_stat(os.lstat(path))


def _private_stat(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(st.st_mode)


def _write(path: Path, codes: dict[str, types.CodeType]) -> None:
    """``codes`` written to ``path`` at once (a new file moved into place), in a directory only
    this user can write to."""
    import tempfile  # (only when a table is written: most runs read theirs)

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _private(path.parent):
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            marshal.dump(codes, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
