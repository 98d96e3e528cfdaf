"""The long fuzz run: mutated real inputs of every kind, each through the reader and a few
commands in a worker process with a time bound, for N minutes. The kinds: profiler traces
(Kineto JSON, nsys SQLite, ncu CSV and reports; tests/fuzzing.py), memory-snapshot pickles
mutated opcode by opcode, memory timelines, instrument logs and TORCH_LOGS files
(tests/fuzzing_kinds.py).

    python scripts/fuzz.py --minutes 30 [--seed S] [--out results.json] [--failures DIR]
    python scripts/fuzz.py --replay DIR      # rerun the inputs a run saved, say which still fail

Each input is classified (tests/fuzzing_run.py): handled, warned (read with a warning),
refused (a one-line error, exit 2 or 3), internal (any other exception, exit 70, a traceback,
a many-line error, running out of memory) or hang (a read or command past --timeout seconds;
the worker is killed and replaced). A worker that dies (a crash in native code) counts as
internal. Each input's peak resident memory is measured in its worker (the peak is reset before
the input); an input of at most 10 MB whose peak passes 2 GB is a memory blow-up. Counts per
kind go to --out as JSON, with every distinct internal-error signature;
each internal error or hang keeps up to --keep inputs under --failures with a note holding the
mutations, the command that failed and how to rerun it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import resource
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fuzzing import FORMATS, SEEDS, Mutant, Seed, mutate, seed_bytes  # noqa: E402
from fuzzing_kinds import (  # noqa: E402
    KIND_FORMATS,
    KIND_SEEDS,
    KindMutant,
    KindSeed,
    check_kind_read,
    kind_seed_files,
    mutate_kind,
    original_path,
    pick_kind_commands,
    remove_input,
)
from fuzzing_run import (  # noqa: E402
    VERDICTS,
    Outcome,
    check_read,
    command_argv,
    pick_commands,
    run_cli,
    seed_warnings,
)

SHARED = Path(os.environ.get("TRACEWHY_SHARED", ROOT.parent / "shared"))
COLUMNS = (*VERDICTS, "hang")
#: Every input kind the run counts apart, in the order of its table.
ALL_FORMATS = (*FORMATS, *KIND_FORMATS)
#: An input this small whose worker's peak resident memory passes the bound is a blow-up.
SMALL_INPUT_BYTES = 10 << 20
RSS_BOUND_BYTES = 2 << 30
#: Address space per worker: a small input that needs more than this is a memory blow-up.
WORKER_MEMORY_BYTES = 4 << 30
#: Inputs a worker serves before a fresh one replaces it: reading an .ncu-rep through
#: ncu_report keeps about 4 MB of native memory per read (not Python objects; measured on the
#: 412 KB a100pcie report), which would otherwise reach the limit above within an hour.
RECYCLE_AFTER = 300


# ----------------------------------------------------------------------------- worker side

def worker_main(conn: Connection, workdir: str) -> None:
    """Serve inputs until told to stop: a ("step", i) message before the read and each command
    (the parent times each step), then ("done", outcome)."""
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    os.chdir(workdir)
    while True:
        task = conn.recv()
        if task is None:
            return
        path, fmt, original = Path(task["path"]), task["format"], Path(task["original"])
        _reset_peak_rss()
        conn.send(("step", 0))
        if fmt in KIND_FORMATS:
            outcome = Outcome()
            check_kind_read(path, fmt, outcome)
        else:
            outcome = Outcome(known=seed_warnings(original, fmt))
            check_read(path, fmt, outcome, random.Random(task["rng"]))
        for i, command in enumerate(task["commands"], 1):
            conn.send(("step", i))
            run_cli(command_argv(command, path, original, path.with_name(path.name + ".out")), outcome)
        conn.send(("done", {"verdict": outcome.verdict, "problems": outcome.problems,
                            "stray_warnings": outcome.stray_warnings[:3], "rss_bytes": _peak_rss()}))


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the peak resident set (VmHWM) of this process."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss() -> int:
    """The peak resident set since the reset, in bytes (elsewhere: since the worker started)."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


@dataclass
class Job:
    number: int
    seed: Seed | KindSeed
    mutant: Mutant | KindMutant
    path: Path
    commands: list[tuple[str, ...]]
    original: Path
    step: int = 0
    deadline: float = 0.0


