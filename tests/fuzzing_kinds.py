"""Fuzzing the inputs that are not profiler traces: memory-snapshot pickles (mutated opcode by
opcode), memory-timeline exports, instrument logs (directories of ``*.jsonl``), TORCH_LOGS
files and TORCH_TRACE directories (given with ``--logs``), each with the commands that read it. Used by scripts/fuzz.py
beside tests/fuzzing.py (the profiler traces) and by tests/test_fuzz_kinds.py; the mutations
themselves are in tests/fuzzing_mutators.py.

A mutant here is a set of files: one file for most kinds, a directory of rank logs for the
instrument logs. Seeds are the small real inputs under tests/data/generated (made by torch on
CPU, scripts/gen_traces), and snapshots built as torch's ``_dump_snapshot`` writes them: a
pickle of plain dicts and lists.
"""

from __future__ import annotations

import gzip
import pickle
import random
import shutil
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzzing import BYTE_MUTATORS
from fuzzing_mutators import built_snapshot, mutate_json_doc, mutate_lines, mutate_pickle
from fuzzing_run import Outcome, _debug_env, _last_lines, _native_stderr

GENERATED = Path(__file__).resolve().parent / "data" / "generated"
#: The input kinds of this module, counted separately by the fuzz run.
KIND_FORMATS = ("snapshot", "timeline", "instrument", "torch-logs", "torch-trace")
#: The kinds whose input is a directory of files (rank logs).
DIRECTORY_KINDS = ("instrument", "torch-trace")


@dataclass(frozen=True)
class KindSeed:
    """A real input of one of ``KIND_FORMATS``: ``relative`` under tests/data/generated (a file,
    or the directory of an instrument run); ``built:N`` for snapshot N built here; ``companion``
    the trace a TORCH_LOGS file goes with."""

    kind: str
    relative: str
    weight: int = 3
    companion: str | None = None

    @property
    def format(self) -> str:
        return self.kind


KIND_SEEDS: tuple[KindSeed, ...] = (
    KindSeed("snapshot", "built:0"), KindSeed("snapshot", "built:1"), KindSeed("snapshot", "built:2"),
    KindSeed("timeline", "memory_timeline/cpu_adam_memory_timeline.json.gz"),
    KindSeed("timeline", "memory_timeline/cpu_adam_memory_timeline.raw.json.gz"),
    KindSeed("instrument", "pipeline/d1"), KindSeed("instrument", "pipeline/d2"),
    *(KindSeed("torch-logs", f"cpu_compile_{name}.torch_logs.txt", companion=f"cpu_compile_{name}.pt.trace.json.gz")
      for name in ("break_item", "break_loop", "break_top", "nobreak", "recompile")),
    KindSeed("torch-trace", "cpu_ttrace_break_item.torch_trace", companion="cpu_ttrace_break_item.pt.trace.json.gz"),
    KindSeed("torch-trace", "cpu_ttrace_ranks.torch_trace", companion="cpu_ttrace_ranks_rank1.pt.trace.json.gz"),
)


@dataclass(frozen=True)
class KindMutant:
    """A mutated input: its files (name: bytes), whether they form a directory, what was done."""

    files: dict[str, bytes]
    directory: bool
    suffix: str
    steps: tuple[str, ...]

    def write(self, base: Path) -> Path:
        """The input at ``base`` + suffix: the one file, or a directory holding the files."""
        path = base.with_name(base.name + self.suffix)
        if not self.directory:
            path.write_bytes(next(iter(self.files.values())))
            return path
        path.mkdir()
        for name, data in self.files.items():
            (path / name).write_bytes(data)
        return path


