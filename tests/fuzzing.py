"""Mutations of real traces, shared by the fuzz tests (tests/test_fuzz.py) and the long fuzz run
(scripts/fuzz.py): Kineto JSON (structure, then bytes, plain or gzip), Nsight Systems SQLite
exports (NULLs, dropped tables and columns, wrong types, lost strings, then bytes) and Nsight
Compute output (CSV cell and shape edits; report truncation and byte flips).

Every mutator takes a ``random.Random`` and returns a new input; ``mutate`` stacks a few and
says what it did, so a failure can be reproduced from its description or its saved file.
"""

from __future__ import annotations

import copy
import csv
import gzip
import io
import json
import math
import random
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The formats the fuzz run counts separately.
FORMATS = ("kineto", "nsys", "ncu")


@dataclass(frozen=True)
class Seed:
    """A real input to mutate: ``kind`` is kineto, nsys, ncu-csv or ncu-rep."""

    kind: str
    relative: str  # under ../shared/traces
    weight: int = 3  # how often the long run picks it among its format's seeds (large ones less)

    @property
    def format(self) -> str:
        return "ncu" if self.kind.startswith("ncu") else self.kind


#: Real inputs (each reads in well under a second), the first of each kind the smallest.
SEEDS: tuple[Seed, ...] = (
    Seed("kineto", "hta/tracecompare_tiny_base_rank1.json.gz"),
    Seed("kineto", "hta/a100_cuda_event_sync_small.json.gz"),
    Seed("kineto", "hta/legacy_2022_inference_rank1_tiny.json.gz"),
    Seed("kineto", "hta/a100_triton_single_kernel.json.gz"),
    Seed("kineto", "hta/a100_torch_add_with_chakra_et_kineto.json.gz"),
    Seed("kineto", "hta/mi250_minitoy_train_rocm6.2.json.gz"),
    Seed("kineto", "perfdigest/rtx4060laptop_torch_sample.json.gz"),
    Seed("kineto", "kineto/tbplugin_test_gpu_metrics_input.json.gz"),
    Seed("nsys", "nsys/nsysai_mock_rtx3080.sqlite.gz"),
    Seed("nsys", "nsys/nvfuser_matmul_h200_2024.6.sqlite.gz"),
    Seed("ncu-csv", "ncu/csv_rtx5070_olajide/saxpy.csv"),
    Seed("ncu-csv", "ncu/csv_rtx5070_olajide/gemm_tiled.csv"),
    Seed("ncu-csv", "ncu/csv_b200_superbench/cublaslt_ncu.log"),
    Seed("ncu-rep", "ncu/a100pcie_mistic_searchkernel_ncu2020.ncu-rep"),
    # Richer and larger: steps synchronized per block, many ranks, NCCL, torch.compile, counters,
    # MPI and NVTX, a newer ncu.
    Seed("kineto", "hta/gp100_step_sync_gpu_user_annotation_2023.json.gz", 2),
    Seed("kineto", "tracelens/mi300x_torch_compile_triton_small.json.gz", 2),
    Seed("kineto", "hta/cpu_only_gloo_rank34of300.json.gz", 2),
    Seed("kineto", "hta/sampled_128rank_job_rank0.json.gz", 1),
    Seed("kineto", "hta/a100_cupti_profiler_counters.json.gz", 1),
    Seed("kineto", "hta/a100_ddp2_rank0_nccl2.17.json.gz", 1),
    Seed("nsys", "nsys/pipit_saxpy_mpi_cuda_a100_2022.2.sqlite.gz", 1),
    Seed("nsys", "nsys/nvfuser_xent_h200_2025.1.sqlite.gz", 1),
    Seed("ncu-rep", "ncu/h100_appliedai_stochround_base2.ncu-rep", 1),
)


@dataclass(frozen=True)
class Mutant:
    """A mutated input: its bytes, the file name ending its reader expects, and what was done."""

    data: bytes
    suffix: str
    steps: tuple[str, ...]


def seed_bytes(seed: Seed, traces: Path) -> bytes:
    """The seed's content, decompressed (mutations decide whether to compress again)."""
    raw = (traces / seed.relative).read_bytes()
    return gzip.decompress(raw) if seed.relative.endswith(".gz") else raw


# ----------------------------------------------------------------------------- values

