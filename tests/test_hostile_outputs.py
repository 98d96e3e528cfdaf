"""Hostile cases around what tracewhy writes and reads back: a closed stdout, an output aimed
into an input directory or named by two options, a FIFO planted in the cache, control and bidi
characters in trace strings shown in the HTML page, and tracewhy's own export read back.
Each input is a real trace (or a copy of one, mutated in tmp_path)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from conftest import GENERATED, shared_trace
from tracewhy.cli import main
from tracewhy.readers import CacheOptions, read_trace

#: 750 KB, 2,700 kernels: over the cache's size floor, and a kernels table longer than a pipe holds.
A100 = "hta/a100_ddp2_rank0_nccl2.17.json.gz"
RANKS = ("ddp_gloo_rank0.pt.trace.json.gz", "ddp_gloo_rank1.pt.trace.json.gz")
CPU_TRACE = GENERATED / "cpu_adam_item.pt.trace.json.gz"
#: The child processes import the tracewhy this process imported.
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": str(Path(tracewhy.__file__).resolve().parents[1])}


def test_closed_stdout_is_not_a_failed_check() -> None:
    """``tracewhy kernels T | head -1``: the reader goes away after one line; the command ends
    with 0 (exit 1 is a failed ``check``), and says nothing on stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "tracewhy", "kernels", "--top", "100000", "--no-cache",
                             str(shared_trace(A100))], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=SUBPROCESS_ENV)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    assert err == b""


def test_report_refuses_to_write_into_the_rank_directory_it_reads(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``report RANKDIR -o RANKDIR/report.html``: the page would become a third "rank" of the
    next read. Refused the first time too, before any work, with one line."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for name in RANKS:
        shutil.copy(GENERATED / name, ranks / name)
    out = ranks / "report.html"
    assert main(["report", str(ranks), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a directory read as input" in err[0], err
    assert not out.exists()
    assert main(["report", str(ranks), "-o", str(tmp_path / "report.html")]) == 0  # outside it: written
    assert (tmp_path / "report.html").stat().st_size > 0


@pytest.mark.parametrize("flame, speedscope", [("same.txt", "same.txt"), ("-", "-")])
def test_lines_refuses_two_outputs_on_one_file(flame: str, speedscope: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``lines --flame X --speedscope X``: the speedscope profile would replace the flame graph
    (on stdout, the two would run together). Refused before the work, nothing written."""
    os.chdir(tmp_path)
    assert main(["lines", str(CPU_TRACE), "--flame", flame, "--speedscope", speedscope]) == 2
    captured = capsys.readouterr()
    assert "both name" in captured.err and captured.out == ""
    assert not (tmp_path / "same.txt").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_planted_in_the_cache_does_not_hang_the_next_read(tmp_path: Path) -> None:
    """A FIFO in place of an entry's ``meta.json`` (or of a table file) blocked the next read
    for ever. It is now a damaged entry: ignored, removed and rebuilt."""
    trace = shared_trace(A100)
    cache = tmp_path / "cache"
    first = read_trace(trace, cache=CacheOptions(directory=cache))
    metas = list(cache.rglob("meta.json"))
    assert len(metas) == 1
    parquets = sorted(metas[0].parent.glob("*.parquet"))
    metas[0].unlink()
    os.mkfifo(metas[0])
    script = ("import sys; from pathlib import Path; from tracewhy.readers import CacheOptions, read_trace; "
              "t = read_trace(Path(sys.argv[1]), cache=CacheOptions(directory=Path(sys.argv[2]))); "
              "print(t.slices.height)")
    done = subprocess.run([sys.executable, "-c", script, str(trace), str(cache)], capture_output=True, text=True,
                          timeout=60, env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == first.slices.height
    # The rebuilt entry has a regular meta.json again; now a table file becomes a FIFO.
    rebuilt = list(cache.rglob("meta.json"))
    assert len(rebuilt) == 1 and rebuilt[0].is_file()
    table = sorted(rebuilt[0].parent.glob("*.parquet"))[0]
    assert table.name == parquets[0].name
    table.unlink()
    os.mkfifo(table)
    done = subprocess.run([sys.executable, "-c", script, str(trace), str(cache)], capture_output=True, text=True,
                          timeout=60, env=SUBPROCESS_ENV)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == first.slices.height


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


#: RIGHT-TO-LEFT OVERRIDE, then an ESC colour sequence: a name that reorders or hides the text after it.
HOSTILE = "\u202egnp.exe\x1b[31m\u2066"


def test_html_page_shows_control_and_bidi_characters_as_escapes(tmp_path: Path) -> None:
    """The most frequent operator of a real trace renamed with a bidi override, ESC and an
    isolate: the page's data holds no such character, only their visible escapes."""
    doc = json.loads(gzip.decompress(CPU_TRACE.read_bytes()))
    ops = Counter(e["name"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    target = ops.most_common(1)[0][0]
    for e in doc["traceEvents"]:
        if e.get("name") == target:
            e["name"] = target + HOSTILE
    hostile = tmp_path / "hostile.pt.trace.json"
    hostile.write_text(json.dumps(doc))
    out = tmp_path / "report.html"
    assert main(["report", str(hostile), "-o", str(out), "--no-cache"]) == 0
    page = out.read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.DOTALL)
    assert data is not None
    strings = _strings(json.loads(data.group(1)))
    invisible = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
    assert not [s for s in strings if invisible.search(s)]
    assert any("\\u202egnp.exe\\x1b[31m\\u2066" in s for s in strings)  # (the name reached the page)
    assert not re.search("[\u202a-\u202e\u2066-\u2069\x1b]", page)


def test_tracewhys_own_export_reads_back_without_warnings(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``export`` adds counter tracks (GPU utilization, memory) as phase 'C' events with cat
    "tracewhy"; reading the exported file warned about them. A foreign counter still warns."""
    out = tmp_path / "exported.json.gz"
    assert main(["export", str(shared_trace(A100)), "-o", str(out), "--no-cache"]) == 0
    capsys.readouterr()
    doc = json.loads(gzip.decompress(out.read_bytes()))
    counters = [e for e in doc["traceEvents"] if e.get("ph") == "C"]
    assert counters and {e["cat"] for e in counters} == {"tracewhy"}
    back = read_trace(out, cache=CacheOptions(enabled=False))
    assert not [w for w in back.meta.warnings if "phase 'C'" in w], back.meta.warnings
    assert main(["kernels", str(out), "--no-cache"]) == 0
    assert "phase 'C'" not in capsys.readouterr().err
    for e in counters[:3]:  # the same events with another category: not tracewhy's
        e["cat"] = "counters"
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(doc))
    warned = read_trace(foreign, cache=CacheOptions(enabled=False)).meta.warnings
    assert [w for w in warned if "phase 'C'" in w and w.startswith("3 ")], warned
