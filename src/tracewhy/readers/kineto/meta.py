"""The metadata of a Kineto trace: the header's values (versions, capture options, distributed
info), the accelerator its categories name, and the warnings for what the read counted."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl

from tracewhy.model.schema import Col, Kind, OpAttrCol
from tracewhy.model.trace import KINETO_FORMAT, Capture, TraceMeta, Truncation
from tracewhy.readers.kineto.categories import accelerator
from tracewhy.readers.kineto.header import decode_value
from tracewhy.readers.kineto.plausibility import link_warnings
from tracewhy.readers.kineto.repair import REPAIR_PREFIX, repair_warnings

_VERSION_KEYS = ("cuda_runtime_version", "cuda_driver_version", "cupti_version",
                 "hip_runtime_version", "hip_driver_version", "roctracer_version")
_CAPTURE_KEYS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


class Tally(msgspec.Struct, frozen=True):
    """What a read counted on its way through the events, as the metadata reports it."""

    #: Problems by kind, with their counts: the header's values add theirs as they are decoded.
    problems: dict[str, int]
    #: Events read, by kind (slice kinds, "flow <cat>", "memory", "instant", "metadata", ...).
    counts: dict[str, int]
    #: Every event category seen.
    categories: Collection[str | None]
    #: The profiler's own capture windows (cat "Trace"), in ns.
    spans: tuple[tuple[int, int], ...]
    #: Slices marked "finished": false.
    unfinished: int
    #: Largest |ts| (us) of a slice whose ts had a fraction and was beyond exact float64 ns; 0 if none.
    quantised_us: float
    #: Whether any Python frame (with_stack) was among the slices.
    saw_python: bool
    #: Slices left out for an unreadable start time, by kind.
    dropped: dict[str, int] = msgspec.field(default_factory=dict)


def trace_meta(path: Path, header: dict[str, msgspec.Raw], truncation: Truncation | None, tally: Tally,
               op_attrs: pl.DataFrame, memory: pl.DataFrame, slices: pl.DataFrame) -> TraceMeta:
    """The Trace's metadata: the header's values, what the read counted, and warnings for both.
    Of ``slices`` it reads the kinds, names, times, correlation ids and launches, never the
    nesting's columns: the builder makes it while the nesting is being made."""
    values = {k: decode_value(v, tally.problems) for k, v in header.items()
              if k not in ("deviceProperties", "computeProperties")}
    warnings: list[str] = []
    if truncation is not None:
        warnings.append(_truncation_warning(truncation))
    warnings += repair_warnings(tally.problems)
    warnings += [f"{count} events: {problem}" for problem, count in sorted(tally.problems.items())
                 if not problem.startswith(REPAIR_PREFIX)]
    if tally.unfinished:
        warnings.append(f"{tally.unfinished} events were still open when the profiler stopped")
    warnings += link_warnings(slices)
    distributed = _distributed(values.get("distributedInfo"), warnings)
    schema_version = values.get("schemaVersion")
    base = values.get("baseTimeNanoseconds")
    versions = {k: str(values[k]) for k in _VERSION_KEYS if k in values}
    unit = values.get("displayTimeUnit")
    return TraceMeta(
        path=str(path),
        format=KINETO_FORMAT,
        schema_version=schema_version if isinstance(schema_version, int) else None,
        # displayTimeUnit is a viewer hint only: Chrome-trace ts/dur are always microseconds
        # (a 2024 V100 trace says "ns" over microsecond values; see the hta MANIFEST).
        display_time_unit=unit if isinstance(unit, str) else None,
        base_time_ns=base if isinstance(base, int) else None,
        versions=versions,
        accelerator=_accelerator(tally.categories, versions, slices),
        ts_step_ns=_ts_step_ns(tally.quantised_us),
        capture=_capture(values, tally.saw_python, op_attrs, memory, slices),
        distributed=distributed,
        profiler_spans_ns=tally.spans,
        event_counts=dict(sorted(tally.counts.items())),
        unfinished_events=tally.unfinished,
        dropped_events=dict(sorted(tally.dropped.items())),
        truncation=truncation,
        warnings=tuple(warnings),
    )