def remove_input(path: Path) -> None:
    """An input written by ``KindMutant.write`` (or a copy of one), and what commands wrote beside it."""
    for leftover in path.parent.glob(path.name + "*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- seeds


def kind_seed_files(seed: KindSeed) -> dict[str, bytes]:
    """The seed's files, decompressed (mutations decide whether to compress again)."""
    if seed.relative.startswith("built:"):
        return {"snapshot.pickle": pickle.dumps(built_snapshot(int(seed.relative[6:])), protocol=4)}
    path = GENERATED / seed.relative
    if path.is_dir():
        return {p.name.removesuffix(".gz"): _inflated(p) for p in sorted(path.iterdir()) if p.is_file()}
    raw = path.read_bytes()
    return {path.name.removesuffix(".gz"): gzip.decompress(raw) if path.name.endswith(".gz") else raw}


def _inflated(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if path.name.endswith(".gz") else raw


def original_path(seed: KindSeed, work: Path) -> Path:
    """The unmutated input as a path (a built snapshot is written once into ``work``)."""
    if not seed.relative.startswith("built:"):
        return GENERATED / seed.relative
    path = work / f"seed-snapshot-{seed.relative[6:]}.pickle"
    if not path.exists():
        path.write_bytes(kind_seed_files(seed)["snapshot.pickle"])
    return path


# ----------------------------------------------------------------------------- one input

def mutate_kind(seed: KindSeed, files: dict[str, bytes], rng: random.Random) -> KindMutant:
    """One mutated input from a seed's files: a few structural mutations (opcodes, JSON nodes or
    lines), then maybe byte-level ones, maybe gzip for the kinds read through gzip."""
    steps = rng.choice((1, 1, 2, 3))
    bytes_only = rng.random() < 0.25
    out = dict(files)
    name = rng.choice(sorted(out))
    data = out[name]
    done: list[str] = []
    if not bytes_only:
        if seed.kind == "snapshot":
            data, done = mutate_pickle(data, rng, steps)
        elif seed.kind == "timeline":
            data, done = mutate_json_doc(data, rng, steps)
        else:
            data, done = mutate_lines(data, rng, steps, as_json=seed.kind == "instrument")
            if seed.kind == "torch-trace" and rng.random() < 0.3:
                data = gzip.compress(data, compresslevel=1, mtime=0)
                del out[name]
                name += ".gz"
                done.append("gzip")
    if bytes_only or rng.random() < 0.15:
        mutator = rng.choice(BYTE_MUTATORS)
        data, what = mutator(data, rng)
        done.append(f"{mutator.__name__}: {what}")
    suffix = {"snapshot": ".pickle", "timeline": ".json", "instrument": ".d", "torch-logs": ".log",
              "torch-trace": ".d"}[seed.kind]
    if seed.kind in ("snapshot", "timeline") and rng.random() < 0.3:
        data, suffix = gzip.compress(data, compresslevel=1, mtime=0), suffix + ".gz"
        done.append("gzip")
    out[name] = data
    if seed.kind == "instrument":
        if rng.random() < 0.1:
            out["tracewhy-instrument.rank9.jsonl"] = rng.choice((b"", b"\x00" * 64, b"not json\n"))
            done.append("added a rank log that is not one")
        done.insert(0, f"in {name}")
    if seed.kind == "torch-trace" and rng.random() < 0.1:
        out["dedicated_log_torch_trace_rank_9_x.log"] = rng.choice((b"", b"\x00" * 64, b"not a log\n"))
        done.append("added a rank log that is not one")
    return KindMutant(out, seed.kind in DIRECTORY_KINDS, suffix, tuple(done))


#: Commands per kind ({input}, {original}, {companion} and {out} filled in), with how often picked.
KIND_COMMANDS: dict[str, tuple[tuple[tuple[str, ...], int], ...]] = {
    "snapshot": ((("memory", "{input}"), 5), (("info", "{input}"), 1), (("diagnose", "{input}"), 1)),
    "timeline": ((("memory", "{input}"), 5), (("info", "{input}"), 1), (("report", "{input}", "-o", "{out}.html"), 1)),
    "instrument": ((("pipeline", "{input}"), 4), (("blocks", "{input}"), 3),
                   (("pipeline", "{input}", "--vs", "{original}"), 1), (("info", "{input}"), 1)),
    "torch-logs": ((("compile", "{companion}", "--logs", "{input}"), 5),
                   (("diagnose", "{companion}", "--logs", "{input}"), 2)),
    "torch-trace": ((("compile", "{companion}", "--logs", "{input}"), 5),
                    (("diagnose", "{companion}", "--logs", "{input}"), 1)),
}


def pick_kind_commands(seed: KindSeed, rng: random.Random, count: int) -> list[tuple[str, ...]]:
    table = KIND_COMMANDS[seed.kind]
    chosen = []
    for command in rng.choices([c for c, _ in table], [w for _, w in table], k=count):
        if seed.companion is not None:
            command = tuple(str(GENERATED / seed.companion) if part == "{companion}" else part for part in command)
        if rng.random() < 0.3 and "-o" not in command:
            command = (*command, "--json")
        chosen.append(command)
    return chosen


def check_kind_read(path: Path, kind: str, outcome: Outcome) -> None:
    """Read the input with its reader; a result with a ``check`` must pass it. A TraceError or
    UsageError is a refusal; anything else is internal."""
    from tracewhy.errors import TraceError, UsageError
    from tracewhy.readers.instrument.reader import read_instrument_logs
    from tracewhy.readers.memory.snapshot import read_memory_snapshot
    from tracewhy.readers.memory.timeline import read_memory_timeline
    from tracewhy.readers.torch_logs.reader import read_torch_logs
    from tracewhy.readers.torch_trace.reader import read_torch_trace

    with _debug_env(), warnings.catch_warnings(record=True) as caught, _native_stderr() as native:
        warnings.simplefilter("always")
        try:
            result: Any = (read_memory_snapshot(path) if kind == "snapshot" else read_memory_timeline(path)
                           if kind == "timeline" else read_instrument_logs([path]) if kind == "instrument"
                           else read_torch_trace(path) if kind == "torch-trace" else read_torch_logs(path))
            if callable(getattr(result, "check", None)):
                result.check()
            if any(outcome.is_new(w) for w in getattr(result, "warnings", ()) or ()):
                outcome.worsen("warned")
        except (TraceError, UsageError):
            outcome.worsen("refused")
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            outcome.worsen("internal", f"read ({kind})\n{_last_lines(traceback.format_exc(), 40)}")
    outcome.stray_warnings.extend(f"read: {w.category.__name__}: {w.message}" for w in caught)
    if native[0].strip():
        outcome.worsen("internal", f"read ({kind}); native code wrote to stderr:\n{_last_lines(native[0], 6)}")