_HUGE_NUMBERS: tuple[Any, ...] = (
    2**63, 2**63 - 1, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30), 1e308, -1e308, 1e-300,
    float("nan"), float("inf"), float("-inf"), -1, -1.5, 0, -0.0, 0.5, 2**31, -(2**31), 2**53 + 1,
)
_STRINGS: tuple[str, ...] = (
    "", " ", "x", "12", "-3", "1e5", "nan", "NaN", "Infinity", "0x10", "1,5", "ProfilerStep#", "ProfilerStep#x",
    "ProfilerStep#-1", "ProfilerStep#99999999999999999999", "nccl:all_reduce", "cudaLaunchKernel",
    "\x00", "\x1b[31mred", "é\u202e", "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "a" * 5000, "[1, 2]", "{}", "true", "null",
)


def random_value(rng: random.Random) -> Any:
    """A JSON value of any type, biased towards the awkward ones."""
    choice = rng.randrange(9)
    if choice == 0:
        return rng.choice(_HUGE_NUMBERS)
    if choice == 1:
        return rng.randint(-5, 5)
    if choice == 2:
        return rng.uniform(-1e6, 1e18)
    if choice == 3:
        return rng.choice(_STRINGS)
    if choice == 4:
        return None
    if choice == 5:
        return rng.choice([True, False])
    if choice == 6:
        return [rng.choice([1, "a", None, [], 2.5])] * rng.randrange(4)
    if choice == 7:
        return {rng.choice(["a", "ts", "name", ""]): rng.choice([1, "x", None])}
    return str(rng.choice(_HUGE_NUMBERS))


# ----------------------------------------------------------------------------- Kineto

#: Event fields the reader uses, and the args that link events or describe kernels.
_EVENT_KEYS = ("ts", "dur", "ph", "name", "cat", "pid", "tid", "id", "bp", "s", "args", "cname")
_ARG_KEYS = ("correlation", "External id", "device", "stream", "grid", "block", "bytes", "Input Dims",
             "Input type", "Sequence number", "Fwd thread id", "Python id", "Python parent id",
             "Total Reserved", "Total Allocated", "Bytes", "Addr", "Device Id", "Device Type", "labels",
             "name", "sort_index", "registers per thread", "shared memory", "queued", "context",
             "Collective name", "In msg nelems", "Group size", "Process Group Ranks", "kernel_backend",
             "memory bandwidth (GB/s)", "wait_on_stream", "wait_on_cuda_event_record_corr_id")
_PHASES = ("X", "B", "E", "i", "I", "s", "f", "t", "M", "C", "b", "e", "n", "P", "O", "N", "D", "", "x")
_TOP_KEYS = ("deviceProperties", "distributedInfo", "displayTimeUnit", "baseTimeNanoseconds", "schemaVersion",
             "traceName", "cuda_runtime_version", "with_stack", "record_shapes", "profile_memory",
             "trace_id", "traceEvents")
_TIME_UNITS = ("ns", "ms", "us", "s", "NS", "", "bogus")

Doc = dict[str, Any]
KinetoMutator = Callable[[Doc, random.Random], str]


def _events(doc: Doc) -> list[Any]:
    events = doc.get("traceEvents")
    return events if isinstance(events, list) else []


def _pick_event(doc: Doc, rng: random.Random) -> dict[str, Any] | None:
    events = [e for e in _events(doc) if isinstance(e, dict)]
    return rng.choice(events) if events else None


def k_type_swap(doc: Doc, rng: random.Random) -> str:
    """A random event field (or args field) gets a value of another type."""
    event = _pick_event(doc, rng)
    if event is None:
        return "no events"
    value = random_value(rng)
    args = event.get("args")
    if isinstance(args, dict) and rng.random() < 0.5:
        key = rng.choice([k for k in args if rng.random() < 0.5] or list(_ARG_KEYS))
        args[key] = value
        return f"args[{key!r}] of a {event.get('ph')!r} event = {value!r:.60}"
    key = rng.choice(_EVENT_KEYS)
    event[key] = value
    return f"{key} of a {event.get('ph')!r} event = {value!r:.60}"


def k_delete_field(doc: Doc, rng: random.Random) -> str:
    event = _pick_event(doc, rng)
    if event is None:
        return "no events"
    args = event.get("args")
    if isinstance(args, dict) and args and rng.random() < 0.5:
        key = rng.choice(list(args))
        del args[key]
        return f"deleted args[{key!r}] of a {event.get('ph')!r} event"
    if not event:
        return "empty event"
    key = rng.choice(list(event))
    del event[key]
    return f"deleted {key} of an event"


