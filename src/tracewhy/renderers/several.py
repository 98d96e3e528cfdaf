"""What the commands that take several traces (``diagnose``, ``report``, ``steps``, ``gaps``,
``check``) show about them together: how they were read (as ranks of one job, or one after
another, and why), the heading over each trace's own output, and the comparison of the runs of
one program with the first (each run's median step, the shift ``diff`` measures with its
interval, and the verdict), as JSON and on the terminal. Each command's renderer puts its own
single-trace output under these."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypedDict, TypeVar

from tracewhy.renderers import View
from tracewhy.renderers.layout import Layout, label, name, number
from tracewhy.units import fmt_ns, printable

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from tracewhy.findings.compare import Comparison
    from tracewhy.reports.several import PerTrace, SeveralReport

R = TypeVar("R")


class GroupingJson(TypedDict):
    """How the traces were read together."""

    #: "ranks": the ranks of one job (by their distributedInfo), compared; "runs": one after another.
    read_as: str
    #: Why, in a sentence.
    reason: str
    #: Files of the directories given that are not timeline traces, each with why ("FILE: why").
    skipped: list[str]


class ComparedRun(TypedDict):
    """One run in the comparison: its steady steps, and against the first what ``diff`` says."""

    path: str
    steady_steps: int
    #: Median steady step; null without steady steps.
    step_p50_ns: int | None
    #: Against the first: "faster", "slower", "within noise" or "not measured"; null for the
    #: first, and for a run not compared (``relation`` says why).
    verdict: str | None
    #: The shift of the median step from the first's (Hodges-Lehmann, this run minus the
    #: first) and its confidence interval; null where not measured or the steps are too few.
    shift_ns: int | None
    ci_low_ns: int | None
    ci_high_ns: int | None
    #: The interval's coverage (at least the requested 95%).
    confidence: float | None
    #: The shift as a share of the first's median step.
    relative_change: float | None
    #: The verdict with its numbers, as ``diff`` says it.
    statement: str | None
    #: False: the step times measure different things (devices, world size, capture options).
    comparable: bool | None
    not_comparable_because: list[str]
    #: Share of op, kernel and annotation names in common with the first; null for the first.
    name_share: float | None
    #: What this run is to the first (the same program, another rank, a different program); null for the first.
    relation: str | None
    #: The command that compares it with the first in full.
    details: str | None


class ComparisonJson(TypedDict):
    """The runs compared with the first (the baseline)."""

    baseline: str
    #: Whether any run after the first is a run of its program, compared with it.
    compared: bool
    #: What was compared, or why nothing was.
    note: str
    runs: list[ComparedRun]


#: The command that compares two runs in full.
DIFF_COMMAND: Final = "tracewhy diff {a} {b}"


def grouping_payload(r: SeveralReport[Any]) -> GroupingJson:
    assert r.grouping is not None
    return {"read_as": r.grouping.read_as, "reason": r.grouping.reason,
            "skipped": [f"{s.path}: {s.why}" for s in r.skipped]}


def comparison_payload(r: SeveralReport[Any]) -> ComparisonJson | None:
    """The comparison with the first run; None when read as ranks (``ranks`` compares them)."""
    if r.grouping is None or r.as_ranks:
        return None
    first, *later = r.inputs
    relations = {rel.path: rel for rel in r.grouping.relations}
    runs = [_run(first, None, None, None)]
    for i in later:
        rel = relations[i.path]
        runs.append(_run(i, r.comparisons.get(i.path), rel.name_share, rel.why,
                         DIFF_COMMAND.format(a=first.path, b=i.path) if i.path in r.comparisons else None))
    return {"baseline": first.path, "compared": bool(r.comparisons), "note": comparison_note(r), "runs": runs}


def _run(i: PerTrace[Any], c: Comparison | None, share: float | None, why: str | None,
         details: str | None = None) -> ComparedRun:
    s = c.diff.steps if c is not None else None
    return {
        "path": i.path, "steady_steps": i.step_stats.count if i.step_stats else 0,
        "step_p50_ns": i.step_stats.p50_ns if i.step_stats else None,
        "verdict": c.verdict if c else None,
        "shift_ns": round(s.hl_shift_ns) if s else None,
        "ci_low_ns": round(s.ci_low_ns) if s and s.ci_low_ns is not None else None,
        "ci_high_ns": round(s.ci_high_ns) if s and s.ci_high_ns is not None else None,
        "confidence": s.confidence if s and s.ci_low_ns is not None else None,
        "relative_change": c.relative_change if c else None,
        "statement": c.statement if c else None,
        "comparable": c.comparable if c else None,
        "not_comparable_because": list(c.not_comparable_because) if c else [],
        "name_share": share, "relation": why, "details": details,
    }


def comparison_note(r: SeveralReport[Any]) -> str:
    """What the comparison covers, or why there is none."""
    assert r.grouping is not None
    first = r.inputs[0].path
    if r.comparisons:
        left_out = [rel for rel in r.grouping.relations if rel.path not in r.comparisons]
        note = f"runs of the same program as {first}, each compared with it"
        return note + "".join(f"; {rel.path} is not: {rel.why}" for rel in left_out)
    whys = "; ".join(f"{rel.path}: {rel.why}" for rel in r.grouping.relations)
    return f"no comparison: no trace is a run of the same program as {first} ({whys})"


#: The comparison's table: the verdict and the median step stay; the interval leaves first.
RUNS_TABLE: Final = Layout(
    (name("run"), number("steady steps"), number("step p50"), number("shift vs first"), label("interval"),
     label("verdict")),
    drop=("interval", "steady steps"))


def render_grouping(r: SeveralReport[Any]) -> RenderableType:
    """The line that says how the traces were read."""
    from rich.text import Text

    assert r.grouping is not None
    return Text(f"{len(r.inputs)} traces: {printable(r.grouping.reason)}", style="bold")


def heading(i: PerTrace[Any], r: SeveralReport[Any], number_: int) -> Text:
    """The heading over one trace's output: its rank when read as ranks, its place and file."""
    from rich.text import Text

    who = f"rank {i.identity.rank}" if r.as_ranks else f"{number_} of {len(r.inputs)}"
    return Text(f"\n── {who}: {printable(i.path)} ──", style="bold")


