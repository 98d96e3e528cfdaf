"""Table-selective reads of nsys exports: a partial Trace holds exactly what the whole one
holds for the kinds it was read with, says so, refuses the rest, and is never cached."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from nsys_support import FIXTURES, export_path, load
from tracewhy.analyses.kernels import kernels
from tracewhy.model.cache import CacheOptions
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Col, Kind
from tracewhy.model.trace import PartialTraceError, Trace
from tracewhy.readers import read_trace
from tracewhy.readers.nsys.reader import read_nsys

_GPU_COLS = [Col.NAME, Col.TS, Col.DUR, Col.PID, Col.DEVICE, Col.STREAM, Col.CORRELATION]


def _rows(trace: Trace, kind: Kind) -> pl.DataFrame:
    """A kind's slices with their kernel attributes, without ids (which depend on what else was read)."""
    s = trace.slices.filter(pl.col(Col.KIND) == kind.value).with_columns(pl.col(Col.NAME).cast(pl.String))
    attrs = trace.kernel_attrs if kind == Kind.KERNEL else trace.copy_attrs
    return s.join(attrs, on=Col.ID, how="left").drop(
        Col.ID, Col.LAUNCH, Col.OP, Col.PARENT, Col.DEPTH, Col.KIND
    ).sort(Col.TS, Col.CORRELATION, Col.NAME)


@pytest.mark.parametrize("name", FIXTURES)
def test_kernels_only_read_is_the_kernel_part_of_the_whole_read(name: str) -> None:
    whole = load(name)
    part = read_nsys(export_path(name), kinds=[Kind.KERNEL])
    part.check()
    assert part.is_partial and part.meta.kinds_read == ("kernel",)
    assert not whole.is_partial and whole.meta.kinds_read is None
    assert set(part.slices.get_column(Col.KIND).unique().to_list()) <= {"kernel"}
    assert _rows(part, Kind.KERNEL).equals(_rows(whole, Kind.KERNEL))
    assert part.devices.equals(whole.devices)
    ours, theirs = kernels(part), kernels(whole)
    assert ours.by_name.equals(theirs.by_name) and ours.total_time_ns == theirs.total_time_ns
    # Unread calls are not reported as missing ones.
    assert not any("no CUDA API call" in w for w in part.meta.warnings)


def test_a_partial_trace_refuses_kinds_it_was_read_without() -> None:
    part = read_nsys(export_path("nsysai_mfu_2gpu_before"), kinds=[Kind.KERNEL, Kind.MEMCPY])
    assert part.meta.kinds_read == ("kernel", "memcpy")
    part.require(Kind.KERNEL, Kind.MEMCPY)
    assert part.of_kind(Kind.MEMCPY).height == load("nsysai_mfu_2gpu_before").of_kind(Kind.MEMCPY).height
    with pytest.raises(PartialTraceError, match="memset"):
        part.of_kind(*GPU_ACTIVITY_KINDS)
    with pytest.raises(PartialTraceError, match="runtime"):
        part.require(Kind.RUNTIME)
    # count is of_kind's height without the rows, and refuses the same kinds.
    assert part.count(Kind.KERNEL, Kind.MEMCPY) == part.of_kind(Kind.KERNEL, Kind.MEMCPY).height > 0
    with pytest.raises(PartialTraceError, match="memset"):
        part.count(*GPU_ACTIVITY_KINDS)


@pytest.mark.parametrize("name", FIXTURES)
def test_count_is_the_height_of_the_kinds_rows(name: str) -> None:
    whole = load(name)
    by_kind = dict(whole.slices.group_by(Col.KIND).len().iter_rows())
    for kinds in ([Kind.KERNEL], list(LAUNCH_KINDS), list(GPU_ACTIVITY_KINDS), [Kind.CPU_OP, Kind.PYTHON]):
        expected = sum(by_kind.get(k.value, 0) for k in kinds)
        assert whole.count(*kinds) == expected == whole.of_kind(*kinds).height


