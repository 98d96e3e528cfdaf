"""Everything the visual outputs show about one trace, computed once: the diagnosis (findings,
steps, gaps) plus the tables behind it. The HTML report and the annotated Perfetto trace are
renderings of this; neither computes anything itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import polars as pl

from tracewhy.analyses.blocks import BlocksResult
from tracewhy.analyses.critical_path import CriticalPathOptions, CriticalPathResult, critical_path
from tracewhy.analyses.info import InfoResult, info
from tracewhy.analyses.kernels import KernelsResult
from tracewhy.analyses.nvtx import gpu_projection
from tracewhy.analyses.nvtx_work import GpuWork
from tracewhy.analyses.ops import OpsResult, ops
from tracewhy.analyses.overlap import OverlapResult
from tracewhy.analyses.steps import StepCol, steady_span
from tracewhy.analyses.utilization import UtilizationResult, utilization
from tracewhy.findings.blocks import blocks_result, gpu_work_result
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.findings.overlap import overlap_result
from tracewhy.model.schema import GPU_ACTIVITY_KINDS, Col
from tracewhy.model.trace import Trace
from tracewhy.reports import at_once
from tracewhy.reports.diagnose import Report, diagnose_in

if TYPE_CHECKING:  # (loaded by the views that compute them: the export computes neither)
    from tracewhy.analyses.mfu_steps import MfuResult
    from tracewhy.findings.roofline_ops import OpRooflineResult

#: Bins of the GPU-utilization series over the whole trace (a point per ~0.5% of its span).
UTILIZATION_BINS = 200
#: Steps whose critical path the report and the export show (steady ones first): each step costs
#: a walk and the replays of its top items, about 0.1 s of CPU on a 120 k-slice trace
#: (bench/bench_overview_critical_path.py); ``tracewhy critical-path`` analyses up to 2,000.
CRITICAL_PATH_STEPS = 3


@dataclass(frozen=True)
class OverviewViews:
    """The views an overview computes beyond those every rendering draws (the diagnosis, info,
    utilization, the projection, ops, kernels, overlap, blocks and the critical path's walk)."""

    #: The ops' roofline table and the MFU (the report's sections; the annotated trace has no track
    #: for them).
    op_roofline_and_mfu: bool = True
    #: The step time the critical path's top items would save (a replay each: the report's items
    #: table; the annotated trace draws the path's segments alone).
    path_gains: bool = True


#: What the HTML report draws: every view.
REPORT_VIEWS: Final = OverviewViews()
#: What the annotated trace for Perfetto draws (``renderers/perfetto.py``): no op roofline, no MFU
#: and no critical-path gains (on the BERT trace 15-20 ms of CPU that nothing showed).
ANNOTATED_TRACE_VIEWS: Final = OverviewViews(op_roofline_and_mfu=False, path_gains=False)


@dataclass(frozen=True)
class Overview:
    """``projection``: annotations projected onto the GPU (nvtx.gpu_projection's table), with
    ``device``, the device most of each range's work ran on. ``device_pids``: the pid each
    device's rows carry in the trace (Kineto writes the device index). ``blocks``: the block table
    alone (its ``instances`` are empty, as in diagnose). Optional parts are None when the trace
    has no data for them (no GPU, no shapes) or when the overview was not asked for them
    (``OverviewViews``: then ``op_roofline`` and ``mfu`` are None and the critical path's
    ``gain_ns`` null)."""

    info: InfoResult
    report: Report
    utilization: UtilizationResult
    projection: pl.DataFrame
    ops: OpsResult
    kernels: KernelsResult
    overlap: OverlapResult | None
    blocks: BlocksResult | None
    op_roofline: OpRooflineResult | None
    device_pids: dict[int, int]
    #: None without steps, and where the step account is left out for want of memory.
    critical_path: CriticalPathResult | None = None
    mfu: MfuResult | None = None  # None without matrix math

    @property
    def steady_window_ns(self) -> tuple[int, int] | None:
        """First steady step start to last steady step's window end, as the step table records them."""
        return steady_span(self.report.steps.table, start=StepCol.TS)


def overview(trace: Trace, options: DiagnoseOptions | None = None, views: OverviewViews = REPORT_VIEWS) -> Overview:
    """The diagnosis and the views the report (``REPORT_VIEWS``) or the export
    (``ANNOTATED_TRACE_VIEWS``) draws. The views do not depend on
    each other, so on small traces they run at once with the diagnosis (``reports/at_once.py``);
    blocks, overlap and the GPU work per range come from the diagnosis' own context, computed once."""
    options = options or DiagnoseOptions()
    ctx = Context(trace, options)
    gpu = trace.of_kind(*GPU_ACTIVITY_KINDS)
    has_gpu = gpu.height > 0

    def path() -> CriticalPathResult | None:
        steps_result = ctx.steps()
        if not steps_result.table.height or ctx.account_memory() is not None:  # (its graph is the account's)
            return None
        path_options = CriticalPathOptions(marker=options.step_marker, max_steps=CRITICAL_PATH_STEPS,
                                           gain_items=CriticalPathOptions.gain_items if views.path_gains else 0)
        return critical_path(trace, path_options, steps_result, graph=ctx.graph())

    def roofline() -> OpRooflineResult | None:
        if not (views.op_roofline_and_mfu and has_gpu and trace.op_attrs.height):
            return None
        from tracewhy.findings.roofline_ops import op_roofline

        roof = op_roofline(trace)
        return roof if roof.ops.height else None

    def mfu() -> MfuResult | None:
        if not views.op_roofline_and_mfu:
            return None
        from tracewhy.analyses.mfu_steps import measure_mfu

        r = measure_mfu(trace, ctx.steps())
        return r if r.flops_source is not None else None

    (report, info_, utilization_, projection, ops_, kernels_, overlap_, blocks_, roof, path_, mfu_) = at_once.run([
        lambda: diagnose_in(ctx),
        # The diagnosis' steps, when info would compute the same ones (the default warm-up).
        lambda: info(trace, options.step_marker, ctx.steps() if options.warmup is None else None),
        lambda: utilization(trace, UTILIZATION_BINS),
        lambda: _projection_with_device(trace, gpu_work_result(ctx)) if has_gpu else pl.DataFrame(),
        lambda: ops(trace),
        ctx.kernels,
        lambda: overlap_result(ctx) if has_gpu else None,
        lambda: blocks_result(ctx),
        roofline,
        path,
        mfu,
    ], together=at_once.small(trace), name="tracewhy-view")
    return Overview(
        info=info_,
        report=report,
        utilization=utilization_,
        projection=projection,
        ops=ops_,
        kernels=kernels_,
        overlap=overlap_,
        blocks=blocks_ if blocks_.table.height else None,
        op_roofline=roof,
        device_pids={int(d): int(p) for d, p in gpu.group_by(Col.DEVICE).agg(pl.col(Col.PID).mode().first())
                     .select(Col.DEVICE, Col.PID).iter_rows() if p is not None},
        critical_path=path_,
        mfu=mfu_,
    )


def _projection_with_device(trace: Trace, work: GpuWork) -> pl.DataFrame:
    table = gpu_projection(trace, work).table
    if table.height == 0:
        return table.with_columns(pl.lit(None, pl.Int32).alias(Col.DEVICE))
    # The device a range's launches went to: the one its first projected activity ran on is
    # not in the projection table, so take the device of GPU work starting at its projected start.
    gpu = trace.of_kind(*GPU_ACTIVITY_KINDS).select(Col.TS, Col.DEVICE).group_by(Col.TS).agg(pl.col(Col.DEVICE).first())
    return table.join(gpu, left_on="proj_start_ns", right_on=Col.TS, how="left")
