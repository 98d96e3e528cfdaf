"""The step marker of an nsys capture without ProfilerStep ranges: never a
library's own ranges (CUB's "CCCL" domain, NCCL's "NCCL" domain, torch's emit_nvtx op ranges),
and ranges that tile the run first; the note names the choice and the runner-up. Built with the
export builder: the domain names are the ones CCCL's cub/detail/nvtx.cuh (NVTXCCCLDomain) and
NCCL's src/include/nvtx.h (nccl_domain) create; the op-range format is emit_nvtx's."""

from __future__ import annotations

from pathlib import Path

from nsys_support import ExportBuilder
from tracewhy.analyses.nvtx import nvtx_step_marker
from tracewhy.analyses.steps import steps
from tracewhy.readers.nsys.reader import read_nsys

CCCL, NCCL = 1, 2


def _loop_with_cub(tmp_path: Path, *, with_op_ranges: bool = False) -> Path:
    """Four 900 µs iterations of 'train_step', each with a CUB reduction range inside it; after
    the loop, six CUB reductions at top level (an evaluation pass), each launching a kernel."""
    b = ExportBuilder()
    b.nvtx("CCCL", 0, None, event_type=75, domain=CCCL)  # nvtxDomainCreate
    b.nvtx("NCCL", 0, None, event_type=75, domain=NCCL)
    t = 10_000
    for i in range(4):
        s = t + 1_000_000 * i
        b.nvtx("train_step", s, s + 900_000)
        b.nvtx("cub::DeviceReduce::Sum", s + 100_000, s + 117_000, domain=CCCL)
        b.kernel("k()", s + 200_000, s + 800_000, b.api("cudaLaunchKernel_v7000", s + 10_000, s + 20_000))
    after = t + 5_000_000
    for i in range(6):
        s = after + 100_000 * i
        b.nvtx("cub::DeviceReduce::Sum", s, s + 17_000, domain=CCCL)
        b.kernel("reduce()", s + 5_000, s + 15_000, b.api("cudaLaunchKernel_v7000", s + 1_000, s + 3_000))
        b.nvtx("ncclAllReduce", s + 20_000, s + 30_000, domain=NCCL)
        b.kernel("ncclDevKernel()", s + 40_000, s + 50_000, b.api("cudaLaunchKernel_v7000", s + 21_000, s + 22_000))
        if with_op_ranges:
            b.nvtx(f"aten::to, seq = {i}, op_id = {999_599 + i}", s + 60_000, s + 80_000)
            b.kernel("copy()", s + 62_000, s + 70_000, b.api("cudaLaunchKernel_v7000", s + 61_000, s + 61_500))
    return b.write(tmp_path / "loop.sqlite")


def test_library_ranges_are_never_the_step(tmp_path: Path) -> None:
    t = read_nsys(_loop_with_cub(tmp_path, with_op_ranges=True))
    chosen = nvtx_step_marker(t)
    # The CUB, NCCL and op ranges launch GPU work 6 times each at top level, the loop 4 times.
    assert chosen is not None and chosen.name == "train_step" and chosen.repeats == 4
    assert "its ranges tile the run" in chosen.note
    r = steps(t)
    assert r.marker == "train_step" and r.table.height == 4
    assert r.table.get_column("kernel_count").to_list() == [1, 1, 1, 1]


def test_only_library_ranges_means_no_marker(tmp_path: Path) -> None:
    b = ExportBuilder()
    b.nvtx("CCCL", 0, None, event_type=75, domain=CCCL)
    for i in range(5):
        s = 10_000 + 100_000 * i
        b.nvtx("cub::DeviceScan::InclusiveSum", s, s + 17_000, domain=CCCL)
        b.kernel("scan()", s + 5_000, s + 15_000, b.api("cudaLaunchKernel_v7000", s + 1_000, s + 3_000))
    t = read_nsys(b.write(tmp_path / "cub_only.sqlite"))
    assert nvtx_step_marker(t) is None
    assert steps(t).table.height == 0
