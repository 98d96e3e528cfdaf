"""The command line tells small inputs before its imports (``input_size``): a file's content
size (gzip inflated, from its trailer, checked against the inflated bytes), what counts as
small, and the one-thread polars pool a command on small inputs gets (``cli.as_command``, in a
fresh interpreter that has not imported polars)."""

from __future__ import annotations

import gzip
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import shared_trace

from tracewhy.input_size import content_size, small_inputs

BERT = "tracelens/h100_bert-small_bs1_seq512.json.gz"


def test_content_size_reads_the_gzip_trailer(tmp_path: Path) -> None:
    gz = shared_trace(BERT)
    assert content_size(gz) == len(gzip.decompress(gz.read_bytes()))
    plain = tmp_path / "plain.json"
    plain.write_bytes(b'{"traceEvents": []}')
    assert content_size(plain) == 19
    assert content_size(tmp_path / "missing.json") == 0


def test_small_inputs_takes_only_regular_files_within_the_bound(tmp_path: Path) -> None:
    gz = str(shared_trace(BERT))
    inflated = content_size(gz)
    assert small_inputs([gz])
    # Words that are no path (a query, a step name, options) are passed over.
    assert small_inputs(["--json", gz, "SELECT count(*) FROM kernels", "ProfilerStep"])
    # Inflated, not compressed, bytes count; two files count together.
    assert not small_inputs([gz], max_bytes=inflated - 1)
    assert small_inputs([gz, gz], max_bytes=2 * inflated)
    assert not small_inputs([gz, gz], max_bytes=2 * inflated - 1)
    # No file at all, or a directory (ranks DIR): not told small.
    assert not small_inputs(["which", "idle"])
    assert not small_inputs([gz, str(tmp_path)])


_AS_COMMAND = "import os, sys; from tracewhy.cli import as_command; as_command(sys.argv[1:]); "


def _after(code: str, argv: list[str], unset: str, env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter running ``code`` on ``argv``, with ``unset`` out of its environment
    and ``env`` in it."""
    base = {k: v for k, v in os.environ.items() if k != unset}
    return subprocess.run([sys.executable, "-c", code, *argv], env={**base, **(env or {})}, capture_output=True,
                          text=True, timeout=60, check=True)


def _pool_after(argv: list[str], env: dict[str, str] | None = None) -> str:
    """POLARS_MAX_THREADS after ``as_command(argv)`` in a fresh interpreter, and polars' pool size."""
    code = _AS_COMMAND + ("v = os.environ.get('POLARS_MAX_THREADS'); import polars as pl; "
                          "print(v, pl.thread_pool_size())")
    return _after(code, argv, "POLARS_MAX_THREADS", env).stdout.strip()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: polars' default pool is one thread already")
def test_a_command_on_small_inputs_gets_a_one_thread_pool(tmp_path: Path) -> None:
    gz = str(shared_trace(BERT))
    assert _pool_after(["diagnose", gz]) == "1 1"
    assert _pool_after(["diff", gz, gz, "--json"]) == "1 1"
    # The user's choice stands; capture (the user's job would inherit it) and large or unknown
    # inputs keep polars' default.
    assert _pool_after(["diagnose", gz], {"POLARS_MAX_THREADS": "2"}) == "2 2"
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert _pool_after(["capture", str(script)]).startswith("None ")
    assert _pool_after(["ranks", str(tmp_path)]).startswith("None ")
    assert _pool_after(["diagnose", str(tmp_path / "missing.json")]).startswith("None ")


def _allocator_after(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Polars' allocator settings after ``as_command(argv)`` in a fresh interpreter."""
    code = _AS_COMMAND + "print(os.environ.get('_RJEM_MALLOC_CONF'), 'polars' in sys.modules)"
    return _after(code, argv, "_RJEM_MALLOC_CONF", env).stdout.strip()


def test_a_command_gets_its_freed_pages_returned_soon(tmp_path: Path) -> None:
    """Set before polars is loaded (jemalloc reads it then), for any input size; the user's own
    setting stands; not for the commands that start or serve other programs."""
    gz = str(shared_trace(BERT))
    assert _allocator_after(["kernels", gz]) == "dirty_decay_ms:100,muzzy_decay_ms:0 False"
    assert _allocator_after(["diagnose", str(tmp_path / "large.json")]).startswith("dirty_decay_ms:100,")
    assert _allocator_after(["kernels", gz], {"_RJEM_MALLOC_CONF": "narenas:1"}) == "narenas:1 False"
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert _allocator_after(["capture", str(script)]).startswith("None ")
    assert _allocator_after([]).startswith("None ")


def _blas_after(argv: list[str], env: dict[str, str] | None = None) -> str:
    """OPENBLAS_NUM_THREADS after ``as_command(argv)`` in a fresh interpreter, and how many
    threads the process has once numpy is imported (its BLAS library starts its pool then)."""
    code = _AS_COMMAND + ("v = os.environ.get('OPENBLAS_NUM_THREADS'); import numpy; "
                          "print(v, len(os.listdir('/proc/self/task')))")
    return _after(code, argv, "OPENBLAS_NUM_THREADS", env).stdout.strip()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2,
                    reason="threads counted in /proc; one core: OpenBLAS starts no pool")
def test_a_command_starts_no_blas_threads(tmp_path: Path) -> None:
    """numpy's OpenBLAS would start a spinning thread per extra core at import: a command runs
    with none, whatever its input size; the user's own setting stands, and capture (the user's
    job would inherit it) keeps OpenBLAS's default."""
    gz = str(shared_trace(BERT))
    assert _blas_after(["kernels", gz]) == "1 1"
    assert _blas_after(["diagnose", str(tmp_path / "large.json")]) == "1 1"
    # (large inputs: on small ones the process keeps to one CPU, and OpenBLAS sizes its pool by
    # the CPUs the process may use)
    assert _blas_after(["kernels", str(tmp_path / "large.json")], {"OPENBLAS_NUM_THREADS": "2"}) == "2 2"
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    default = _blas_after(["capture", str(script)])
    assert default.startswith("None ") and int(default.split()[1]) > 1  # the pool this setting removes


def _cpus_after(argv: list[str], before: str = "") -> str:
    """The CPUs a fresh interpreter may use after ``before`` (code run first) and
    ``as_command(argv)``, as the count of them and the count it could use at the start."""
    code = ("import os, sys; start = len(os.sched_getaffinity(0)); " + before
            + "from tracewhy.cli import as_command; as_command(sys.argv[1:]); "
            "print(len(os.sched_getaffinity(0)), start)")
    return _after(code, argv, "", None).stdout.strip()


_AFFINITY = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not _AFFINITY, reason="CPU affinity (Linux) on at least two CPUs")
def test_a_command_on_small_inputs_keeps_to_one_cpu(tmp_path: Path) -> None:
    """Small inputs: the process (and the threads it starts later, polars' pool among them)
    keeps to one CPU; large or unknown inputs, capture and a process already kept to one CPU
    are left as they are."""
    gz = str(shared_trace(BERT))
    n = str(len(os.sched_getaffinity(0)))
    assert _cpus_after(["diagnose", gz]) == f"1 {n}"
    code = ("import os, sys, threading; from tracewhy.cli import as_command; as_command(sys.argv[1:]); "
            "seen = []; t = threading.Thread(target=lambda: seen.append(len(os.sched_getaffinity(0)))); "
            "t.start(); t.join(); import polars; polars.select(polars.lit(1)); "
            "print(seen[0], len({c for task in os.listdir('/proc/self/task') for c in "
            "os.sched_getaffinity(int(task))}))")
    assert _after(code, ["diagnose", gz], "", None).stdout.strip() == "1 1"
    assert _cpus_after(["diagnose", str(tmp_path / "large.json")]) == f"{n} {n}"
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert _cpus_after(["capture", str(script)]) == f"{n} {n}"
    one = min(os.sched_getaffinity(0))
    assert _cpus_after(["diagnose", gz], f"os.sched_setaffinity(0, {{{one}}}); ") == f"1 {n}"