def k_extreme_number(doc: Doc, rng: random.Random) -> str:
    """A time, id or size of one event (or of every event with the field) becomes extreme."""
    value = rng.choice(_HUGE_NUMBERS)
    key = rng.choice(("ts", "dur", "pid", "tid", "id", "args.correlation", "args.External id", "args.device",
                      "args.stream", "args.bytes", "args.grid", "args.Total Allocated"))
    every = rng.random() < 0.15
    events = [e for e in _events(doc) if isinstance(e, dict)]
    if not events:
        return "no events"
    targets = events if every else [rng.choice(events)]
    for event in targets:
        if key.startswith("args."):
            args = event.setdefault("args", {})
            if isinstance(args, dict):
                args[key[5:]] = [value, value, value] if key == "args.grid" and rng.random() < 0.5 else value
        else:
            event[key] = value
    return f"{key} = {value!r} in {'every event' if every else 'one event'}"


def k_phase(doc: Doc, rng: random.Random) -> str:
    event = _pick_event(doc, rng)
    if event is None:
        return "no events"
    old, event["ph"] = event.get("ph"), rng.choice(_PHASES)
    return f"ph {old!r} -> {event['ph']!r}"


def k_string(doc: Doc, rng: random.Random) -> str:
    event = _pick_event(doc, rng)
    if event is None:
        return "no events"
    key = rng.choice(("name", "cat", "name", "pid", "tid"))
    event[key] = rng.choice(_STRINGS)
    return f"{key} = {event[key]!r:.40}"