class Worker:
    def __init__(self, context: Any, workdir: Path) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(child, str(workdir)), daemon=True)
        self.process.start()
        child.close()
        self.job: Job | None = None
        self.served = 0

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            with contextlib.suppress(OSError):
                self.conn.send(None)
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


# ----------------------------------------------------------------------------- bookkeeping

_FRAME = re.compile(r'File ".*?(tracewhy/[\w/]+\.py)", line \d+, in (\w+)')


def signature(problem: str) -> str:
    """What identifies one class of internal error: the command name, the innermost tracewhy
    frame and the exception type (or the first line of the message when there is no traceback)."""
    lines = problem.strip().splitlines()
    if "native code wrote to stderr" in problem:  # absl log lines carry a time and a thread id
        said = re.sub(r"\[\d+\]", "[N]", re.sub(r"^E\d+ [\d:.]+ +\d+ ", "", lines[-1]))
        return f"native stderr: {said[:160]}"
    command = lines[0].split()[1] if lines and lines[0].startswith("tracewhy ") else lines[0] if lines else "?"
    frames = _FRAME.findall(problem)
    last = lines[-1] if lines else ""
    exc = last.split(":")[0] if frames else re.sub(r"/\S+", "PATH", last)[:120]
    where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else "no traceback"
    # The reader's failures are the same class whichever command met them.
    if frames and "/readers/" in frames[-1][0]:
        command = "any"
    return f"{exc} at {where} ({command})"


class Tally:
    def __init__(self, failures: Path, keep: int) -> None:
        self.counts = {fmt: dict.fromkeys(COLUMNS, 0) for fmt in ALL_FORMATS}
        self.stray = dict.fromkeys(ALL_FORMATS, 0)
        self.peak_rss = dict.fromkeys(ALL_FORMATS, 0)
        self.over_rss = dict.fromkeys(ALL_FORMATS, 0)
        self.classes: dict[str, dict[str, Any]] = {}
        self.failures = failures
        self.keep = keep
        self.inputs = 0

    def add(self, job: Job, verdict: str, problems: list[str], stray: list[str], rss_bytes: int = 0) -> None:
        fmt = job.seed.format
        self.inputs += 1
        self.peak_rss[fmt] = max(self.peak_rss[fmt], rss_bytes)
        size = sum(f.stat().st_size for f in ([job.path] if job.path.is_file() else job.path.glob("*")))
        if rss_bytes > RSS_BOUND_BYTES and size <= SMALL_INPUT_BYTES:
            self.over_rss[fmt] += 1
            self._record(job, f"memory: peak RSS over {RSS_BOUND_BYTES >> 30} GB on an input of at most "
                         f"{SMALL_INPUT_BYTES >> 20} MB", f"peak RSS {rss_bytes:,} bytes on {size:,} bytes of input")
        self.counts[fmt][verdict] += 1
        if stray:
            self.stray[fmt] += 1
            self._record(job, f"stray Python warning: {stray[0].split(': ', 1)[-1][:100]}", stray[0])
        for problem in problems if verdict in ("internal", "hang") else ():
            self._record(job, problem if verdict == "hang" else signature(problem), problem)

    def _record(self, job: Job, sig: str, problem: str) -> None:
        entry = self.classes.setdefault(sig, {"count": 0, "formats": [], "examples": []})
        entry["count"] += 1
        if job.seed.format not in entry["formats"]:
            entry["formats"].append(job.seed.format)
        if len(entry["examples"]) >= self.keep or any(e["input"] == job.number for e in entry["examples"]):
            return
        folder = self.failures / hashlib.sha1(sig.encode()).hexdigest()[:10]
        folder.mkdir(parents=True, exist_ok=True)
        saved = folder / f"input{job.number}{job.mutant.suffix}"
        if job.path.is_dir():
            shutil.copytree(job.path, saved, dirs_exist_ok=True)
        else:
            shutil.copyfile(job.path, saved)
        note = "\n".join([
            f"class: {sig}", f"seed trace: {job.seed.relative}", f"kind: {job.seed.format}", "mutations:",
            *(f"  {s}" for s in job.mutant.steps), "commands run:",
            *(f"  tracewhy {shlex.join(command_argv(c, saved, job.original, saved))}" for c in job.commands),
            "rerun with TRACEWHY_DEBUG=1 TRACEWHY_NO_CACHE=1 for the traceback", "", "what happened:",
            problem.replace(str(job.path), str(saved)),
        ])
        saved.with_name(saved.name + ".txt").write_text(note + "\n")
        entry["examples"].append({"input": job.number, "file": str(saved)})

    def table(self) -> str:
        head = ("| input kind | inputs | handled | recovered with a warning | refused | internal errors | hangs "
                "| over 2 GB | peak RSS |")
        rows = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        total = dict.fromkeys(COLUMNS, 0)
        for fmt in ALL_FORMATS:
            c = self.counts[fmt]
            for k in COLUMNS:
                total[k] += c[k]
            rows.append(f"| {fmt} | {sum(c.values()):,} | " + " | ".join(f"{c[k]:,}" for k in COLUMNS)
                        + f" | {self.over_rss[fmt]:,} | {_mib(self.peak_rss[fmt])} |")
        rows.append(f"| all | {sum(total.values()):,} | " + " | ".join(f"{total[k]:,}" for k in COLUMNS)
                    + f" | {sum(self.over_rss.values()):,} | {_mib(max(self.peak_rss.values()))} |")
        return "\n".join(rows)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n else "-"