@pytest.mark.skipif(not _AFFINITY, reason="CPU affinity (Linux) on at least two CPUs")
def test_a_helper_keeps_apart_from_its_command() -> None:
    """A diff's helper is kept to the CPUs its command does not keep to (command_process.keep_apart)."""
    code = ("import os, subprocess, sys; from tracewhy import command_process as p; "
            "before = p.keep_to_one_cpu(); "
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "p.keep_apart(child.pid, before); mine = os.sched_getaffinity(0); "
            "theirs = os.sched_getaffinity(child.pid); child.kill(); "
            "print(len(mine), sorted(mine | theirs) == sorted(before), not (mine & theirs))")
    assert _after(code, [], "", None).stdout.strip() == "1 True True"


_ARENAS = _AS_COMMAND + """
import ctypes, threading
keep = []
def work():
    keep.append([bytearray(4096) for _ in range(200)])
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(None).malloc_stats()
"""


def _arenas_after(argv: list[str], env: dict[str, str] | None = None) -> int:
    """How many glibc arenas a fresh interpreter has after ``as_command(argv)`` and four threads
    that allocate (``malloc_stats`` writes a section per arena)."""
    return _after(_ARENAS, argv, "MALLOC_ARENA_MAX", env).stderr.count("Arena ")


@pytest.mark.skipif(not sys.platform.startswith("linux") or "glibc" not in " ".join(platform.libc_ver()),
                    reason="glibc's arenas")
def test_a_large_read_keeps_one_malloc_arena(tmp_path: Path) -> None:
    """A command on large (or unknown) inputs has every thread allocate from one glibc arena;
    small inputs, other programs and the user's own setting keep glibc's default."""
    large = str(tmp_path / "large.json")
    assert _arenas_after(["kernels", large]) == 1
    assert _arenas_after(["kernels", str(shared_trace(BERT))]) > 1
    assert _arenas_after(["kernels", large], {"MALLOC_ARENA_MAX": "4"}) > 1
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert _arenas_after(["capture", str(script)]) > 1