def k_duplicate(doc: Doc, rng: random.Random) -> str:
    events = _events(doc)
    if not events:
        return "no events"
    n = rng.randint(1, max(1, len(events) // 4))
    for _ in range(n):
        events.insert(rng.randrange(len(events) + 1), copy.deepcopy(rng.choice(events)))
    return f"duplicated {n} events"


def k_reorder(doc: Doc, rng: random.Random) -> str:
    events = _events(doc)
    if rng.random() < 0.3:
        events.reverse()
        return "reversed the events"
    rng.shuffle(events)
    return "shuffled the events"


def k_drop_events(doc: Doc, rng: random.Random) -> str:
    """Drop a random share of events, or every event of one category (links then dangle)."""
    events = _events(doc)
    cats = sorted({str(e.get("cat")) for e in events if isinstance(e, dict)})
    if cats and rng.random() < 0.5:
        cat = rng.choice(cats)
        events[:] = [e for e in events if not (isinstance(e, dict) and str(e.get("cat")) == cat)]
        return f"dropped every {cat!r} event"
    keep = rng.random()
    events[:] = [e for e in events if rng.random() < keep]
    return f"kept {keep:.0%} of the events"


def k_collide_links(doc: Doc, rng: random.Random) -> str:
    """Many events share one correlation / External id / flow id."""
    key = rng.choice(("correlation", "External id", "id"))
    value = rng.choice((0, 1, -1, 7, "x"))
    count = 0
    for event in _events(doc):
        if isinstance(event, dict) and rng.random() < 0.5:
            if key == "id":
                if "id" in event:
                    event["id"] = value
                    count += 1
            elif isinstance(event.get("args"), dict) and key in event["args"]:
                event["args"][key] = value
                count += 1
    return f"{count} events share {key} = {value!r}"


def k_shift_time(doc: Doc, rng: random.Random) -> str:
    """An event moves, stretches or shrinks: before its parent, past the trace, negative."""
    event = _pick_event(doc, rng)
    if event is None or not isinstance(event.get("ts"), (int, float)):
        return "no timed event"
    ts = event["ts"]
    how = rng.randrange(4)
    if how == 0:
        event["ts"] = ts - rng.choice((1, 1000, 10**6, 10**12))
    elif how == 1:
        event["dur"] = rng.choice((-1, -1000, 10**9, 10**15, 0))
    elif how == 2:
        event["ts"] = rng.choice((0, -1, 1.5))
    else:
        event["ts"] = ts + rng.choice((0.001, 0.5, 10**9))
    return f"moved a {event.get('ph')!r} event (ts {event.get('ts')!r}, dur {event.get('dur')!r})"


def k_top_level(doc: Doc, rng: random.Random) -> str:
    """A top-level field changes: device properties, distributed info, time unit, base time."""
    key = rng.choice(_TOP_KEYS)
    if key == "displayTimeUnit":
        doc[key] = rng.choice(_TIME_UNITS)
    elif key in ("deviceProperties", "distributedInfo") and isinstance(doc.get(key), (list, dict)) \
            and rng.random() < 0.7:
        container = doc[key]
        entries = [e for e in (container if isinstance(container, list) else [container]) if isinstance(e, dict)]
        if entries:
            entry = rng.choice(entries)
            field = rng.choice(list(entry) or ["id"])
            entry[field] = random_value(rng)
            return f"{key}.{field} = {entry[field]!r:.60}"
    elif key == "traceEvents" and rng.random() < 0.8:
        events = _events(doc)
        if events:
            events[rng.randrange(len(events))] = random_value(rng)
        return "one event replaced by a non-object"
    else:
        doc[key] = random_value(rng)
    return f"{key} = {doc.get(key)!r:.60}"


_INJECTED_NAMES = {
    "user_annotation": ("ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#7", "## forward ##", "DataLoader.__next__"),
    "cpu_op": ("aten::mm", "aten::item", "aten::copy_", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
               "nccl:all_reduce", "record_param_comms", "aten::_local_scalar_dense"),
    "cuda_runtime": ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMalloc",
                     "cudaMemcpyAsync", "cudaGraphLaunch", "cudaEventSynchronize"),
    "kernel": ("ncclKernel_AllReduce_RING_LL_Sum_float", "ampere_sgemm_128x64_tn", "flash_fwd_kernel",
               "void at::native::elementwise_kernel<128, 2>", "triton_poi_fused_0"),
    "gpu_memcpy": ("Memcpy HtoD (Pageable -> Device)", "Memcpy DtoD (Device -> Device)"),
    "gpu_memset": ("Memset (Device)",),
    "cuda_sync": ("Stream Sync", "Event Sync", "Context Sync"),
    "gpu_user_annotation": ("ProfilerStep#1", "nccl:all_reduce"),
    "python_function": ("train.py(42): step", "<built-in method item>"),
}


def k_inject(doc: Doc, rng: random.Random) -> str:
    """A new event of a kind analyses care about (steps, syncs, collectives, copies, launches),
    placed somewhere in the trace's span and linked, or not, to events already there."""
    events = _events(doc)
    timed = [e for e in events if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))
             and isinstance(e.get("dur"), (int, float)) and math.isfinite(e["ts"]) and math.isfinite(e["dur"])]
    if not timed:
        return "no timed events"
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + e["dur"] for e in timed)
    cat = rng.choice(list(_INJECTED_NAMES))
    host = [e for e in timed if e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation")]
    gpu = [e for e in timed if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    like = rng.choice((gpu if cat.startswith(("kernel", "gpu", "cuda_sync")) else host) or timed)
    ts = start + rng.random() * (end - start) if rng.random() < 0.8 else rng.choice((start, end, like["ts"]))
    event: dict[str, Any] = {
        "ph": "X", "cat": cat, "name": rng.choice(_INJECTED_NAMES[cat]), "pid": like.get("pid"),
        "tid": like.get("tid"), "ts": round(ts, 3), "dur": rng.choice((0, 1, 5, 100, 10_000, end - ts, like["dur"])),
        "args": dict(like.get("args") or {}) if isinstance(like.get("args"), dict) else {},
    }
    linked = [e for e in timed if isinstance(e.get("args"), dict) and "correlation" in e["args"]]
    if linked and rng.random() < 0.7:
        event["args"]["correlation"] = rng.choice(linked)["args"]["correlation"]
        event["args"]["External id"] = event["args"]["correlation"]
    if cat == "kernel" and event["name"].startswith("nccl"):
        event["args"].update({"Collective name": "allreduce", "In msg nelems": rng.choice((0, 1, 2**20)),
                              "Group size": rng.choice((1, 2, 8)), "dtype": "Float"})
    events.insert(rng.randrange(len(events) + 1), event)
    return f"injected a {cat} {event['name']!r} at ts {event['ts']} dur {event['dur']}"


def k_retime(doc: Doc, rng: random.Random) -> str:
    """Many events at once: all at one instant, scaled (as if written in another unit), or with
    zero duration."""
    timed = [e for e in _events(doc) if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))]
    if not timed:
        return "no timed events"
    share = rng.choice((0.1, 0.5, 1.0))
    chosen = [e for e in timed if rng.random() < share]
    how = rng.randrange(3)
    if how == 0:
        instant = rng.choice(chosen or timed)["ts"]
        for e in chosen:
            e["ts"] = instant
        return f"{len(chosen)} events at ts {instant}"
    if how == 1:
        factor = rng.choice((1000, 0.001, -1, 1e-9))
        for e in chosen:
            e["ts"] = e["ts"] * factor
            if isinstance(e.get("dur"), (int, float)):
                e["dur"] = e["dur"] * abs(factor)
        return f"{len(chosen)} events' times scaled by {factor}"
    for e in chosen:
        e["dur"] = 0
    return f"{len(chosen)} events of zero duration"


