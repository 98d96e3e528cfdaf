"""Pipeline stages from stage marks: period, per-stage work, hidden time and OverlapScore per chunk.

Every quantity is a difference of two marks of one rank, so no two ranks' clocks are ever
compared (they are not aligned). With the default marks (rank 0: ``tA0 tA1 tSend tRecv tDecode
tEmit``; the mesh leader: ``tB0 tB1``), per chunk k:

    period_k  = tEmit_k - tEmit_{k-1}                      (the rank holding the period mark)
    stage0_k  = (tA1_k - tA0_k) + (tEmit_k - tDecode_k)    (rank 0's own work on chunk k)
    stage1_k  = tB1_k - tB0_k                              (the leader's work)
    hidden_k  = stage0_k + stage1_k - period_k
    OverlapScore_k = clip(hidden_k / min(stage0_k, stage1_k), 0, 1)

For N stages the denominator is sum - max (the most that overlap could hide), which is the min
for two. A ``PipelineSpec`` maps other mark names, so any pipeline with start/end marks per
stage reads the same way. The verdict itself (overlapped or serialized, the gate) is judged in
``findings/pipeline.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

from tracewhy.analyses.stats import nearest_ns
from tracewhy.errors import TraceError, UsageError
from tracewhy.model.instrument import InstrumentLog, MarkCol
from tracewhy.rows import Rows


@dataclass(frozen=True)
class Stage:
    """A stage's work per chunk: the sum of (start mark, end mark) intervals, all on one rank."""

    name: str
    intervals: tuple[tuple[str, str], ...]

    @property
    def marks(self) -> tuple[str, ...]:
        return tuple(m for pair in self.intervals for m in pair)


@dataclass(frozen=True)
class PipelineSpec:
    stages: tuple[Stage, ...]
    period_mark: str


#: The seeds' two-stage pipeline (rank 0 builds and decodes, the mesh leader computes).
DEFAULT_SPEC: Final = PipelineSpec(
    stages=(Stage("stage0", (("tA0", "tA1"), ("tDecode", "tEmit"))), Stage("stage1", (("tB0", "tB1"),))),
    period_mark="tEmit",
)
#: Chunks left out of the summary by default: the first fills the pipeline and has no previous
#: period mark; with an in-flight depth of 2 the second still ramps up.
DEFAULT_WARMUP: Final = 2


class ChunkCol:
    """Columns of ``PipelineResult.chunks`` (one row per chunk with every mark present)."""

    CHUNK: Final = "chunk"
    PERIOD: Final = "period_ns"
    HIDDEN: Final = "hidden_ns"
    SCORE: Final = "overlap_score"
    STEADY: Final = "steady"  # after the warm-up chunks

    @staticmethod
    def stage(name: str) -> str:
        return f"{name}_ns"


#: ``PipelineResult.chunks``' columns whatever the stages; each stage adds ``<stage>_ns`` (Int64).
CHUNKS_SCHEMA: Final = pl.Schema({ChunkCol.CHUNK: pl.Int64(), ChunkCol.PERIOD: pl.Int64(), ChunkCol.HIDDEN: pl.Int64(),
                                  ChunkCol.SCORE: pl.Float64(), ChunkCol.STEADY: pl.Boolean()})