#: The largest rank or world size taken: process-group ranks are C ints (int32) in PyTorch.
_RANK_MAX = 2**31 - 1


def _distributed(info: object, warnings: list[str]) -> dict[str, Any]:
    """``distributedInfo`` with a rank or world size that no job has (negative, past int32, not
    an integer) left out and said: a rank of 1e30 is no rank, and counting on it breaks every
    table that holds ranks as integers."""
    if not isinstance(info, dict):
        return {}
    out = dict(info)
    for key in ("rank", "world_size"):
        value = out.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                      and 0 <= value <= _RANK_MAX and (key == "rank" or value > 0)):
            shown = str(value) if len(str(value)) <= 24 else f"{str(value)[:20]}..."
            warnings.append(f"distributedInfo {key} {shown} is not a {key.replace('_', ' ')} "
                            f"(an integer from {0 if key == 'rank' else 1} to {_RANK_MAX}): ignored")
            del out[key]
    return out


def _capture(values: dict[str, Any], saw_python: bool, op_attrs: pl.DataFrame, memory: pl.DataFrame,
             slices: pl.DataFrame) -> Capture:
    # PyTorch >= 2.1 writes the options that were on as top-level "record_shapes": 1 etc.;
    # older files say nothing, so the options are inferred from what the events carry.
    if any(k in values for k in _CAPTURE_KEYS):
        return Capture(**{k: bool(values.get(k)) for k in _CAPTURE_KEYS}, source="header")
    has = op_attrs.select(
        pl.col(OpAttrCol.INPUT_DIMS).is_not_null().any().alias("shapes"),
        pl.col(OpAttrCol.CALL_STACK).is_not_null().any().alias("stack"),
        pl.col(OpAttrCol.FLOPS).is_not_null().any().alias("flops"),
    ).row(0, named=True)
    return Capture(
        record_shapes=bool(has["shapes"]),
        profile_memory=memory.height > 0,
        with_stack=bool(has["stack"]) or saw_python,
        with_flops=bool(has["flops"]),
        with_modules=saw_python and _has_module_frames(slices),
        source="inferred",
    )


def _truncation_warning(t: Truncation) -> str:
    lost = t.bytes_total - t.bytes_recovered
    if t.stream_cut:
        return (f"the gzip stream ends early (the file was cut while being written or copied): recovered "
                f"{t.events_recovered} complete events; how many came after the cut cannot be told")
    if t.events_lost_estimate == 0:
        return (f"file is cut after its events: all {t.events_recovered} events are complete; only fields "
                "written after them (such as traceName, baseTimeNanoseconds) are cut off")
    # The file's tail after its last complete event is only what was written when it was cut:
    # what the run would have written after that is not in the file, so it cannot be counted.
    return (f"file ends mid-event: recovered {t.events_recovered} complete events; the "
            f"{lost} bytes after the last of them (about {t.events_lost_estimate} events) are cut short, and "
            "how many events the run wrote after the cut cannot be told")


def _accelerator(categories: Iterable[str | None], versions: dict[str, str], slices: pl.DataFrame) -> str | None:
    """As ``categories.accelerator``; a CUDA-named trace without version keys (ROCm
    before 6.x wrote none, e.g. the hta MI250 toy) is ROCm if its runtime calls are hip*."""
    found = accelerator(categories, versions)
    if found != "CUDA" or versions:
        return found
    names = slices.filter(pl.col(Col.KIND) == Kind.RUNTIME.value).get_column(Col.NAME).unique()
    return "ROCm" if bool(names.cast(pl.String).str.starts_with("hip").any()) else found


def _ts_step_ns(largest_us: float) -> int:
    """The float64 step (ns, rounded up) at the largest fractional epoch time; 0 if none."""
    return math.ceil(float(np.spacing(largest_us)) * 1000.0) if largest_us else 0


def _has_module_frames(slices: pl.DataFrame) -> bool:
    """with_modules=True writes a Python frame "nn.Module: <class>" per module call."""
    names = slices.filter(pl.col(Col.KIND) == Kind.PYTHON.value).get_column(Col.NAME).unique()
    return bool(names.cast(pl.String).str.starts_with("nn.Module:").any())