KINETO_MUTATORS: tuple[KinetoMutator, ...] = (
    k_type_swap, k_type_swap, k_delete_field, k_extreme_number, k_extreme_number, k_phase, k_string,
    k_duplicate, k_reorder, k_drop_events, k_collide_links, k_shift_time, k_shift_time, k_top_level,
    k_inject, k_inject, k_inject, k_retime,
)


def mutate_kineto_doc(text: bytes, rng: random.Random, steps: int) -> tuple[bytes, list[str]]:
    """Apply ``steps`` structural mutations to a Kineto document; the JSON text comes back."""
    doc = json.loads(text)
    done = []
    for _ in range(steps):
        mutator = rng.choice(KINETO_MUTATORS)
        done.append(f"{mutator.__name__}: {mutator(doc, rng)}")
    indent = 1 if rng.random() < 0.2 else None
    return json.dumps(doc, indent=indent, allow_nan=True).encode(), done


# ----------------------------------------------------------------------------- bytes

def b_truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    cut = rng.randrange(len(data) + 1) if data else 0
    return data[:cut], f"truncated at byte {cut} of {len(data)}"


def b_flip(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    if not data:
        return data, "nothing to flip"
    out = bytearray(data)
    n = rng.choice((1, 1, 2, 4, 16))
    for _ in range(n):
        i = rng.randrange(len(out))
        out[i] ^= rng.randrange(1, 256)
    return bytes(out), f"flipped {n} bytes"


def b_splice(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Delete, repeat or insert a run of bytes."""
    if not data:
        return b"\x00", "inserted a NUL into nothing"
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.choice((1, 3, 17, 300)))
    how = rng.randrange(3)
    if how == 0:
        return data[:i] + data[j:], f"deleted bytes {i}:{j}"
    if how == 1:
        return data[:j] + data[i:j] + data[j:], f"repeated bytes {i}:{j}"
    junk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 4, 64))))
    return data[:i] + junk + data[i:], f"inserted {len(junk)} random bytes at {i}"


BYTE_MUTATORS = (b_truncate, b_truncate, b_flip, b_flip, b_splice)


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)


def _bytes_then_maybe_gzip(data: bytes, suffix: str, rng: random.Random, steps: list[str],
                           byte_chance: float) -> Mutant:
    """Maybe a byte mutation on the plain text, maybe gzip, maybe a byte mutation of the gzip."""
    if rng.random() < byte_chance:
        mutator = rng.choice(BYTE_MUTATORS)
        data, what = mutator(data, rng)
        steps.append(f"plain {mutator.__name__}: {what}")
    if rng.random() < 0.5:
        data = _gzip(data)
        suffix += ".gz"
        if rng.random() < byte_chance:
            mutator = rng.choice(BYTE_MUTATORS)
            data, what = mutator(data, rng)
            steps.append(f"gzip {mutator.__name__}: {what}")
    return Mutant(data, suffix, tuple(steps))


# ----------------------------------------------------------------------------- SQLite

#: Tables the nsys reader reads; mutations pick these four times as often as the rest.
_NSYS_FOCUS = ("StringIds", "CUPTI_ACTIVITY_KIND", "NVTX_EVENTS", "TARGET_INFO", "META_DATA", "ThreadNames",
               "PROCESSES", "ANALYSIS_DETAILS", "OSRT_API", "COMPOSITE_EVENTS", "SCHED", "ENUM_CUDA")
_SQL_VALUES: tuple[Any, ...] = (
    None, "x", "", "12", "1e3", -1, 0, 2**63 - 1, -(2**63), 1.5, 1e300, -1e300, b"\x00\xff",
    "\x00bad", 10**15,
)

SqlMutator = Callable[[sqlite3.Connection, random.Random], str]


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


def _pick_table(conn: sqlite3.Connection, rng: random.Random) -> str | None:
    tables = _tables(conn)
    weighted = [t for t in tables for _ in range(4 if t.startswith(_NSYS_FOCUS) else 1)]
    return rng.choice(weighted) if weighted else None


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _rowids(conn: sqlite3.Connection, table: str, rng: random.Random) -> str:
    """A WHERE clause choosing some rows: one, a random share, or all."""
    n = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    how = rng.randrange(3)
    if how == 0 or n == 0:
        return "1"
    if how == 1:
        return f"rowid IN (SELECT rowid FROM \"{table}\" LIMIT 1 OFFSET {rng.randrange(n)})"
    return f"abs(random()) % 100 < {rng.randint(1, 99)}"


def s_null(conn: sqlite3.Connection, rng: random.Random) -> str:
    table = _pick_table(conn, rng)
    if table is None:
        return "no tables"
    column = rng.choice(_columns(conn, table))
    where = _rowids(conn, table, rng)
    conn.execute(f'UPDATE "{table}" SET "{column}" = NULL WHERE {where}')
    return f"{table}.{column} = NULL where {where}"


def s_value(conn: sqlite3.Connection, rng: random.Random) -> str:
    """Text where a number belongs, a number where text belongs, extremes, blobs."""
    table = _pick_table(conn, rng)
    if table is None:
        return "no tables"
    column = rng.choice(_columns(conn, table))
    value = rng.choice(_SQL_VALUES)
    where = _rowids(conn, table, rng)
    conn.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE {where}', (value,))
    return f"{table}.{column} = {value!r} where {where}"


def s_swap_ends(conn: sqlite3.Connection, rng: random.Random) -> str:
    """Events end before they start, or last for ages."""
    tables = [t for t in _tables(conn) if {"start", "end"} <= set(_columns(conn, t))]
    if not tables:
        return "no timed tables"
    table = rng.choice(tables)
    where = _rowids(conn, table, rng)
    expr = rng.choice(('"start" - 1000', '"start"', '"start" + 1000000000000', '-"end"', '"end" * 1000000'))
    conn.execute(f'UPDATE "{table}" SET "end" = {expr} WHERE {where}')
    return f"{table}.end = {expr} where {where}"


def s_shift(conn: sqlite3.Connection, rng: random.Random) -> str:
    """A whole timed table moves against the others (another clock), or collapses to one instant."""
    tables = [t for t in _tables(conn) if {"start", "end"} <= set(_columns(conn, t))]
    if not tables:
        return "no timed tables"
    table = rng.choice(tables)
    shift = rng.choice((-(10**12), -(10**9), 10**9, 10**15))
    if rng.random() < 0.3:
        conn.execute(f'UPDATE "{table}" SET "start" = (SELECT min("start") FROM "{table}"), "end" = '
                     f'(SELECT min("start") FROM "{table}")')
        return f"every {table} row at one instant"
    conn.execute(f'UPDATE "{table}" SET "start" = "start" + ?, "end" = "end" + ?', (shift, shift))
    return f"{table} shifted by {shift} ns"


def s_drop_table(conn: sqlite3.Connection, rng: random.Random) -> str:
    table = _pick_table(conn, rng)
    if table is None:
        return "no tables"
    conn.execute(f'DROP TABLE "{table}"')
    return f"dropped table {table}"


def s_drop_column(conn: sqlite3.Connection, rng: random.Random) -> str:
    """Rebuild a table without one column (CREATE TABLE AS SELECT: declared types change too)."""
    table = _pick_table(conn, rng)
    if table is None:
        return "no tables"
    columns = _columns(conn, table)
    column = rng.choice(columns)
    kept = ", ".join(f'"{c}"' for c in columns if c != column) or "NULL AS nothing"
    conn.execute(f'CREATE TABLE "__fuzz" AS SELECT {kept} FROM "{table}"')
    conn.execute(f'DROP TABLE "{table}"')
    conn.execute(f'ALTER TABLE "__fuzz" RENAME TO "{table}"')
    return f"dropped column {table}.{column}"


def s_delete_rows(conn: sqlite3.Connection, rng: random.Random) -> str:
    table = "StringIds" if rng.random() < 0.4 and "StringIds" in _tables(conn) else _pick_table(conn, rng)
    if table is None:
        return "no tables"
    where = _rowids(conn, table, rng)
    conn.execute(f'DELETE FROM "{table}" WHERE {where}')
    return f"deleted rows of {table} where {where}"


def s_duplicate_rows(conn: sqlite3.Connection, rng: random.Random) -> str:
    table = _pick_table(conn, rng)
    if table is None:
        return "no tables"
    columns = ", ".join(f'"{c}"' for c in _columns(conn, table))
    where = _rowids(conn, table, rng)
    conn.execute(f'INSERT INTO "{table}" ({columns}) SELECT {columns} FROM "{table}" WHERE {where}')
    return f"duplicated rows of {table} where {where}"


SQL_MUTATORS: tuple[SqlMutator, ...] = (
    s_null, s_null, s_value, s_value, s_swap_ends, s_shift, s_drop_table, s_drop_column, s_drop_column, s_delete_rows,
    s_delete_rows, s_duplicate_rows,
)


def _drop_not_null(path: Path) -> None:
    """Remove NOT NULL from the schema text so any cell can be NULL.

    Rewriting sqlite_master keeps the declared types, which a CREATE TABLE AS would lose. Keys
    stay: an INTEGER PRIMARY KEY is the rowid, and without the key its stored rows read as NULL.
    """
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'NOT NULL', '') WHERE type = 'table'")
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute(f"PRAGMA schema_version = {version + 1}")
        conn.commit()
    finally:
        conn.close()


def mutate_sqlite_db(data: bytes, rng: random.Random, steps: int) -> tuple[bytes, list[str]]:
    """Apply ``steps`` SQL mutations to a copy of the export; the new file's bytes come back."""
    done = []
    with tempfile.TemporaryDirectory(prefix="tracewhy-fuzz-") as tmp:
        path = Path(tmp) / "export.sqlite"
        path.write_bytes(data)
        _drop_not_null(path)
        conn = sqlite3.connect(path)
        try:
            for _ in range(steps):
                for _attempt in range(3):  # a key refuses a value, a view names a dropped table: try another
                    mutator = rng.choice(SQL_MUTATORS)
                    try:
                        done.append(f"{mutator.__name__}: {mutator(conn, rng)}")
                        break
                    except sqlite3.Error:
                        conn.rollback()
            conn.commit()
        finally:
            conn.close()
        return path.read_bytes(), done


# ----------------------------------------------------------------------------- ncu CSV

_CELLS: tuple[str, ...] = (
    "", "nan", "NaN", "inf", "-inf", "-1", "0", "-99999999999999999999", "99999999999999999999999",
    "1e400", "abc", "1,2,3", "1.5.6", '"', "(1, 2", "(-5, 0, 1)", "(0, 0, 0)", "\x00", "ü", "n/a", "1,234.5",
    "18446744073709551616", "-0", "  7  ",
)
_UNITS = ("byte", "Kbyte", "Gbyte", "ns", "usecond", "msecond", "second", "%", "cycle", "hz", "Ghz",
          "inst", "bogus", "", "byte/second", "Tbyte/s")
_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed", "Duration", "Memory Throughput",
            "Compute (SM) Throughput", "Achieved Occupancy", "Registers Per Thread", "Block Limit Registers",
            "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", "DRAM Frequency", "SM Frequency")

CsvRows = list[list[str]]
CsvMutator = Callable[[CsvRows, int, random.Random], str]


def _data_rows(rows: CsvRows, header: int) -> list[int]:
    return [i for i in range(header + 1, len(rows)) if len(rows[i]) > 1]


def c_cell(rows: CsvRows, header: int, rng: random.Random) -> str:
    """One cell, or one column in every row, gets an awkward value (metric values most often)."""
    data = _data_rows(rows, header)
    if not data or header < 0:
        return "no data rows"
    names = rows[header]
    wanted = rng.choice(("Metric Value", "Metric Value", "Metric Unit", "Metric Name", "ID", "Block Size",
                         "Grid Size", "Kernel Name", "Device", "CC", "Estimated Speedup", ""))
    column = names.index(wanted) if wanted in names else rng.randrange(len(names))
    name = names[column] if column < len(names) else "?"
    if name == "Metric Unit":
        value = rng.choice(_UNITS)
    elif name == "Metric Name":
        value = rng.choice(_METRICS)
    else:
        value = rng.choice(_CELLS)
    targets = data if rng.random() < 0.1 else [rng.choice(data)]
    for i in targets:
        if column < len(rows[i]):
            rows[i][column] = value
    return f"{name} = {value!r} in {len(targets)} rows"


def c_drop_column(rows: CsvRows, header: int, rng: random.Random) -> str:
    if header < 0:
        return "no header"
    column = rng.randrange(len(rows[header]))
    name = rows[header][column]
    for i in [header, *_data_rows(rows, header)]:
        if column < len(rows[i]):
            del rows[i][column]
    return f"dropped column {name!r}"


def c_ragged(rows: CsvRows, header: int, rng: random.Random) -> str:
    """A row loses its tail (a line cut short) or gains cells."""
    data = _data_rows(rows, header)
    if not data:
        return "no data rows"
    i = rng.choice(data)
    if rng.random() < 0.7:
        rows[i] = rows[i][: rng.randrange(len(rows[i]))]
        return f"row {i} cut to {len(rows[i])} cells"
    rows[i] = rows[i] + ["extra"] * rng.randint(1, 3)
    return f"row {i} has extra cells"


def c_rows(rows: CsvRows, header: int, rng: random.Random) -> str:
    """Rows are deleted, duplicated or shuffled; or the header is repeated, renamed or lost."""
    data = _data_rows(rows, header)
    how = rng.randrange(6)
    if how == 0 and data:
        for i in sorted(rng.sample(data, rng.randint(1, len(data))), reverse=True):
            del rows[i]
        return "deleted data rows"
    if how == 1 and data:
        i = rng.choice(data)
        rows.insert(rng.randrange(header + 1, len(rows) + 1), list(rows[i]))
        return "duplicated a data row"
    if how == 2 and data:
        block = [rows[i] for i in data]
        rng.shuffle(block)
        for i, row in zip(data, block, strict=True):
            rows[i] = row
        return "shuffled data rows"
    if how == 3 and header >= 0:
        rows.insert(rng.randrange(header, len(rows) + 1), list(rows[header]))
        return "repeated the header"
    if how == 4 and header >= 0:
        column = rng.randrange(len(rows[header]))
        old, rows[header][column] = rows[header][column], rng.choice(("", "ID", "Metric Value", "x"))
        return f"renamed header {old!r} to {rows[header][column]!r}"
    if header >= 0:
        del rows[header]
        return "deleted the header"
    return "nothing to do"


CSV_MUTATORS: tuple[CsvMutator, ...] = (c_cell, c_cell, c_cell, c_drop_column, c_ragged, c_rows)


def mutate_ncu_csv(data: bytes, rng: random.Random, steps: int) -> tuple[bytes, list[str]]:
    """Apply ``steps`` table edits to an ncu CSV export (program output before the header stays)."""
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.lstrip("\ufeff").startswith('"ID","Process ID"')), -1)
    prefix = lines[:header] if header >= 0 else []
    rows = [next(csv.reader([line]), []) for line in lines[max(header, 0):]]
    at = 0 if header >= 0 else -1
    done = []
    for _ in range(steps):
        mutator = rng.choice(CSV_MUTATORS)
        done.append(f"{mutator.__name__}: {mutator(rows, at, rng)}")
        at = next((i for i, row in enumerate(rows) if row[:2] == ["ID", "Process ID"]), -1)
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator=rng.choice(("\n", "\n", "\r\n")))
    writer.writerows(rows)
    return ("\n".join(prefix) + ("\n" if prefix else "") + out.getvalue()).encode(), done


