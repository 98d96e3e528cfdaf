from __future__ import annotations

import argparse
from pathlib import Path

from tracewhy.analyses.memory import MemoryOptions, analyze_memory, analyze_timeline
from tracewhy.analyses.memory_snapshot import analyze_snapshot
from tracewhy.cli.base import Command, add_output_options, emit, load_trace, positive_int
from tracewhy.findings.memory import memory_findings, snapshot_findings
from tracewhy.readers.registry import InputKind, detect, read_memory_snapshot, read_memory_timeline
from tracewhy.renderers.memory import (
    MemoryPayload,
    SnapshotPayload,
    TimelinePayload,
    memory_payload,
    render_memory,
    render_snapshot,
    render_timeline,
    snapshot_payload,
    timeline_payload,
)


class MemoryCommand(Command):
    """Memory: peak allocated/reserved with its step and op, the ledger at the peak, top allocating
    ops, churn and growth per step. Reads a profile_memory trace, a memory-timeline export or a
    CUDA memory snapshot (pickle, read without running it)."""

    name = "memory"
    json_payloads = (MemoryPayload, TimelinePayload, SnapshotPayload)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser, top=15)
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        path = Path(args.trace)
        fmt = detect(path, (InputKind.MEMORY_SNAPSHOT, InputKind.MEMORY_TIMELINE))
        if fmt is not None and fmt.kind is InputKind.MEMORY_SNAPSHOT:
            snap = analyze_snapshot(read_memory_snapshot(path, fmt))
            found = snapshot_findings(snap)
            emit(args, self.name, snapshot_payload(snap, found), lambda: render_snapshot(snap, found, args.top))
        elif fmt is not None:
            tl = read_memory_timeline(path, fmt)
            r = analyze_timeline(tl)
            emit(args, self.name, timeline_payload(r, tl.layout.value, tl.events),
                 lambda: render_timeline(r, tl.layout.value))
        else:
            result = analyze_memory(load_trace(args.trace), MemoryOptions(marker=args.step, warmup=args.warmup))
            found = memory_findings(result)
            emit(args, self.name, memory_payload(result, found), lambda: render_memory(result, found, args.top))
        return 0