def render_comparison(r: SeveralReport[Any]) -> RenderableType | None:
    """The runs compared with the first, or the line that says why they were not; None when
    read as ranks."""
    from rich.console import Group
    from rich.text import Text

    payload = comparison_payload(r)
    if payload is None:
        return None
    if not payload["compared"]:
        return Text(f"\n{printable(payload['note'])}", style="yellow")
    t = RUNS_TABLE.table(caption="the shift of the median step from the first's and its interval, as tracewhy diff "
                                 "measures them")
    for run in payload["runs"]:
        shift = interval = ""
        if run["relation"] is None:
            verdict = "baseline"
        elif run["verdict"] is None:
            verdict = "not compared"
        else:
            verdict = run["verdict"] if run["comparable"] else f"{run['verdict']} (not comparable)"
            if run["shift_ns"] is not None:
                rel = f" ({run['relative_change']:+.1%})" if run["relative_change"] is not None else ""
                shift = _signed(run["shift_ns"]) + rel
            if run["ci_low_ns"] is not None and run["ci_high_ns"] is not None and run["confidence"] is not None:
                interval = (f"[{_signed(run['ci_low_ns'])}, {_signed(run['ci_high_ns'])}] "
                            f"{run['confidence']:.0%}")
        t.add_row(run["path"], str(run["steady_steps"]), fmt_ns(run["step_p50_ns"]), shift, interval, verdict)
    parts: list[RenderableType] = [Text("\nruns of one program, each compared with the first:", style="bold"), t]
    for run in payload["runs"][1:]:
        if run["details"]:
            parts.append(Text(f"details: {printable(run['details'])}", style="dim"))
        elif run["relation"]:
            parts.append(Text(f"{printable(run['path'])} not compared: {printable(run['relation'])}", style="yellow"))
        if run["not_comparable_because"]:
            parts.append(Text(f"{printable(run['path'])} not comparable: "
                              f"{printable('; '.join(run['not_comparable_because']))}", style="yellow"))
    return Group(*parts)


def _signed(ns: int) -> str:
    return ("+" if ns >= 0 else "-") + fmt_ns(abs(ns))


def input_entries(r: SeveralReport[R], single: Callable[[R], tuple[Mapping[str, Any], View]]) -> list[dict[str, Any]]:
    """Each trace's single-trace payload, with its path and rank first (in rank order when read as ranks)."""
    return [{"path": i.path, "rank": i.identity.rank, **single(i.result)[0]} for i in r.by_rank()]


def several_output(r: SeveralReport[R], single: Callable[[R], tuple[Mapping[str, Any], View]],
                   ) -> tuple[Mapping[str, Any], View]:
    """The payload and view of a command on several traces: how they were read, each trace's
    own output under its heading, and the runs compared with the first. One trace left (a
    directory holding one): that trace's output, as if it had been given alone."""
    if r.grouping is None:
        return single(r.inputs[0].result)
    payload = {"grouping": grouping_payload(r), "inputs": input_entries(r, single),
               "comparison": comparison_payload(r)}

    def view() -> RenderableType:
        from rich.console import Group

        parts: list[RenderableType] = [render_grouping(r)]
        for n, i in enumerate(r.by_rank(), 1):
            parts += [heading(i, r, n), single(i.result)[1]()]
        compared = render_comparison(r)
        if compared is not None:
            parts.append(compared)
        return Group(*parts)

    return payload, view
