"""The tests' memo of parsed fixed inputs (``read_once``) gives what a fresh read gives, and
reads afresh whenever what a read depends on changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import read_once
import tracewhy
from conftest import ROOT, shared_trace
from tracewhy.model.schema import Kind
from tracewhy.readers import CacheOptions, read_trace
from tracewhy.readers.kineto import reader as kineto_reader

REAL = ["hta/v100_ddp2_rank1_memprofile.json.gz", "nsys/nsysai_mfu_2gpu_before.sqlite.gz"]
DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"
NO_CACHE = CacheOptions(enabled=False)
TABLES = ("slices", "kernel_attrs", "copy_attrs", "op_attrs", "memory", "flows", "threads", "devices", "nvtx_attrs",
          "sync_attrs")


def _fresh_read(path: Path) -> tracewhy.Trace:
    """A read the memo does not answer (it passes over reads given a progress callback)."""
    return read_trace(path, cache=NO_CACHE, progress=lambda done, total: None)


@pytest.mark.parametrize("relative", REAL)
def test_a_memo_hit_is_what_a_fresh_read_gives(relative: str) -> None:
    path = shared_trace(relative)
    read_trace(path, cache=NO_CACHE)
    hits = read_once.STATS["hit"]
    hit, fresh = read_trace(path, cache=NO_CACHE), _fresh_read(path)
    assert read_once.STATS["hit"] == hits + 1
    assert hit.meta == fresh.meta
    for name in TABLES:
        assert hit.table(name).equals(fresh.table(name)), name


def test_a_partial_read_is_kept_apart_from_the_whole_one() -> None:
    path = shared_trace(REAL[1])
    whole = read_trace(path, cache=NO_CACHE)
    partial = read_trace(path, cache=NO_CACHE, kinds=[Kind.KERNEL])
    assert partial.is_partial and not whole.is_partial
    assert read_trace(path, cache=NO_CACHE, kinds=[Kind.KERNEL]).slices.equals(partial.slices)
    assert not read_trace(path, cache=NO_CACHE).is_partial


def test_a_hit_keeps_nothing_an_analysis_left_on_the_last_trace() -> None:
    path = shared_trace(REAL[0])
    first = read_trace(path, cache=NO_CACHE)
    first.of_kind(Kind.KERNEL)
    assert "_of_kind" in first.__dict__
    second = read_trace(path, cache=NO_CACHE)
    assert second is not first and second.meta is not first.meta
    assert "_of_kind" not in second.__dict__


def test_patched_reading_code_runs_on_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    read_trace(DEMO, cache=NO_CACHE)
    calls = []
    original = kineto_reader._read

    def counted(*args: object) -> tracewhy.Trace:
        calls.append(1)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(kineto_reader, "_read", counted)
    read_trace(DEMO, cache=NO_CACHE)
    read_trace(DEMO, cache=NO_CACHE)
    assert len(calls) == 2, "a read through patched reading code must run it"
    monkeypatch.undo()
    hits = read_once.STATS["hit"]
    read_trace(DEMO, cache=NO_CACHE)
    assert read_once.STATS["hit"] == hits + 1, "the code restored, the memo answers again"


def test_a_changed_setting_reads_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_trace(REAL[1])
    read_trace(path, cache=NO_CACHE)
    before = read_once.kept(path)
    assert before is not None
    monkeypatch.setenv("TRACEWHY_NSYS_ADBC", "0")
    read_trace(path, cache=NO_CACHE)
    after = read_once.kept(path)
    assert after is not None and after[1] is not before[1], "a new setting must be read afresh"


def test_a_link_to_a_fixed_input_is_read_as_its_own_file(tmp_path: Path) -> None:
    copied = tmp_path / DEMO.name
    shutil.copyfile(DEMO, copied)
    linked = tmp_path / "linked.pt.trace.json.gz"
    linked.symlink_to(DEMO)
    parsed = read_once.STATS["parsed"] + read_once.STATS["hit"]
    assert str(read_trace(linked, cache=NO_CACHE).meta.path) == str(linked)
    assert str(read_trace(copied, cache=NO_CACHE).meta.path) == str(copied)
    assert read_once.STATS["parsed"] + read_once.STATS["hit"] == parsed, "files a test made are not the memo's"
    assert read_trace(linked, cache=NO_CACHE).slices.equals(read_trace(DEMO, cache=NO_CACHE).slices)
