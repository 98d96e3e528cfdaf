"""Reading with helper processes must give the Trace the serial read gives, row for row.

The batches are made small so that real traces of a few MB go through several helper rounds;
the serial read is the reference (itself checked against raw-JSON sums in test_kineto_real).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal
from tests.conftest import shared_trace

from tracewhy.model.trace import Trace
from tracewhy.readers import kineto_parallel
from tracewhy.readers.kineto import read_kineto

TABLES = ("slices", "memory", "flows", "threads", "kernel_attrs", "copy_attrs", "op_attrs", "devices")


def _assert_same(a: Trace, b: Trace) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.meta == b.meta


@pytest.mark.parametrize("relative", [
    "tracelens/h100_timesformer_video_bs1.json.gz",      # with_stack: Python frames, memory events
    "hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz",  # DDP, NCCL, overrunning runtime calls
    "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz",  # PyTorch 1.8 legacy names
])
@pytest.mark.parametrize("workers", [2, 3])
def test_helpers_give_the_serial_trace(relative: str, workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_trace(relative)
    built_by_helpers = []
    receive = kineto_parallel.Helper.receive

    def counting(self: kineto_parallel.Helper) -> object | None:
        part = receive(self)
        built_by_helpers.append(part is not None)
        return part

    monkeypatch.setattr(kineto_parallel.Helper, "receive", counting)
    serial = read_kineto(path, workers=1)
    parallel = read_kineto(path, workers=workers, batch_size=4000)
    # Helpers really built parts (a broken helper would silently leave them all to us).
    assert len(built_by_helpers) >= workers - 1 and all(built_by_helpers)
    _assert_same(serial, parallel)


def test_a_helper_that_dies_costs_only_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper that exits at once (killed, out of memory...): its batches are built here."""
    path = shared_trace("tracelens/h100_timesformer_video_bs1.json.gz")
    real_popen = kineto_parallel.subprocess.Popen

    def dying(argv: list[str], **kwargs: object) -> object:
        return real_popen([sys.executable, "-c", "import sys; sys.exit(3)"], **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(kineto_parallel.subprocess, "Popen", dying)
    _assert_same(read_kineto(path, workers=1), read_kineto(path, workers=2, batch_size=4000))


def test_scratch_files_are_removed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    made: list[Path] = []
    real = kineto_parallel.scratch_dir

    def recording() -> Path:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(kineto_parallel, "scratch_dir", recording)
    read_kineto(shared_trace("tracelens/h100_timesformer_video_bs1.json.gz"), workers=2, batch_size=4000)
    assert made and not made[0].exists()


def test_worker_count(monkeypatch: pytest.MonkeyPatch) -> None:
    big = kineto_parallel.PARALLEL_MIN_BYTES
    monkeypatch.delenv(kineto_parallel.ENV_WORKERS, raising=False)
    monkeypatch.delenv(kineto_parallel.ENV_IN_HELPER, raising=False)
    assert kineto_parallel.worker_count(big - 1) == 1
    assert kineto_parallel.worker_count(10, requested=3) == 3
    monkeypatch.setenv(kineto_parallel.ENV_IN_HELPER, "1")
    assert kineto_parallel.worker_count(big) == 1  # a helper never starts helpers
    monkeypatch.delenv(kineto_parallel.ENV_IN_HELPER)
    monkeypatch.setenv(kineto_parallel.ENV_WORKERS, "1")
    assert kineto_parallel.worker_count(big) == 1
