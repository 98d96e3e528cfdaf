"""``unexplained-part``: a part of the step account that is not essential work, takes a large
share of the step, and that no rule explains. It is reported with what the account knows of it
(its top items), so that no large avoidable part of the step is left out of the diagnosis."""

from __future__ import annotations

from typing import Any, Final

import msgspec
import polars as pl

from tracewhy.analyses.account import AccountCol, AccountResult
from tracewhy.analyses.account_names import PartKind, PartName
from tracewhy.analyses.iterations import WindowSource
from tracewhy.analyses.library_frames import part_frames
from tracewhy.analyses.step_units import untraced_by_place
from tracewhy.analyses.steps import StepCol
from tracewhy.analyses.what_if_edits import Fix
from tracewhy.findings.applicability import RunFacts, run_facts
from tracewhy.findings.codes import Code
from tracewhy.findings.context import Context
from tracewhy.findings.model import Finding, Severity
from tracewhy.findings.source_line import has_stacks
from tracewhy.units import fmt_ns as ms
from tracewhy.units import fmt_pct

#: A part is said to sit in a few steps when at least this share of its time falls in at most a
#: third of the analysed steps.
CONCENTRATED_SHARE: Final = 0.8
#: An untraced stretch's place (the op it follows) is named from this share of the part...
PLACE_MIN_SHARE: Final = 0.15
#: ...when the step thread's untraced time per step is within these bounds of the part's.
PLACE_SAME_TIME: Final = (0.8, 1.25)
#: Items of the part named in the statement (the evidence has the account's top items).
_NAMED_ITEMS: Final = 2

#: A user line's host part is said to be library work from this share of it.
LIBRARY_MIN_SHARE: Final = 0.2
#: Library code whose time says what to do, by where torch's own source tree (torch 2.x) keeps
#: it: torch.compile's runtime (Dynamo's frame evaluation and guards, AOT autograd's runtime
#: wrappers, inductor's compiled-code wrappers), and the profiler's own Python (record_function,
#: the profiler's step bookkeeping), which is measurement, not the job.
COMPILE_RUNTIME_DIRS: Final = ("torch/_dynamo/", "torch/_functorch/_aot_autograd/", "torch/_inductor/")
PROFILER_DIRS: Final = ("torch/autograd/profiler.py", "torch/profiler/")

#: Untraced time's items (account_parts: what the thread had open), in words.
_UNTRACED_WHERE: Final = {"nothing open": "with no op or range open", "nothing but the step open":
                          "with only the step's own range open"}

#: What to try first, by the part's kind (the part's own name says where).
_ADVICE: Final = {
    PartKind.SYNC: "Remove the wait or move it out of the loop: tracewhy gaps TRACE shows what the host waited for.",
    PartKind.COPIES: "Copy from pinned memory with non_blocking=True so the copy runs beside compute, or move fewer "
                     "bytes: tracewhy account TRACE lists them.",
    PartKind.COMMUNICATION: "Hide the communication under compute (bucketed, overlapped collectives): tracewhy "
                            "overlap TRACE.",
    PartKind.LAUNCH: "Fewer, larger launches: CUDA graphs or torch.compile(mode='reduce-overhead').",
    PartKind.GPU_GAP: "Fewer, larger launches: CUDA graphs or torch.compile(mode='reduce-overhead').",
}
_DEFAULT_ADVICE: Final = "See what the part is made of: tracewhy account TRACE."


class Shared(msgspec.Struct, frozen=True):
    """What of an unexplained part other findings' fixes remove too (``explain._shared``): their
    codes, the time their fixes together take from the part, of the part's time over the same
    replayed steps, and those fixes."""

    codes: tuple[str, ...]
    taken_ns: int
    part_ns: int
    fixes: tuple[Fix, ...]

    def clause(self) -> str:
        whose = " and ".join(self.codes)
        return (f"; {ms(self.taken_ns)} of it ({fmt_pct(self.taken_ns / max(self.part_ns, 1))}) goes with "
                f"{whose}'s {'fixes' if len(self.codes) > 1 else 'fix'} too, and no other finding explains the rest.")