# ----------------------------------------------------------------------------- one input

def mutate(seed: Seed, original: bytes, rng: random.Random) -> Mutant:
    """One mutated input from a seed's (decompressed) bytes: a few structural mutations, then
    maybe byte-level ones (every third input only bytes), maybe gzip for the formats that take it."""
    steps = rng.choice((1, 1, 2, 3))
    bytes_only = rng.random() < 0.3
    if seed.kind == "kineto":
        data, done = (original, []) if bytes_only else mutate_kineto_doc(original, rng, steps)
        return _bytes_then_maybe_gzip(data, ".json", rng, done, 1.0 if bytes_only else 0.2)
    if seed.kind == "nsys":
        data, done = (original, []) if bytes_only else mutate_sqlite_db(original, rng, steps)
        return _bytes_then_maybe_gzip(data, ".sqlite", rng, done, 1.0 if bytes_only else 0.1)
    if seed.kind == "ncu-csv":
        data, done = (original, []) if bytes_only else mutate_ncu_csv(original, rng, steps)
        if bytes_only or rng.random() < 0.1:
            mutator = rng.choice(BYTE_MUTATORS)
            data, what = mutator(data, rng)
            done.append(f"{mutator.__name__}: {what}")
        return Mutant(data, ".csv", tuple(done))
    # An ncu report is protobuf inside a small container: only byte damage is worth trying.
    mutator = rng.choice(BYTE_MUTATORS)
    data, what = mutator(original, rng)
    return Mutant(data, ".ncu-rep", (f"{mutator.__name__}: {what}",))
