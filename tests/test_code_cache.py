"""The command's table of dataclass methods (``code_cache``): the functions it gives are the ones
``dataclasses`` compiles itself, code object for code object; a table is read only when it is
this user's alone; a command prints the same with the table, without it, and while filling it."""

from __future__ import annotations

import dataclasses
import inspect
import marshal
import os
import stat
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import shared_trace

from tracewhy import code_cache

#: Classes of the kinds the package makes: frozen, defaults and factories, keyword-only fields,
#: fields left out of repr and comparison, subclasses, a post-init, string annotations.
CLASSES = '''
from __future__ import annotations
from dataclasses import dataclass, field, InitVar

@dataclass(frozen=True)
class Frozen:
    """A frozen one."""
    a: int
    b: str = "x"
    c: tuple[int, ...] = field(default_factory=tuple)
    hidden: float = field(default=0.5, repr=False, compare=False)

@dataclass
class Plain:
    items: list[int] = field(default_factory=list)
    scale: InitVar[int] = 1
    total: int = 0
    def __post_init__(self, scale: int) -> None:
        self.total = sum(self.items) * scale

@dataclass(frozen=True, kw_only=True)
class Child(Frozen):
    extra: int = 3

@dataclass(frozen=True, repr=False, eq=False)
class Bare:
    z: int
'''
METHODS = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")


def _make(tag: str) -> dict[str, Any]:
    """The classes, made as a module's code makes them (string annotations look the module up)."""
    module = types.ModuleType(f"classes_{tag}")
    sys.modules[module.__name__] = module
    try:
        exec(compile(CLASSES, f"<classes {tag}>", "exec"), vars(module))
    finally:
        del sys.modules[module.__name__]
    return vars(module)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(code_cache.ENV_DISABLE, raising=False)
    monkeypatch.setattr(code_cache, "_active", [])
    yield tmp_path
    code_cache.finish()
    assert "exec" not in vars(dataclasses), "finish must give dataclasses back the builtin exec"


def _table(cache_dir: Path) -> Path:
    (table,) = (cache_dir / code_cache.SUBDIR).glob("*/testing.marshal")
    return table


def _functions(cls: type) -> dict[str, Any]:
    return {m: vars(cls)[m] for m in METHODS if callable(vars(cls).get(m))}


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX only: the table's owner is checked")
def test_tabled_methods_are_the_ones_dataclasses_compiles(cache_dir: Path) -> None:
    plain = _make("plain")
    code_cache.start("testing")
    filling = _make("filling")
    assert code_cache._active[0].compiled >= 12
    code_cache.finish()
    table = _table(cache_dir)
    code_cache.start("testing")
    reading = _make("reading")
    assert code_cache._active[0].compiled == 0, "the second run must take every function from the table"
    assert len(code_cache._active[0].used) >= 12
    code_cache.finish()
    for name in ("Frozen", "Plain", "Child", "Bare"):
        expected = _functions(plain[name])
        assert expected, name
        for made in (filling, reading):
            got = _functions(made[name])
            assert got.keys() == expected.keys(), name
            for method, function in got.items():
                assert function.__code__ == expected[method].__code__, (name, method)
                assert function.__annotations__ == expected[method].__annotations__, (name, method)
                assert function.__defaults__ == expected[method].__defaults__, (name, method)
            assert inspect.signature(made[name]) == inspect.signature(plain[name]), name
    # Behaviour, through the tabled functions.
    frozen, plain_frozen = reading["Frozen"](1, c=(2,)), plain["Frozen"](1, c=(2,))
    assert repr(frozen) == repr(plain_frozen).replace("classes_plain", "classes_reading")
    assert frozen == reading["Frozen"](1, c=(2,), hidden=9.0) and hash(frozen) == hash(reading["Frozen"](1, c=(2,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.a = 2  # type: ignore[misc]
    assert reading["Plain"]([1, 2], 3).total == 9
    assert reading["Child"](1, extra=4).extra == 4
    assert stat.S_IMODE(table.stat().st_mode) == 0o600 and stat.S_IMODE(table.parent.stat().st_mode) == 0o700


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX only: the table's owner is checked")
def test_a_table_others_could_write_is_not_read(cache_dir: Path) -> None:
    code_cache.start("testing")
    _make("filling")
    code_cache.finish()
    table = _table(cache_dir)
    assert code_cache._read(table), "a private table is read"
    for mode, where in ((0o620, table), (0o602, table), (0o770, table.parent), (0o707, table.parent)):
        original = stat.S_IMODE(where.stat().st_mode)
        where.chmod(mode)
        try:
            assert code_cache._read(table) == {}, (oct(mode), where.name)
        finally:
            where.chmod(original)
    link = table.with_name("linked.marshal")
    link.symlink_to(table)
    assert code_cache._read(link) == {}
    fifo = table.with_name("fifo.marshal")
    os.mkfifo(fifo, 0o600)
    assert code_cache._read(fifo) == {}, "a FIFO in the table's place must not block the command"
    for content in (b"not marshal at all", marshal.dumps({"source": 1}), marshal.dumps(["a list"]), b""):
        other = table.with_name("other.marshal")
        other.write_bytes(content)
        other.chmod(0o600)
        assert code_cache._read(other) == {}, content[:20]


def test_turned_off_or_a_strange_name_leaves_dataclasses_alone(cache_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    code_cache.start("../escape")
    assert not code_cache._active and "exec" not in vars(dataclasses)
    monkeypatch.setenv(code_cache.ENV_DISABLE, "1")
    code_cache.start("testing")
    assert not code_cache._active and "exec" not in vars(dataclasses)


def _diagnose(trace: Path, cache: Path, **env: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tracewhy", "diagnose", str(trace), "--json", "--no-cache"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "TRACEWHY_CACHE_DIR": str(cache), **env})
    return done.stdout


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX only: the table's owner is checked")
def test_a_command_prints_the_same_with_its_table_without_it_and_while_filling_it(tmp_path: Path) -> None:
    trace = shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz")
    filling = _diagnose(trace, tmp_path)
    (table,) = (tmp_path / code_cache.SUBDIR).glob("*/diagnose.marshal")
    codes = marshal.loads(table.read_bytes())
    assert len(codes) > 300, "a diagnosis makes hundreds of dataclass functions"
    written = table.stat().st_mtime_ns
    reading = _diagnose(trace, tmp_path)
    assert table.stat().st_mtime_ns == written, "a run that compiled nothing leaves the table alone"
    without = _diagnose(trace, tmp_path, **{code_cache.ENV_DISABLE: "1"})
    assert filling == reading == without