def unexplained_part(ctx: Context, account: AccountResult, row: dict[str, Any], shared: Shared | None = None
                     ) -> Finding:
    """The finding for one ``parts`` row of the account that no rule's finding claimed; ``shared``:
    what other findings' fixes take of it (said, and in the evidence)."""
    part, kind = str(row[AccountCol.PART]), str(row[AccountCol.KIND])
    ns, share = int(row[AccountCol.NS_PER_STEP]), float(row[AccountCol.SHARE])
    items = account.evidence.filter(pl.col(AccountCol.PART) == part).sort(AccountCol.NS_PER_STEP, descending=True)
    unit = "of the trace's window" if account.source == WindowSource.WHOLE_TRACE else "of the step"
    named = [(item, t) for item, t in items.select(AccountCol.ITEM, AccountCol.NS_PER_STEP).head(
        _NAMED_ITEMS).iter_rows() if item and item not in (part, part.removeprefix("host: "))]
    where = f", most of it {_where(named)}" if named else ""
    what = _describe(part, kind)
    per = "over the trace" if account.source == WindowSource.WHOLE_TRACE else "per step"
    library = _library(ctx, account, part, kind, ns)
    facts = run_facts(ctx)
    next_step = _advice(kind, str(items.row(0)[1]) if items.height else "", facts, has_stacks(ctx))
    if library is not None and library.leader == _COMPILE_RUNTIME:
        next_step = _compile_runtime_advice(facts)
    elif library is not None and library.leader == _PROFILER:
        next_step = _PROFILER_ADVICE
    return Finding(
        code=Code.UNEXPLAINED_PART, severity=Severity.MEDIUM,
        statement=f"{fmt_pct(share)} {unit} is {what} ({ms(ns)} {per} on the critical path){where}"
                  f"{_concentrated(account, part)}{_untraced_places(ctx, part, ns)}"
                  f"{library.clause if library is not None else ''}"
                  + (shared.clause() if shared is not None else ", and no other finding explains it."),
        next_step=next_step,
        part=part,
        evidence={"part": part, "kind": kind, "part_ns_per_step": ns, "share": round(share, 4),
                  "items": [{"item": i, "ns_per_step": t} for i, t in
                            items.select(AccountCol.ITEM, AccountCol.NS_PER_STEP).iter_rows()],
                  **({} if library is None else {"library_ns_per_step": library.ns_per_step,
                                                 "library": library.top}),
                  **({} if shared is None else {"shared_with": list(shared.codes),
                                                "shared_ns_per_step": shared.taken_ns})},
    )


class _Library(msgspec.Struct, frozen=True):
    """The library Python inside a user line's host part: per step in all, its largest functions
    (label and ns per step), the clause that says so, and whether torch.compile's runtime leads."""

    ns_per_step: int
    top: list[dict[str, Any]]
    clause: str
    #: Whose code the largest function is, where that says what to do (_COMPILE_RUNTIME,
    #: _PROFILER), else None.
    leader: str | None


def _library(ctx: Context, account: AccountResult, part: str, kind: str, ns: int) -> _Library | None:
    """For host work named by a user frame, on a trace with Python frames: how much of its time on
    the path the library functions that frame calls hold in their own Python (``library_frames``),
    when that is at least LIBRARY_MIN_SHARE of the part."""
    if kind != PartKind.HOST or not part.startswith("host: ") or ns <= 0 or not has_stacks(ctx):
        return None
    split = part_frames(ctx.step_model(), part)
    if not split.library or split.library_share < LIBRARY_MIN_SHARE:
        return None
    largest = [(f.label, f.ns_per_step) for f in split.library[:_NAMED_ITEMS + 3]]
    top: list[dict[str, Any]] = [{"frame": label, "ns_per_step": t} for label, t in largest]
    # The second and later only where they are a tenth of the library time or more.
    named = ", ".join(f"`{label}` {ms(t)}" for i, (label, t) in enumerate(largest[:_NAMED_ITEMS])
                      if i == 0 or t >= 0.1 * split.library_ns)
    clause = (f"; {fmt_pct(split.library_share)} of it ({ms(split.library_ns)}) runs in the library functions "
              f"that line calls, most in {named}")
    first = split.library[0].path
    leader = (_COMPILE_RUNTIME if any(d in first for d in COMPILE_RUNTIME_DIRS) else
              _PROFILER if any(d in first for d in PROFILER_DIRS) else None)
    return _Library(split.library_ns, top, clause, leader)


