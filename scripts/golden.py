"""Every command's output on every input in ../shared/traces and tests/data/generated, written
to a folder, so that two trees (or a tree before and after a change) can be compared output by
output.

    python scripts/golden.py write DIR [--only SUBSTRING] [--workers N]
    python scripts/golden.py compare DIR_A DIR_B        # exit 1 when any output differs
    python scripts/golden.py digest DIR                 # one line per output: its SHA-256

Each run is a command line of ``tracewhy`` (run in-process, as the console script runs it, with
its output piped: the terminal tables at the piped width) and its record is the exit code,
stdout and stderr. Files written with ``-o`` are recorded by their content (a gzip file by its
inflated bytes). Every command runs on every input, refusals included: what a command says about
a file it does not read is output too. Paths are written as ``<ROOT>``, ``<SHARED>`` and
``<OUT>``, so that the same tree checked out in two places gives the same records, provided the
two places' paths have the same length: a table is as wide as the paths it shows, and its width
stays in the record after the path is replaced.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TRACEWHY_SHARED", ROOT.parent / "shared")).resolve()
GENERATED = ROOT / "tests" / "data" / "generated"

#: Files under the input folders that are no one's input (licences, manifests, peers' outputs).
NOT_INPUTS = re.compile(r"(^LICENSE|^NOTICE|MANIFEST\.md$|NSYS_NOTES\.md$|_reference_outputs\.json$|\.txt$|"
                        r"_expected\.json\.gz$|\.png$)")

#: Commands run on every input file, each as ``[command, INPUT, *options]``; ``{out}`` is a file
#: in the run's scratch folder.
PER_INPUT: tuple[tuple[str, ...], ...] = (
    ("info",), ("info", "--json"),
    ("diagnose",), ("diagnose", "--json"),
    ("account",), ("account", "--json"),
    ("gaps",), ("gaps", "--json"),
    ("ops",), ("ops", "--json"), ("ops", "--shapes"),
    ("lines",), ("lines", "--json"),
    ("kernels",), ("kernels", "--json"),
    ("nvtx",), ("nvtx", "--json"),
    ("steps",), ("steps", "--json"),
    ("overlap",), ("overlap", "--json"),
    ("blocks",), ("blocks", "--json"),
    ("critical-path",), ("critical-path", "--json"),
    ("compile",), ("compile", "--json"),
    ("memory",), ("memory", "--json"),
    ("roofline",), ("roofline", "--json"),
    ("pipeline",), ("pipeline", "--json"),
    ("check", "--max-gpu-idle", "50%"), ("check", "--max-gpu-idle", "50%", "--json"),
    ("sql", "SELECT count(*) AS n, sum(dur_ns) AS total_ns FROM slices"),
    ("export", "-o", "{out}.json.gz"),
    ("report", "-o", "{out}.html"), ("report", "--json"),
)

#: Pairs for ``diff`` (baseline first), relative to the shared traces or (``gen:``) the generated ones.
DIFF_PAIRS: tuple[tuple[str, str], ...] = (
    ("kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz",
     "kineto/resnet50_nw4_span1_worker0.1623212756351.pt.trace.json.gz"),
    ("hta/tracediff_control_a100_rank3of8.json.gz", "hta/tracediff_test_v100_rank1of2.json.gz"),
    ("hta/tracecompare_tiny_base_rank1.json.gz", "hta/tracecompare_tiny_test_rank1.json.gz"),
    ("nsys/nsysai_mfu_2gpu_before.sqlite.gz", "nsys/nsysai_mfu_2gpu_after.sqlite.gz"),
    ("gen:cpu_slow_step_base.pt.trace.json.gz", "gen:cpu_slow_step_planted.pt.trace.json.gz"),
    ("gen:cpu_dataloader_fast.pt.trace.json.gz", "gen:cpu_dataloader_slow.pt.trace.json.gz"),
)

#: Folders and file sets for ``ranks``.
RANK_SETS: tuple[tuple[str, ...], ...] = (
    ("hta/sampled_128rank_job_rank0.json.gz", "hta/sampled_128rank_job_rank1.json.gz"),
    ("gen:ddp_gloo_rank0.pt.trace.json.gz", "gen:ddp_gloo_rank1.pt.trace.json.gz"),
    ("gen:ddp_gloo_bcast_rank0.pt.trace.json.gz", "gen:ddp_gloo_bcast_rank1.pt.trace.json.gz"),
)

#: Commands run on an input that ``info`` refuses (not a timeline trace): the readers of other inputs.
NOT_A_TRACE: tuple[tuple[str, ...], ...] = (
    ("info",), ("diagnose", "--json"),
    ("memory",), ("memory", "--json"),
    ("roofline",), ("roofline", "--json"),
    ("pipeline",), ("pipeline", "--json"),
    ("blocks",), ("blocks", "--json"),
    ("report", "-o", "{out}.html"),
)

#: Traces with the TORCH_LOGS capture of the same run, for ``compile`` and ``diagnose --logs``.
WITH_LOGS: tuple[str, ...] = tuple(f"cpu_compile_{name}" for name in ("break_item", "break_loop", "break_top",
                                                                      "nobreak", "recompile"))

#: Commands without an input.
NO_INPUT: tuple[tuple[str, ...], ...] = (("which",), ("which", "gpu", "idle"), ("which", "--json"))


def inputs() -> list[Path]:
    """Every input file (and instrument-log folder), in a fixed order."""
    found: list[Path] = []
    for base in (SHARED / "traces", GENERATED):
        for path in sorted(base.rglob("*")):
            if any(part.startswith(("golden_nsys", "reference_csvs")) for part in path.parts):
                continue
            if path.is_file() and not NOT_INPUTS.search(path.name):
                found.append(path)
    found += sorted(p for p in (GENERATED / "pipeline").glob("*") if p.is_dir())
    return found


def _resolve(name: str) -> str:
    return str(GENERATED / name[4:]) if name.startswith("gen:") else str(SHARED / "traces" / name)


def runs(only: str | None = None) -> list[tuple[str, list[str]]]:
    """(record name, argv) for every run, ``{out}`` still to fill; an argv of one item,
    ``@INPUT``, stands for every command of ``PER_INPUT`` (a trace) or ``NOT_A_TRACE``,
    chosen when it runs by whether ``info`` reads the input."""
    out: list[tuple[str, list[str]]] = []
    for path in inputs():
        out.append((_label(path), [f"@{path}"]))
    for a, b in DIFF_PAIRS:
        for extra in ((), ("--json",)):
            out.append((f"diff{'_json' if extra else ''}__{_slug(a)}__{_slug(b)}", ["diff", _resolve(a), _resolve(b),
                                                                                     *extra]))
    for files in RANK_SETS:
        for extra in ((), ("--json",)):
            out.append((f"ranks{'_json' if extra else ''}__{_slug(files[0])}",
                        ["ranks", *(_resolve(f) for f in files), "--workers", "0", *extra]))
    for stem in WITH_LOGS:
        trace, logs = str(GENERATED / f"{stem}.pt.trace.json.gz"), str(GENERATED / f"{stem}.torch_logs.txt")
        for command in ("compile", "diagnose"):
            for extra in ((), ("--json",)):
                out.append((f"{command}_logs{'_json' if extra else ''}__{stem}",
                            [command, trace, "--logs", logs, *extra]))
    for argv_t in NO_INPUT:
        out.append((_slug(" ".join(argv_t)), list(argv_t)))
    if only:
        out = [(name, argv) for name, argv in out if only in name]
    return out


def _label(path: Path) -> str:
    rel = path.relative_to(SHARED / "traces") if path.is_relative_to(SHARED / "traces") else \
        Path("gen") / path.relative_to(GENERATED)
    return _slug(str(rel))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:150]


def _normalize(text: str, scratch: Path) -> str:
    for path, name in ((scratch, "<OUT>"), (ROOT, "<ROOT>"), (SHARED, "<SHARED>")):
        text = text.replace(str(path), name)
    return text


class _KeptBytes(io.BytesIO):
    """A byte buffer that outlives its text wrapper: a ``TextIOWrapper`` closes its buffer when it
    is dropped (as soon as ``sys.stdout`` is restored), and the record is read after that."""

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.BytesIO, io.BytesIO]]:
    out, err = _KeptBytes(), _KeptBytes()
    saved = sys.stdout, sys.stderr
    wrappers = (io.TextIOWrapper(out, encoding="utf-8", write_through=True),
                io.TextIOWrapper(err, encoding="utf-8", write_through=True))
    sys.stdout, sys.stderr = wrappers
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
        for wrapper in wrappers:  # detached: a wrapper that is dropped closes the buffer it wraps
            wrapper.flush()
            wrapper.detach()


def run_one(name: str, argv: list[str], dest: Path) -> None:
    from tracewhy.cli import main

    scratch = Path(tempfile.mkdtemp(prefix="golden."))
    try:
        filled = [a.replace("{out}", str(scratch / "out")) for a in argv]
        with _captured() as (out, err):
            code = main(filled)
        record = [f"$ tracewhy {' '.join(filled)}", f"exit {code}",
                  "--- stdout", out.getvalue().decode("utf-8", "replace"),
                  "--- stderr", err.getvalue().decode("utf-8", "replace")]
        for written in sorted(scratch.iterdir()):
            data = written.read_bytes()
            if written.name.endswith(".gz"):
                with contextlib.suppress(OSError, EOFError):
                    data = gzip.decompress(data)
            record += [f"--- file {written.name}", data.decode("utf-8", "replace")]
        (dest / f"{name}.txt").write_text(_normalize("\n".join(record), scratch), encoding="utf-8")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_input(label: str, path: Path, dest: Path) -> int:
    """Every command on one input: the trace commands when ``info`` reads it, else the others."""
    from tracewhy.cli import main

    with _captured():
        is_trace = main(["info", str(path)]) == 0
    templates = PER_INPUT if is_trace else NOT_A_TRACE
    for template in templates:
        run_one(f"{_slug(' '.join(template))}__{label}", [template[0], str(path), *template[1:]], dest)
    return len(templates)


def _worker(task: tuple[list[tuple[str, list[str]]], str]) -> int:
    chunk, dest = task
    done = 0
    for name, argv in chunk:
        if len(argv) == 1 and argv[0].startswith("@"):
            done += run_input(name, Path(argv[0][1:]), Path(dest))
        else:
            run_one(name, argv, Path(dest))
            done += 1
    return done


def write(dest: Path, only: str | None, workers: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    todo = runs(only)
    cache = tempfile.mkdtemp(prefix="golden-cache.")
    os.environ["TRACEWHY_CACHE_DIR"] = cache
    os.environ.pop("TRACEWHY_DEBUG", None)
    try:
        if workers <= 1:
            done = _worker((todo, str(dest)))
        else:
            chunks = [todo[i::workers] for i in range(workers)]
            with mp.get_context("spawn").Pool(workers) as pool:
                done = sum(pool.map(_worker, [(c, str(dest)) for c in chunks]))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{done} outputs written to {dest}")


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.glob("*.txt")} | {p.name for p in b.glob("*.txt")})
    differ = [n for n in names if not (a / n).exists() or not (b / n).exists()
              or (a / n).read_bytes() != (b / n).read_bytes()]
    for n in differ:
        print(f"differs: {n}")
    print(f"{len(names) - len(differ)} of {len(names)} outputs identical")
    return 1 if differ else 0


def digest(folder: Path) -> None:
    for path in sorted(folder.glob("*.txt")):
        print(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", required=True)
    w = sub.add_parser("write")
    w.add_argument("dest", type=Path)
    w.add_argument("--only", help="only runs whose record name holds this text")
    w.add_argument("--workers", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    d = sub.add_parser("digest")
    d.add_argument("folder", type=Path)
    args = p.parse_args()
    if args.verb == "write":
        write(args.dest, args.only, args.workers)
        return 0
    if args.verb == "compare":
        return compare(args.a, args.b)
    digest(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