# ----------------------------------------------------------------------------- the run

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--commands", type=int, default=3, help="commands per input, after the read check")
    parser.add_argument("--formats", default=",".join(ALL_FORMATS),
                        help=f"which input kinds to fuzz, of {','.join(ALL_FORMATS)} (default: all)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one read or command may take")
    parser.add_argument("--keep", type=int, default=3, help="inputs kept per failure class")
    tmp = Path(tempfile.gettempdir())
    parser.add_argument("--out", type=Path, default=tmp / "tracewhy-fuzz-results.json")
    parser.add_argument("--failures", type=Path, default=tmp / "fuzz_failures")
    parser.add_argument("--replay", type=Path, default=None, metavar="DIR",
                        help="rerun the inputs saved under DIR (in this process) instead of fuzzing")
    args = parser.parse_args(argv)
    if args.replay is not None:
        return replay(args.replay)
    if not (SHARED / "traces").is_dir():
        print(f"fuzz: the shared traces are not at {SHARED}/traces (set TRACEWHY_SHARED)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    traces = SHARED / "traces"
    originals: dict[Seed | KindSeed, Any] = {s: seed_bytes(s, traces) for s in SEEDS}
    originals.update({s: kind_seed_files(s) for s in KIND_SEEDS})
    by_format = {fmt: [s for s in (*SEEDS, *KIND_SEEDS) if s.format == fmt] for fmt in ALL_FORMATS}
    formats = [f for f in args.formats.split(",") if f in by_format]
    if not formats:
        parser.error(f"--formats: choose from {', '.join(ALL_FORMATS)}")
    tally = Tally(args.failures, args.keep)
    context = mp.get_context("spawn")
    started = time.monotonic()
    end = started + args.minutes * 60
    last_write = started
    with tempfile.TemporaryDirectory(prefix="tracewhy-fuzz-") as tmpdir:
        work = Path(tmpdir)
        workers = [Worker(context, work) for _ in range(args.workers)]
        number = 0
        try:
            while True:
                now = time.monotonic()
                for w in workers:
                    if w.job is None and now < end:
                        number += 1
                        pool = by_format[rng.choice(formats)]  # formats equally often
                        s = rng.choices(pool, [p.weight for p in pool])[0]
                        job = _new_job(number, s, originals[s], rng, work, args.commands)
                        job.deadline = time.monotonic() + args.timeout
                        w.job = job
                        w.conn.send({"path": str(job.path), "format": s.format, "original": str(job.original),
                                     "commands": job.commands, "rng": rng.randrange(2**32)})
                busy = [w for w in workers if w.job is not None]
                if not busy:
                    break
                timeout = max(0.0, min(w.job.deadline for w in busy if w.job) - time.monotonic())
                ready = wait([w.conn for w in busy], timeout=timeout)
                for w in busy:
                    if w.job is None:
                        continue
                    job = w.job
                    if w.conn in ready:
                        try:
                            kind, value = w.conn.recv()
                        except (EOFError, OSError):
                            w.process.join(5)
                            code = w.process.exitcode  # negative: the signal that ended it
                            tally.add(job, "internal", [f"worker died (exit {code}) at step {job.step}\n"
                                                        f"{_step_label(job)}"], [])
                            _finish(job)
                            w.stop(kill=True)
                            workers[workers.index(w)] = Worker(context, work)
                            continue
                        if kind == "step":
                            job.step, job.deadline = value, time.monotonic() + args.timeout
                            continue
                        tally.add(job, value["verdict"], value["problems"], value["stray_warnings"],
                                  value["rss_bytes"])
                        _finish(job)
                        w.job = None
                        w.served += 1
                        if w.served >= RECYCLE_AFTER:
                            w.stop()
                            workers[workers.index(w)] = Worker(context, work)
                    elif time.monotonic() >= job.deadline:
                        tally.add(job, "hang", [f"hang over {args.timeout:.0f} s in {_step_label(job)}"], [])
                        _finish(job)
                        w.stop(kill=True)
                        workers[workers.index(w)] = Worker(context, work)
                if time.monotonic() - last_write > 30:
                    _write(args.out, tally, seed, started)
                    last_write = time.monotonic()
                    print(f"{tally.inputs:,} inputs, {time.monotonic() - started:.0f} s", file=sys.stderr)
        finally:
            for w in workers:
                w.stop(kill=w.job is not None)
    _write(args.out, tally, seed, started)
    print(tally.table())
    print(f"\n{tally.inputs:,} inputs in {time.monotonic() - started:.0f} s with {args.workers} workers "
          f"(seed {seed}); results in {args.out}")
    for sig, entry in sorted(tally.classes.items(), key=lambda kv: -kv[1]["count"]):
        example = entry["examples"][0]["file"] if entry["examples"] else "-"
        print(f"{entry['count']:6,}  {sig}\n        e.g. {example}")
    internal = sum(tally.counts[f]["internal"] + tally.counts[f]["hang"] for f in ALL_FORMATS)
    return 1 if internal or sum(tally.over_rss.values()) else 0


def _new_job(number: int, seed: Seed | KindSeed, original: Any, rng: random.Random, work: Path,
             commands: int) -> Job:
    """One mutated input written into ``work``, with the commands to run on it."""
    if isinstance(seed, KindSeed):
        kind_mutant = mutate_kind(seed, original, rng)
        path = kind_mutant.write(work / f"input{number}")
        return Job(number, seed, kind_mutant, path, pick_kind_commands(seed, rng, commands),
                   original_path(seed, work))
    mutant = mutate(seed, original, rng)
    path = work / f"input{number}{mutant.suffix}"
    path.write_bytes(mutant.data)
    return Job(number, seed, mutant, path, pick_commands(seed.format, rng, commands),
               SHARED / "traces" / seed.relative)


def replay(folder: Path) -> int:
    """Rerun every saved input with the commands its note lists; print each one's verdict now."""
    still = 0
    for note in sorted(folder.rglob("*.txt")):
        text = note.read_text()
        seed = re.search(r"^seed trace: (.+)$", text, re.M)
        fmt = next((s.format for s in (*SEEDS, *KIND_SEEDS) if seed and s.relative == seed.group(1)), "kineto")
        path = note.with_suffix("")
        if fmt in KIND_FORMATS:
            outcome = Outcome()
            check_kind_read(path, fmt, outcome)
        else:
            outcome = Outcome(known=seed_warnings(SHARED / "traces" / seed.group(1), fmt) if seed else frozenset())
            check_read(path, fmt, outcome, random.Random(0))
        for line in re.findall(r"^  tracewhy (.+)$", text, re.M):
            run_cli(shlex.split(line), outcome)
        still += outcome.verdict == "internal"
        first = outcome.problems[0].splitlines()[-1] if outcome.problems else ""
        print(f"{outcome.verdict:9} {path}  {first[:150]}")
    print(f"{still} of the saved inputs still fail")
    return 1 if still else 0


def _step_label(job: Job) -> str:
    if job.step == 0:
        return f"the read of {job.path.name}"
    return "tracewhy " + " ".join(job.commands[job.step - 1])


def _finish(job: Job) -> None:
    remove_input(job.path)


def _write(out: Path, tally: Tally, seed: int, started: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "seed": seed, "inputs": tally.inputs, "seconds": round(time.monotonic() - started),
        "counts": tally.counts, "inputs_with_stray_python_warnings": tally.stray,
        "peak_rss_bytes": tally.peak_rss, "small_inputs_over_rss_bound": tally.over_rss,
        "classes": tally.classes, "table": tally.table(),
    }
    out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