_COMPILE_RUNTIME: Final = "compile runtime"
_PROFILER: Final = "profiler"
_PROFILER_ADVICE: Final = (
    "The library time is led by the profiler's own Python (torch.autograd.profiler's record_function, the "
    "profiler's bookkeeping): that is the measurement, not the job, and it is gone when the job runs unprofiled. "
    "Time the step again without the profiler (or with fewer record_function blocks in the loop) before changing "
    "the code; tracewhy lines TRACE --all lists the library functions.")


def _compile_runtime_advice(facts: RunFacts) -> str:
    """torch.compile's runtime leads the library time: fewer, larger regions; CUDA graphs where a
    GPU runs the step."""
    graphs = "" if facts.cpu_only else (", and mode='reduce-overhead' (CUDA graphs) takes most of it off the "
                                        "host")
    return ("The library time is led by torch.compile's own per-call work (Dynamo's frame wrapper and guards, AOT "
            "autograd's and inductor's runtime wrappers), paid on every call of a compiled region: make fewer, "
            f"larger compiled regions per step (remove graph breaks; compile the whole step, not pieces){graphs}. "
            "with_stack inflates Python time: time the step again without it. tracewhy lines TRACE --all lists "
            "the library functions.")


def _concentrated(account: AccountResult, part: str) -> str:
    """"; 95% of it in 3 of the 13 analysed steps (#4, #8, #12)" when most of the part's time
    (``CONCENTRATED_SHARE``) falls in at most a third of the analysed steps: a mean per step that
    most steps do not pay (a spike's work, such as an evaluation every few steps)."""
    steps = account.windows.select(AccountCol.STEP, AccountCol.NUMBER).rows()
    if len(steps) < 3:
        return ""
    spent = dict(account.per_step.filter(pl.col(AccountCol.PART) == part)
                 .select(AccountCol.STEP, AccountCol.NS).rows())
    ranked = sorted(((int(spent.get(step, 0)), step, number) for step, number in steps), key=lambda r: (-r[0], r[1]))
    total = sum(r[0] for r in ranked)
    held, top = 0, []
    for ns, step, number in ranked:
        if held >= CONCENTRATED_SHARE * total:
            break
        held += ns
        top.append(step if number is None else number)
    if total <= 0 or len(top) > len(steps) // 3:
        return ""
    return (f"; {fmt_pct(held / total)} of it in {len(top)} of the {len(steps)} analysed steps "
            f"({', '.join(f'#{n}' for n in sorted(top))})")


