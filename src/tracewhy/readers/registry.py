"""Every input format tracewhy reads, registered once: its name, the kind of input it is, how its
content tells it (a small sniff function), its reader, and the sentence that says what it is when
a command for another kind of input is given it.

Entries name their functions by import path (``"module:function"``): a format's modules are
imported only when a file is told or read as that format, so a cached read imports no reader and
telling a file imports only the sniffs tried. Adding a format is its folder under ``readers/``
and one entry in ``FORMATS`` (docs/architecture.md, "How to add an input format").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import msgspec

from tracewhy.model.trace import KINETO_FORMAT, NSYS_FORMAT

if TYPE_CHECKING:  # the model types the readers of each kind return
    from tracewhy.model.instrument import InstrumentLog
    from tracewhy.model.kernel_provenance import KernelProvenance
    from tracewhy.model.memory_snapshot import MemorySnapshot
    from tracewhy.model.memory_timeline import MemoryTimeline
    from tracewhy.model.ncu import NcuReport
    from tracewhy.model.raw_events import RawEvents
    from tracewhy.model.torch_logs import TorchLogs


class InputKind(Enum):
    """What an input holds, which decides the commands that read it and the model it becomes."""

    TIMELINE = "a timeline trace"  # a Trace (model/trace.py)
    KERNEL_METRICS = "kernel metrics"  # an NcuReport (model/ncu.py)
    MEMORY_SNAPSHOT = "a memory snapshot"  # a MemorySnapshot (model/memory_snapshot.py)
    MEMORY_TIMELINE = "a memory timeline"  # a MemoryTimeline (model/memory_timeline.py)
    COMPILE_LOGS = "compile logs"  # TorchLogs (model/torch_logs.py): TORCH_LOGS or TORCH_TRACE
    STAGE_LOGS = "stage logs"  # an InstrumentLog (model/instrument.py)


class InputFormat(msgspec.Struct, frozen=True):
    """One input format. Functions are ``"module:function"`` paths, imported on first use."""

    name: str
    kind: InputKind
    #: What the format is, in "expected ..." messages.
    description: str
    #: ``(Path) -> bool``, by content, never by file name; it imports nothing heavy. None: the
    #: format is never told by content, only read where a command is told it is one.
    sniff: str | None
    #: The reader. A timeline's: ``(path, *, progress, kinds) -> Trace``; a stage log's:
    #: ``(paths) -> InstrumentLog``; the others': ``(path) -> the model object of their kind``.
    read: str
    #: What the file is and the command that reads it, ``{path}`` standing for the file, said when
    #: a trace command is given one (``other_tool_hint``). None: nothing to say.
    hint: str | None = None
    #: ``(path) -> RawEvents``: the events as the file holds them, for ``tracewhy export``.
    raw_events: str | None = None
    #: Endings of the format's file names, used only where content cannot decide: which files of
    #: a directory are rank traces (``ranks``), which unrecognised file a reader may try to name
    #: the problem of (``roofline``).
    suffixes: tuple[str, ...] = ()
    #: Endings of files beside one of this format whose content is part of it (SQLite's
    #: write-ahead log and hot journal): a key of the file alone would not see them change, so
    #: such a file is read afresh every time, never cached.
    companions: tuple[str, ...] = ()
    #: The trace records operator input shapes (``record_shapes``): ``roofline`` estimates each
    #: operator from them.
    operator_shapes: bool = False

    def matches(self, path: Path) -> bool:
        """Whether the file's content is this format's (False for a format never sniffed)."""
        return self.sniff is not None and bool(_function(self.sniff)(path))

    def reader(self) -> Callable[..., Any]:
        return _function(self.read)


#: In the order their sniffs are tried: within a kind, the first that matches reads the file.
FORMATS: Final = (
    InputFormat(
        KINETO_FORMAT, InputKind.TIMELINE, "PyTorch profiler JSON (.json or .json.gz)",
        sniff="tracewhy.readers.kineto.sniff:is_kineto", read="tracewhy.readers.kineto.reader:read_kineto",
        raw_events="tracewhy.readers.kineto.raw_events:read_raw_events", suffixes=(".json", ".json.gz"),
        operator_shapes=True,
    ),
    InputFormat(
        NSYS_FORMAT, InputKind.TIMELINE, "an Nsight Systems SQLite export",
        sniff="tracewhy.readers.nsys.sniff:is_nsys", read="tracewhy.readers.nsys.reader:read_nsys",
        suffixes=(".sqlite", ".sqlite.gz", ".nsys-rep"), companions=("-wal", "-journal"),
    ),
    InputFormat(
        "ncu", InputKind.KERNEL_METRICS, "an Nsight Compute report (.ncu-rep) or CSV export",
        sniff="tracewhy.readers.ncu.sniff:is_ncu", read="tracewhy.readers.ncu.reader:read_ncu",
        hint="an Nsight Compute report (kernel metrics), not a timeline trace: run tracewhy roofline {path}",
        suffixes=(".ncu-rep", ".csv", ".log", ".txt"),
    ),
    InputFormat(
        "memory-timeline", InputKind.MEMORY_TIMELINE, "a PyTorch memory-timeline export",
        sniff="tracewhy.readers.memory.sniff:is_memory_timeline",
        read="tracewhy.readers.memory.timeline:read_memory_timeline",
        hint="a memory-timeline export, not a profiler trace: run tracewhy memory {path}",
    ),
    InputFormat(
        "memory-snapshot", InputKind.MEMORY_SNAPSHOT, "a CUDA memory snapshot pickle",
        sniff="tracewhy.readers.memory.sniff:is_snapshot",
        read="tracewhy.readers.memory.snapshot:read_memory_snapshot",
        hint="a CUDA memory snapshot (pickle), not a profiler trace: run tracewhy memory {path}",
        # (torch.cuda.memory._dump_snapshot's default is "dump_snapshot.pickle"; its docs use .pickle)
        suffixes=(".pickle", ".pickle.gz", ".pkl", ".pkl.gz"),
    ),
    InputFormat(
        "instrument-log", InputKind.STAGE_LOGS, "a tracewhy.instrument log (JSON Lines)",
        sniff="tracewhy.readers.instrument.sniff:looks_like_instrument_log",
        read="tracewhy.readers.instrument.reader:read_instrument_logs",
        hint="a tracewhy.instrument log (header/mark/block records), not a profiler trace: "
             "run tracewhy pipeline {path} or tracewhy blocks {path}",
    ),
    InputFormat(
        "torch-logs", InputKind.COMPILE_LOGS, 'a TORCH_LOGS="graph_breaks,recompiles" capture',
        sniff=None, read="tracewhy.readers.torch_logs.reader:read_torch_logs",
    ),
    # Second, so that a file no sniff takes is still read (and refused) as a TORCH_LOGS capture.
    InputFormat(
        "torch-trace", InputKind.COMPILE_LOGS, "a TORCH_TRACE directory (structured compile logs)",
        sniff="tracewhy.readers.torch_trace.sniff:is_torch_trace",
        read="tracewhy.readers.torch_trace.reader:read_torch_trace",
        hint="a TORCH_TRACE compile log, not a profiler trace: run tracewhy compile TRACE --logs {path}",
    ),
)


def _function(spec: str) -> Callable[..., Any]:
    # Looked up on every call, not kept: a test or a profiler that patches the function sees it used.
    module, name = spec.split(":")
    return cast("Callable[..., Any]", getattr(importlib.import_module(module), name))


def of_kind(kind: InputKind) -> tuple[InputFormat, ...]:
    return tuple(f for f in FORMATS if f.kind is kind)


def detect(path: Path, kinds: Collection[InputKind]) -> InputFormat | None:
    """The first format of these kinds, in the order given, whose sniff takes the file."""
    for kind in kinds:
        for fmt in of_kind(kind):
            if fmt.matches(path):
                return fmt
    return None


def suffixes(kind: InputKind) -> tuple[str, ...]:
    """The file-name endings of every format of a kind, in registry order."""
    return tuple(s for f in of_kind(kind) for s in f.suffixes)


def expected(kind: InputKind) -> str:
    """The formats of a kind as an "expected ..." message names them: "A, B or C"."""
    names = [f.description for f in of_kind(kind)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def has_companions(path: Path) -> bool:
    """Whether a file some format keeps content in (a log or journal) lies beside ``path``."""
    return any(Path(f"{path}{ending}").exists() for f in FORMATS for ending in f.companions)


def other_tool_hint(path: Path) -> str | None:
    """What a file that is not a trace is, and the command that reads it: an Nsight Compute
    report given to a trace command, a memory-timeline export or snapshot, an instrument log.
    Run only after a read failed, so a trace pays nothing for it."""
    if not path.is_file():
        return None
    for fmt in FORMATS:
        if fmt.hint is not None and fmt.matches(path):
            return fmt.hint.format(path=path)
    return None


def _format_of(kind: InputKind, path: Path) -> InputFormat:
    """The format a file of this kind is read with: the kind's only one, else the first whose
    sniff takes it, else the first of the kind (its reader names what is wrong)."""
    formats = of_kind(kind)
    if len(formats) == 1:
        return formats[0]
    return detect(path, (kind,)) or formats[0]


def read_kernel_metrics(path: Path, fmt: InputFormat | None = None) -> NcuReport:
    return cast("NcuReport", (fmt or _format_of(InputKind.KERNEL_METRICS, path)).reader()(path))


def read_memory_snapshot(path: Path, fmt: InputFormat | None = None) -> MemorySnapshot:
    return cast("MemorySnapshot", (fmt or _format_of(InputKind.MEMORY_SNAPSHOT, path)).reader()(path))


def read_memory_timeline(path: Path, fmt: InputFormat | None = None) -> MemoryTimeline:
    return cast("MemoryTimeline", (fmt or _format_of(InputKind.MEMORY_TIMELINE, path)).reader()(path))


def read_compile_logs(path: Path, fmt: InputFormat | None = None) -> TorchLogs:
    return cast("TorchLogs", (fmt or _format_of(InputKind.COMPILE_LOGS, path)).reader()(path))


def read_kernel_provenance(path: Path) -> KernelProvenance:
    """Which source lines each compiled kernel fuses: a TORCH_TRACE directory or log, or a
    TORCH_LOGS output-code capture (the compile record ``--logs`` names)."""
    return cast("KernelProvenance", _function("tracewhy.readers.torch_logs.provenance:read_kernel_provenance")(path))


def read_stage_logs(paths: list[Path], fmt: InputFormat | None = None) -> InstrumentLog:
    """Every rank log named (files, or directories of logs) as one log, all of one format."""
    return cast("InstrumentLog", (fmt or _format_of(InputKind.STAGE_LOGS, paths[0])).reader()(paths))


def read_raw_events(trace_format: str, path: Path) -> RawEvents | None:
    """The events of a trace as its file holds them, for a format (``TraceMeta.format``) that
    registers a raw-events reader; None for one that does not (its Trace is written instead)."""
    for fmt in FORMATS:
        if fmt.name == trace_format and fmt.raw_events is not None:
            return cast("RawEvents", _function(fmt.raw_events)(path))
    return None