@dataclass(frozen=True)
class Percentiles:
    """A metric over the steady chunks. For a time (a ``*_ns`` column) every value but ``count`` is
    whole nanoseconds, the nearest to the statistic."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: int


@dataclass(frozen=True)
class PipelineResult(Rows, rows="chunks"):
    spec: PipelineSpec
    stage_ranks: dict[str, int]  # the rank whose clock each stage (and "period") is read on
    chunks: pl.DataFrame
    summary: dict[str, Percentiles]  # "period_ns", "<stage>_ns", "hidden_ns", "overlap_score"
    warmup: int
    incomplete_chunks: list[int]  # chunks missing a mark, left out
    duplicate_marks: int  # (rank, chunk, name) recorded more than once: the first was used
    rejected_chunks: dict[int, str]  # chunk -> why its marks are impossible; left out


def parse_stages(text: str, period_mark: str) -> PipelineSpec:
    """``"prep=tA0:tA1+tDecode:tEmit,compute=tB0:tB1"`` -> a PipelineSpec."""
    stages = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, body = part.partition("=")
        if not sep or not name.strip() or not body.strip():
            raise UsageError(f"--stages: {part!r} is not NAME=START:END[+START:END...]")
        pairs = []
        for iv in body.split("+"):
            start, colon, end = iv.strip().partition(":")
            if not colon or not start or not end:
                raise UsageError(f"--stages: {iv.strip()!r} in {name.strip()!r} is not START:END")
            pairs.append((start.strip(), end.strip()))
        stages.append(Stage(name.strip(), tuple(pairs)))
    if len(stages) < 2:
        raise UsageError("--stages: a pipeline needs at least two stages")
    if len({s.name for s in stages}) != len(stages):
        raise UsageError("--stages: stage names must differ")
    return PipelineSpec(stages=tuple(stages), period_mark=period_mark)


def pipeline(log: InstrumentLog, spec: PipelineSpec = DEFAULT_SPEC, warmup: int = DEFAULT_WARMUP) -> PipelineResult:
    """Per-chunk pipeline metrics from ``log``'s marks, each on the clock of the rank holding them.

    Chunks are ordered by the time of their period mark, never by their numbers (a job may count
    them down), and a chunk whose marks are impossible (a stage going backwards, one mark recorded
    twice at different times, a sum past int64) is left out with its reason; a TraceError when
    that leaves out every chunk."""
    if warmup < 0:
        raise UsageError("--warmup must be >= 0")
    marks = log.marks
    key = [MarkCol.RANK, MarkCol.CHUNK, MarkCol.NAME]
    duplicates = marks.height - marks.unique(key).height
    disagree = (marks.group_by(key).agg(pl.col(MarkCol.T).n_unique().alias("times"))
                .filter(pl.col("times") > 1).get_column(MarkCol.CHUNK).unique().to_list())
    marks = marks.unique(key, keep="first", maintain_order=True)
    owner = _owners(marks)
    stage_ranks = {s.name: _stage_rank(s.name, s.marks, owner) for s in spec.stages}
    stage_ranks["period"] = _stage_rank("period", (spec.period_mark,), owner)
    needed = sorted({m for s in spec.stages for m in s.marks} | {spec.period_mark})
    # Pivoted under prefixed names: a mark may be called "chunk", like the index column.
    wide = (
        marks.filter(pl.col(MarkCol.NAME).is_in(needed))
        .select(MarkCol.CHUNK, (_PREFIX + pl.col(MarkCol.NAME)).alias(MarkCol.NAME), MarkCol.T)
        .pivot(on=MarkCol.NAME, index=MarkCol.CHUNK, values=MarkCol.T, aggregate_function="first")
    )
    for m in needed:
        if _col(m) not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Int64).alias(_col(m)))
    complete = pl.all_horizontal(pl.col(_col(m)).is_not_null() for m in needed)
    incomplete = wide.filter(~complete).get_column(MarkCol.CHUNK).sort().to_list()
    period_t = pl.col(_col(spec.period_mark))
    # In time order, the previous period mark, only when it is the neighbouring chunk's.
    ordered = wide.filter(period_t.is_not_null()).sort(_col(spec.period_mark), MarkCol.CHUNK)
    neighbour = (pl.col(MarkCol.CHUNK) - pl.col(MarkCol.CHUNK).shift(1)).abs() == 1
    previous = pl.when(neighbour).then(period_t.shift(1))
    stage_exprs = []
    shadow_exprs = []
    for s in spec.stages:
        parts = [pl.col(_col(end)) - pl.col(_col(start)) for start, end in s.intervals]
        stage_exprs.append(pl.sum_horizontal(parts).alias(ChunkCol.stage(s.name)))
        stage_exprs.append(pl.min_horizontal(parts).alias(_BACKWARDS + s.name))
        shadow_exprs.append(pl.sum_horizontal(p.cast(pl.Float64) for p in parts).alias(_SHADOW + s.name))
    stage_cols = [ChunkCol.stage(s.name) for s in spec.stages]
    total = pl.sum_horizontal(stage_cols)
    hideable = total - pl.max_horizontal(stage_cols)
    # int64 sums wrap silently; the same sums in float64 show where they would have.
    shadow_total = pl.sum_horizontal(pl.col(_SHADOW + s.name) for s in spec.stages)
    measured = (
        ordered.with_columns((period_t - previous).alias(ChunkCol.PERIOD))
        .filter(complete)
        .with_columns(*stage_exprs, *shadow_exprs)
        .with_columns((total - pl.col(ChunkCol.PERIOD)).alias(ChunkCol.HIDDEN),
                      (shadow_total.abs() >= _INT64_AS_FLOAT).alias(_WRAPS))
    )
    rejected = _rejected(measured, spec, set(disagree))
    if rejected and len(rejected) == measured.height:
        raise TraceError(log.source, "no chunk is measurable: " + summarize_rejected(rejected))
    chunks = (
        measured.filter(~pl.col(MarkCol.CHUNK).is_in(list(rejected)))
        .with_columns(
            pl.when(hideable > 0)
            .then((pl.col(ChunkCol.HIDDEN) / hideable).clip(0.0, 1.0))
            .otherwise(None)
            .alias(ChunkCol.SCORE)
        )
        .with_columns((pl.int_range(pl.len()) >= warmup).alias(ChunkCol.STEADY))
        .select(ChunkCol.CHUNK, ChunkCol.PERIOD, *stage_cols, ChunkCol.HIDDEN, ChunkCol.SCORE, ChunkCol.STEADY)
    )
    steady = chunks.filter(pl.col(ChunkCol.STEADY))
    summary = {c: _percentiles(steady.get_column(c), whole=c.endswith("_ns"))
               for c in (ChunkCol.PERIOD, *stage_cols, ChunkCol.HIDDEN, ChunkCol.SCORE)}
    return PipelineResult(spec=spec, stage_ranks=stage_ranks, chunks=chunks, summary=summary, warmup=warmup,
                          incomplete_chunks=[int(c) for c in incomplete], duplicate_marks=duplicates,
                          rejected_chunks=rejected)


_PREFIX: Final = "mark:"
_BACKWARDS: Final = "_shortest_interval:"
_SHADOW: Final = "_float_sum:"
_WRAPS: Final = "_wraps"
_INT64_AS_FLOAT: Final = 2.0**63


def _col(mark: str) -> str:
    return _PREFIX + mark


def _rejected(measured: pl.DataFrame, spec: PipelineSpec, disagree: set[int]) -> dict[int, str]:
    """Chunk -> why its marks are impossible, for the chunks left out (first reason found)."""
    out: dict[int, str] = {}
    for row in measured.iter_rows(named=True):
        chunk = int(row[MarkCol.CHUNK])
        if chunk in disagree:
            out[chunk] = "a mark recorded twice with times that disagree"
        elif row[_WRAPS]:
            out[chunk] = "stage sums past the 64-bit integers"
        else:
            back = next((s.name for s in spec.stages if row[_BACKWARDS + s.name] < 0), None)
            if back is not None:
                out[chunk] = f"{back} negative (an end mark earlier than its start mark)"
    return out


def summarize_rejected(rejected: dict[int, str]) -> str:
    """"chunks 5, 6 left out: REASON; chunks 9 ...", one clause per reason, ten chunk numbers at most."""
    by_reason: dict[str, list[int]] = {}
    for chunk, reason in sorted(rejected.items()):
        by_reason.setdefault(reason, []).append(chunk)
    clauses = []
    for reason, chunks in by_reason.items():
        shown = ", ".join(map(str, chunks[:10])) + (f" and {len(chunks) - 10} more" if len(chunks) > 10 else "")
        clauses.append(f"chunks {shown} left out: {reason}")
    return "; ".join(clauses)


def _owners(marks: pl.DataFrame) -> dict[str, list[int]]:
    per = marks.group_by(MarkCol.NAME).agg(pl.col(MarkCol.RANK).unique().sort())
    return {str(n): [int(r) for r in ranks] for n, ranks in per.iter_rows()}


def _stage_rank(stage: str, names: tuple[str, ...], owner: dict[str, list[int]]) -> int:
    """The one rank holding every mark of ``stage``: durations are taken on one clock only."""
    missing = [n for n in names if n not in owner]
    if missing:
        known = ", ".join(sorted(owner)) or "none"
        raise UsageError(f"stage {stage!r} needs marks {missing} that no log has (marks found: {known}); "
                         "map the names with --stages")
    ranks = {r for n in names for r in owner[n]}
    if len(ranks) != 1:
        raise UsageError(f"stage {stage!r}: marks {list(names)} are on ranks {sorted(ranks)}; a stage's marks must "
                         "all be on one rank, since the ranks' clocks are not aligned")
    return ranks.pop()


def _percentiles(values: pl.Series, whole: bool) -> Percentiles:
    """p50/p90/p99 and mean of ``values``; ``whole``: as whole nanoseconds (a time)."""
    v = values.drop_nulls().to_numpy().astype(np.float64)
    if v.size == 0:
        return Percentiles(None, None, None, None, 0)
    p50, p90, p99, mean = (*(float(x) for x in np.percentile(v, [50, 90, 99])), float(v.mean()))
    if whole:
        return Percentiles(nearest_ns(p50), nearest_ns(p90), nearest_ns(p99), nearest_ns(mean), int(v.size))
    return Percentiles(p50, p90, p99, mean, int(v.size))