def _untraced_places(ctx: Context, part: str, ns: int) -> str:
    """"; on the step's thread it falls most at the step's start (3.282 ms per step) and after
    `aten::empty` (1.921 ms)" for the untraced part: the op or annotation each untraced stretch of
    the steady steps follows, those with at least ``PLACE_MIN_SHARE`` of the part, up to two:
    where to look in the code when the trace has no Python frames. Only where the thread's
    untraced time is about the part's (``PLACE_SAME_TIME``)."""
    if part != PartName.UNTRACED or ns <= 0:
        return ""
    steady = [i for i, s in enumerate(ctx.steps().table.get_column(StepCol.STEADY).to_list()) if s]
    by_place = untraced_by_place(ctx.trace, ctx.steps(), ctx.host(), steady)
    # The thread's untraced time is the part's only where the two agree (on a GPU run the thread
    # also waits untraced while the GPU holds the critical path: that time is no part of this).
    if not PLACE_SAME_TIME[0] * ns <= sum(t for _, t in by_place) <= PLACE_SAME_TIME[1] * ns:
        return ""
    places = [(name, t) for name, t in by_place if t >= PLACE_MIN_SHARE * ns][:2]
    if not places:
        return ""
    said = [("at the step's start" if name is None else f"after `{name}`") + f" ({ms(round(t))}"
            + (" per step)" if i == 0 else ")") for i, (name, t) in enumerate(places)]
    return f"; on the step's thread it falls most {' and '.join(said)}"


def _where(named: list[tuple[str, int]]) -> str:
    """'in `a` 1 ms, `b` 2 ms'; untraced time's items say what was open instead ('with no op or
    range open 5 ms')."""
    said: list[str] = []
    for item, t in named:
        words = _UNTRACED_WHERE.get(item)
        if words is None:
            words = f"`{item}`" if said and said[-1].startswith(("in `", "`")) else f"in `{item}`"
        said.append(f"{words} {ms(t)}")
    return ", ".join(said)


def _advice(kind: str, top_item: str, facts: RunFacts, stacks: bool) -> str:
    """What to try first; launch time held by one copy call is that copy's wait, not many launches
    (TraceLens' MI300X decode step: one hipMemcpyAsync holds the host for 7.8 ms). Host work on a
    CPU-only run has no GPU work to hide under, and only a PyTorch program has DataLoader workers.
    Untraced time and host work are looked into with the trace's Python frames where it has them
    (``lines``), else with a capture that records them. Communication on a run with no GPU runs on
    the backend's threads, which the overlap analysis (device streams) does not see: a late rank
    or collectives that outlast their compute."""
    if kind == PartKind.IDLE:
        return ("Find what the thread did while nothing was recorded (untraced Python, a sleep, an input wait): "
                + ("tracewhy lines TRACE shows the source lines that ran there." if stacks else
                   "this trace has no Python frames, so capture again with with_stack=True (then tracewhy lines "
                   "TRACE), or py-spy the job."))
    lines = ("tracewhy lines TRACE shows its source lines." if stacks else
             "capture with with_stack=True to see its source lines (tracewhy lines TRACE).")
    if kind == PartKind.HOST:
        beside = "beside the step's compute" if facts.cpu_only else "beside the GPU work"
        worker = ", a DataLoader worker" if facts.pytorch else ""
        return (f"Move this host work out of the step, make it cheaper, or run it {beside} (a side "
                f"thread{worker}); {lines}")
    if kind == PartKind.COMMUNICATION and facts.cpu_only:
        return ("See whether another rank makes this one wait: tracewhy ranks on every rank's trace gives each "
                "collective's arrival skew. If none arrives late, the collectives outlast the compute they could "
                "run beside: all-reduce less often (gradient accumulation, DDP's no_sync()) or fewer bytes (a "
                "compression comm hook).")
    if kind == PartKind.LAUNCH and "Memcpy" in top_item:
        return (f"The launch time is mostly `{top_item}` calls, a copy the host waits in: copy from pinned memory "
                "with non_blocking=True, or move the copy out of the step; tracewhy gaps TRACE shows what it "
                "waited for.")
    return _ADVICE.get(kind, _DEFAULT_ADVICE)


def _describe(part: str, kind: str) -> str:
    """The part in words: 'host Python in `prep.py:52 tokenize`', 'launch overhead'."""
    if part.startswith("host: "):
        return f"host work in `{part.removeprefix('host: ')}`"
    if part == PartName.UNTRACED:
        return "host time with nothing recorded (untraced Python)"
    if kind == PartKind.HOST:
        return f"host work in `{part}`"
    return f"`{part}`"
