"""Ctrl-C during a command exits 130 with nothing more printed, also where it arrives inside a
compiled loop: numba's dispatcher then raises SystemError ("returned a result with an exception
set") from the KeyboardInterrupt, which read as an internal error (exit 70) until the CLI learned
to see the interrupt behind it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from tests.conftest import shared_trace
from tests.test_compiled_loops import needs_numba

from tracewhy import cli
from tracewhy.analyses import host_tree
from tracewhy.model import compiled


@needs_numba
@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")
def test_an_interrupt_inside_a_compiled_loop_is_seen_as_one() -> None:
    """A real compiled loop, interrupted while it runs: whatever it raises, the CLI reads Ctrl-C."""
    script = textwrap.dedent("""
        import os, signal, threading, numpy as np
        from tracewhy.cli import _interrupted
        from tracewhy.model import compiled
        compiled.MIN_ITEMS = 0
        fast = compiled.loops(1)
        n = 2_000_000
        mark = np.zeros(n, dtype=bool); mark[::7] = True
        rows = np.arange(1, n, dtype=np.int32); parents = (rows // 2).astype(np.int32)
        fast.nearest_by_level(mark, rows, parents, np.empty(n, dtype=np.int64))  # (compiled, cached)
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            for _ in range(100_000):
                fast.nearest_by_level(mark, rows, parents, np.empty(n, dtype=np.int64))
            print("never interrupted")
        except BaseException as e:
            print(type(e).__name__, _interrupted(e))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kind, seen = done.stdout.split()
    assert kind in ("KeyboardInterrupt", "SystemError"), done.stdout + done.stderr
    assert seen == "True"


def test_a_system_error_from_an_interrupt_exits_130(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What numba raises (a SystemError from the KeyboardInterrupt) anywhere in a command: exit 130,
    no "internal error" line; a SystemError of its own is still one."""
    path = str(shared_trace("nsys/nsysai_mfu_2gpu_before.sqlite.gz"))

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise SystemError("CPUDispatcher(<function loop>) returned a result with an exception set") from e

    monkeypatch.setattr(compiled, "_loaded", [None])
    monkeypatch.setattr(host_tree.HostTree, "nearest", interrupted)
    assert cli.main(["diagnose", path, "--no-cache"]) == 130
    err = capsys.readouterr().err
    assert "internal error" not in err and "SystemError" not in err

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise SystemError("a bug of our own")

    monkeypatch.setattr(host_tree.HostTree, "nearest", broken)
    assert cli.main(["diagnose", path, "--no-cache"]) == cli.EXIT_INTERNAL
    assert "internal error: SystemError" in capsys.readouterr().err
