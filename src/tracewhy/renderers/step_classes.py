"""Inference steps by class (prefill, decode, mixed) and the decode steps' memory bandwidth
utilization, as the terminal lines ``steps`` and ``diagnose`` print and their JSON entry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, TypedDict

from tracewhy.renderers import View
from tracewhy.renderers.layout import Layout, label, name, number, text
from tracewhy.units import fmt_bytes, fmt_ns, fmt_pct, printable

if TYPE_CHECKING:  # types only: the results come from the analyses, which the report has loaded
    import polars as pl
    from rich.console import RenderableType

    from tracewhy.analyses.step_bytes import DecodeBandwidth
    from tracewhy.analyses.step_classes import STEP_CLASSES_SCHEMA, ClassSummary, StepClasses
    from tracewhy.renderers.json_schema import rows


class InferenceJson(TypedDict):
    """An inference trace's steps classed prefill, decode or mixed (each with the evidence that
    decided), per class the count, median time, share of the trace and tokens per second, and
    the decode steps' memory bandwidth utilization."""

    steps: Annotated[pl.DataFrame, rows(STEP_CLASSES_SCHEMA, "one row per classed step, in time order")]
    #: Every step of the class, warm-up included (a generate loop's prefill is its first step).
    classes: list[ClassSummary]
    trace_span_ns: int
    #: Null without a decode step.
    decode_bandwidth: DecodeBandwidth | None


def inference_json(classes: StepClasses, bandwidth: DecodeBandwidth | None) -> InferenceJson:
    return {"steps": classes.steps, "classes": list(classes.classes), "trace_span_ns": classes.trace_span_ns,
            "decode_bandwidth": bandwidth}


CLASS_TABLE: Final = Layout(
    (label("class"), number("steps"), number("median"), number("total"), number("of trace"), number("GPU busy"),
     number("tokens"), number("tokens/s"), text("decided by")), drop=("total", "GPU busy", "decided by"))


def render_classes(classes: StepClasses, bandwidth: DecodeBandwidth | None) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    from tracewhy.analyses.step_classes import ClassCol  # loaded already: ``classes`` comes from it

    evidence = {c: ", ".join(sorted(set(classes.steps.filter(classes.steps[ClassCol.CLASS] == c)
                                        .get_column(ClassCol.EVIDENCE).to_list())))
                for c in (s.step_class for s in classes.classes)}
    t = CLASS_TABLE.table("inference steps by class (warm-up included)",
                          "time: each step's window (start to the next step's start, or to the end of its GPU work); "
                          "tokens: as the engine's annotation or the attention shapes record them")
    for s in classes.classes:
        t.add_row(s.step_class, str(s.count), fmt_ns(s.median_ns), fmt_ns(s.total_ns), fmt_pct(s.share),
                  fmt_ns(s.gpu_busy_ns),
                  "-" if s.tokens is None else str(s.tokens),
                  "-" if s.tokens_per_s is None else f"{s.tokens_per_s:,.1f}", evidence[s.step_class])
    parts: list[RenderableType] = [t]
    if bandwidth is not None:
        parts.append(Text(bandwidth_line(bandwidth)))
    return Group(*parts)


def bandwidth_line(b: DecodeBandwidth) -> str:
    """One line: the decode steps' bytes, rate and MBU, and how the bytes were estimated."""
    if b.bytes_per_s is None:
        return f"decode MBU: not estimated: {printable(b.note or 'no bytes')}"
    bound = "at least " if b.lower_bound else ""
    source = ("as given" if b.given_bytes_per_step is not None else
              f"weights {fmt_bytes(b.weight_bytes)} from {b.gemm_calls} GEMM call(s), KV {fmt_bytes(b.kv_bytes)} from "
              f"{b.attention_calls} attention call(s)")
    head = (f"decode memory traffic: {bound}{fmt_bytes(b.bytes_read)} over {b.steps} step(s) ({source}) in "
            f"{fmt_ns(b.time_ns)}: {bound}{b.bytes_per_s / 1e9:,.1f} GB/s")
    if b.mbu is not None and b.peak_bytes_per_s:
        head += f", MBU {bound}{fmt_pct(b.mbu)} of {b.device}'s {b.peak_bytes_per_s / 1e12:.2f} TB/s"
    else:
        head += " (no device bandwidth in the peak table: MBU not computed)"
    return head + f". {b.how}" + (f"; {printable(b.note)}" if b.note else "")


def with_classes(payload: dict[str, Any], view: View, classes: StepClasses | None,
                 bandwidth: DecodeBandwidth | None,
                 by_class: pl.DataFrame | None = None) -> tuple[dict[str, Any], View]:
    """``payload`` with ``inference`` (and ``parts_by_class`` when given) and ``view`` with their
    tables after it; unchanged when no step was classed (not an inference trace)."""
    if classes is None:
        return payload, view

    def with_table() -> RenderableType:
        from rich.console import Group

        tables = [render_classes(classes, bandwidth)]
        if by_class is not None and by_class.height:
            tables.append(render_parts_by_class(by_class))
        return Group(view(), *tables)

    doc = {**payload, "inference": inference_json(classes, bandwidth)}
    if by_class is not None:
        doc["parts_by_class"] = by_class
    return doc, with_table


#: Parts shown per class in the terminal (``--json`` has them all).
PARTS_PER_CLASS: Final = 3
BY_CLASS: Final = Layout((label("class"), number("steps"), name("part"), number("per step"), number("share")), drop=())


def render_parts_by_class(table: pl.DataFrame) -> RenderableType:
    """Each class's largest parts of the step account (``account_classes.parts_by_class``)."""
    from tracewhy.analyses.account import AccountCol
    from tracewhy.analyses.account_classes import STEPS
    from tracewhy.analyses.step_classes import ClassCol

    t = BY_CLASS.table(f"where each class's step goes (its {PARTS_PER_CLASS} largest parts, analysed steps only)")
    for (cls,), rows_ in table.group_by(ClassCol.CLASS, maintain_order=True):
        for n, part, ns, share in rows_.head(PARTS_PER_CLASS).select(
                STEPS, AccountCol.PART, AccountCol.NS_PER_STEP, AccountCol.SHARE).iter_rows():
            t.add_row(str(cls), str(n), part, fmt_ns(ns), fmt_pct(share))
    return t
