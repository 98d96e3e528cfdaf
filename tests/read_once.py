"""The project's fixed input files parsed once per test worker.

Most tests read the same real traces again and again: in one run of the suite the workers read
fixed input files about 1,700 times, about 1,500 of them a file the worker had read before (79
of the two workers' 1,230 seconds); with the memo, a counted run had 1,059 of its 1,407 such
reads answered by it. ``install`` puts a memo in front of the readers
(``tracewhy.readers._read_uncached``, below the parse cache and ``Trace.check``, which still run
for every read) for files under ``../shared/traces``, ``tests/data`` and ``examples`` only: the
inputs no test writes. A file a test made (a link to a shared trace included: the path is taken
as given, not resolved), and a read given a progress callback, are read every time. All the
fixed inputs' tables together are about 240 MB, so the memo keeps every one.

What a read depends on besides the file is part of the memo's key, so that a test that changes
it reads afresh: the file's identity as the parse cache sees it (device, inode, size, mtime
and ctime: ``cache_place.identity``); the kinds asked for; every
``TRACEWHY_*`` environment variable; and which optional readers' modules import (a test makes a
driver unimportable). While a test has patched the reading code (``tracewhy.readers``,
``model``, ``read_helpers``, ``input_size``: a module attribute, or an attribute of a class they
define, that holds another value than when the memo was installed: a helper that fails, a reader
that counts its calls), the memo is not used at all: every read runs the patched code.

Each hit is a new ``Trace`` over the same tables (which are never changed in place: see
``Trace.of_kind``), with its own copy of the metadata and none of the results analyses keep on a
Trace, so a test sees what a fresh read gives. Every file is still parsed once per worker, and
``tests/test_read_once.py`` checks that a hit equals a fresh read of a Kineto trace and of an
Nsight Systems export, and that a patch or a setting makes the next read run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import os
import pkgutil
import sys
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

#: The code a read runs: a test that patches one of these modules reads without the memo.
_READING_CODE = ("tracewhy.readers", "tracewhy.model", "tracewhy.read_helpers", "tracewhy.input_size")
#: Optional modules a reader uses when they import (tests make them unimportable).
_OPTIONAL = ("adbc_driver_sqlite", "adbc_driver_manager", "ncu_report", "duckdb")
_NONE = id(None)

#: By file and kinds: the rest of the key, and the Trace.
_MEMO: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
#: Reads of fixed inputs: answered by the memo, parsed, and parsed because the code was patched.
STATS: Counter[str] = Counter()
#: Each module of the reading code as installed: (class or "", attribute) to the id of its value.
_AS_INSTALLED: dict[str, dict[tuple[str, str], int]] = {}


def _values(module: Any) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for name, value in list(vars(module).items()):
        out[("", name)] = id(value)
        if isinstance(value, type) and value.__module__ == module.__name__:
            out.update(((name, attr), id(v)) for attr, v in list(vars(value).items()))
    return out


def reading_code_patched() -> bool:
    """Whether an attribute of the reading code holds another value than when the memo was
    installed (a module imported later: than when first seen). A value the module itself sets
    where it held None (the parse cache's code fingerprint, made when first asked) is no patch."""
    patched = False
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_READING_CODE):
            continue
        now = _values(module)
        seen = _AS_INSTALLED.setdefault(name, now)
        for key, value in now.items():
            if seen.get(key, value) != value:
                if seen[key] != _NONE:
                    patched = True
                else:
                    seen[key] = value
    return patched


def _import_reading_code() -> None:
    """Every module of the reading code and the optional modules it uses, imported before any
    test can patch one (an optional one imported by the first read would change the key)."""
    for name in _OPTIONAL:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for name in _READING_CODE:
        package = importlib.import_module(name)
        for found in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=f"{name}."):
            with contextlib.suppress(ImportError):  # (a reader of an optional format whose library is absent)
                importlib.import_module(found.name)


def keys(path: Path, kinds: Collection[Any] | None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(the file and kinds, everything else a read depends on)."""
    from tracewhy.cache_place import identity  # (the parse cache's own view of a file unchanged)

    return ((os.path.abspath(path), None if kinds is None else frozenset(str(k) for k in kinds)),
            (tuple(identity(path.stat()).items()),
             tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("TRACEWHY_"))),
             tuple(id(sys.modules.get(m)) for m in _OPTIONAL)))


def kept(path: Path) -> tuple[tuple[Any, ...], Any] | None:
    """The memo's entry for the whole read of ``path`` (its key's rest, and the Trace)."""
    return _MEMO.get(keys(path, None)[0])


def _fresh(trace: Any) -> Any:
    """A new Trace over the same tables, with its own metadata and nothing kept on it."""
    return dataclasses.replace(trace, meta=copy.deepcopy(trace.meta))


def install(fixed: Collection[Path]) -> Callable[[], None]:
    """Put the memo in front of the readers for files under ``fixed``; returns the undo."""
    from tracewhy import readers

    _import_reading_code()
    original = readers._read_uncached
    roots = tuple(os.path.abspath(p) + os.sep for p in fixed if p.is_dir())

    def read(path: Path, progress: Any, kinds: Collection[Any] | None) -> Any:
        if progress is not None or not os.path.abspath(path).startswith(roots):
            return original(path, progress, kinds)
        if reading_code_patched():
            STATS["patched"] += 1
            return original(path, progress, kinds)
        try:
            file, rest = keys(Path(path), kinds)
        except OSError:
            return original(path, progress, kinds)
        entry = _MEMO.get(file)
        if entry is not None and entry[0] == rest:
            STATS["hit"] += 1
            return _fresh(entry[1])
        STATS["parsed"] += 1
        trace = original(path, progress, kinds)
        _MEMO[file] = (rest, _fresh(trace))
        return trace

    readers._read_uncached = read
    reading_code_patched()  # (the reading code as installed, the memo in place)

    def undo() -> None:
        readers._read_uncached = original
        _MEMO.clear()

    return undo