def test_sync_records_bring_the_calls_that_name_them() -> None:
    name = "nvfuser_xent_h200_2025.1"
    part = read_nsys(export_path(name), kinds=[Kind.GPU_SYNC])
    assert part.meta.kinds_read == ("driver", "gpu_sync", "runtime")
    sync = Kind.GPU_SYNC.value

    def names(t: Trace) -> list[str]:
        return sorted(t.slices.filter(pl.col(Col.KIND) == sync).get_column(Col.NAME).cast(pl.String).to_list())

    assert names(part) and names(part) == names(load(name))


def test_a_kind_reads_its_whole_table_and_kinds_nsys_lacks_read_as_empty() -> None:
    name = "nsysai_h100_2gpu_1s"
    whole = load(name)
    part = read_nsys(export_path(name), kinds=[Kind.DRIVER, Kind.CPU_OP])
    # Driver calls share the runtime table; nsys exports hold no CPU ops, so a whole read
    # would hold none either: the partial Trace says it holds them (and has none).
    assert part.meta.kinds_read == ("cpu_op", "driver", "runtime")
    for kind in (Kind.RUNTIME, Kind.DRIVER, Kind.CPU_OP):
        assert part.of_kind(kind).height == whole.of_kind(kind).height
    assert whole.of_kind(Kind.RUNTIME).height > 0 and whole.of_kind(Kind.CPU_OP).height == 0


def test_partial_reads_are_never_cached_but_a_cached_whole_trace_serves_them(tmp_path: Path) -> None:
    opts = CacheOptions(directory=tmp_path / "cache", min_bytes=0)
    path = export_path("nvfuser_matmul_h200_2024.6")
    first = read_trace(path, cache=opts, kinds=[Kind.KERNEL])
    assert first.is_partial
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    whole = read_trace(path, cache=opts)
    assert not whole.is_partial and any((tmp_path / "cache").iterdir())
    served = read_trace(path, cache=opts, kinds=[Kind.KERNEL])
    assert not served.is_partial and served.slices.height == whole.slices.height


def test_whole_trace_analyses_refuse_a_partial_trace() -> None:
    """Analyses that read every slice (steps, gaps, ops, diagnose, ...) would answer wrongly
    from a kernels-only Trace; they raise instead, and run as usual on the whole Trace."""
    from tracewhy.analyses import nsys_rules
    from tracewhy.analyses.blocks import blocks
    from tracewhy.analyses.collectives import collectives
    from tracewhy.analyses.diff import diff
    from tracewhy.analyses.host_activity import build_host_index
    from tracewhy.analyses.info import info
    from tracewhy.analyses.nvtx import gpu_projection, nvtx_step_marker, nvtx_summary
    from tracewhy.analyses.ops import ops
    from tracewhy.analyses.overlap import overlap
    from tracewhy.analyses.ranks import summarize_trace
    from tracewhy.analyses.steps import steps
    from tracewhy.findings.roofline_ops import op_roofline
    from tracewhy.renderers.perfetto import model_events
    from tracewhy.reports.diagnose import diagnose

    name = "nvfuser_matmul_h200_2024.6"
    part = read_nsys(export_path(name), kinds=[Kind.KERNEL])
    whole = load(name)
    analyses = [steps, info, ops, collectives, blocks, build_host_index, op_roofline, overlap,
                lambda t: summarize_trace(t, "x"), lambda t: diff(t, whole), lambda t: diff(whole, t),
                nsys_rules.pageable_async_memcpy, nsys_rules.sync_memcpy, nsys_rules.gpu_gaps,
                nsys_rules.sync_api_calls, gpu_projection, nvtx_summary, nvtx_step_marker, diagnose,
                model_events]
    for analysis in analyses:
        with pytest.raises(PartialTraceError):
            analysis(part)
    for analysis in analyses[:3]:
        analysis(whole)
