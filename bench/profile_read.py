"""Where ``tracewhy kernels FILE --json`` spends its time and memory, stage by stage.

Three views, each in a fresh interpreter so that none warms the next:

- ``imports``: ``python -X importtime`` of ``tracewhy.cli``, heaviest modules first;
- ``stages`` (default): the command run in-process with named functions wrapped to record
  calls, seconds, RSS after, and how far each pushed the process's peak RSS (``ru_maxrss``
  is exact: no sampling). Functions are named ``module:attr`` in the namespace where they are
  looked up at call time; names the current reader does not have are skipped;
- ``cprofile``: the command under cProfile, top functions by own and cumulative time
  (cProfile slows Python-level loops, so its seconds overstate pure-Python parts).

Usage: python bench/profile_read.py FILE [--view stages|imports|cprofile|all] [--top 25]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib
import inspect
import io
import os
import pstats
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

MB = 1_000_000
# The reader's pipeline, old stages and reworked ones; names a reader lacks are skipped and listed.
STAGES = (
    "tracewhy.cli.commands.kernels:load_trace",
    "tracewhy.cli.base:read_trace",
    "tracewhy.readers:cached_read",
    "tracewhy.readers.kineto.reader:read_kineto",
    "tracewhy.readers.kineto.reader:read_bytes",
    "tracewhy.readers.kineto.reader:split_document",
    "tracewhy.readers.kineto.pieces:LentPieces._pieces",
    "tracewhy.readers.kineto.pieces:PieceStream.pieces",
    # The parallel read (two processes for a large file): the time spent building batches here,
    # handing batches over, waiting for and unpickling the helpers' parts, and building the
    # batches taken back at the end; a helper's own time is not seen from here.
    "tracewhy.readers.kineto.parallel:build_parts",
    "tracewhy.readers.kineto.parallel:build_part",
    "tracewhy.readers.kineto.parallel:Helper.send",
    "tracewhy.readers.kineto.parallel:Helper.receive",
    "tracewhy.readers.kineto.parallel:_take_back",
    "tracewhy.readers.kineto.builder:decode_body",
    "tracewhy.readers.kineto.builder:Builder.add",
    "tracewhy.readers.kineto.builder:Builder._flows",
    "tracewhy.readers.kineto.builder:Builder._instants",
    "tracewhy.readers.kineto.builder:Builder._slices",
    "tracewhy.readers.kineto.builder:Builder._kind_codes",
    "tracewhy.readers.kineto.builder:Builder._decode",
    "tracewhy.readers.kineto.builder:kernel_attrs_table",
    "tracewhy.readers.kineto.builder:op_attrs_table",
    "tracewhy.readers.kineto.builder:Builder.finish",
    "tracewhy.readers.kineto.builder:join_batches",
    "tracewhy.readers.kineto.tables:link_slices",
    "tracewhy.readers.kineto.tables:_slices_table",
    "tracewhy.readers.kineto.tables:_side_table",
    "tracewhy.readers.kineto.builder:trace_meta",
    "tracewhy.cli.commands.kernels:kernels",
    "tracewhy.cli.commands.kernels:emit",
    "tracewhy.cli.base:render_json",
)


@dataclass
class Stage:
    name: str
    order: int
    calls: int = 0
    seconds: float = 0.0
    rss_after: int = 0
    peak_pushed: int = 0  # how much ru_maxrss rose while this stage ran (inclusive)
    depth: int = 0


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def wrap_stages(names: tuple[str, ...]) -> tuple[list[Stage], list[str]]:
    """Replace each named function by a recording wrapper; return the records and the misses."""
    stages: list[Stage] = []
    missing: list[str] = []
    me = psutil.Process()
    active: list[str] = []
    for order, dotted in enumerate(names):
        module_name, _, attr = dotted.partition(":")
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            missing.append(dotted)
            continue
        *path, leaf = attr.split(".")
        try:
            for part in path:
                owner = getattr(owner, part)
            original = getattr(owner, leaf)
        except AttributeError:
            missing.append(dotted)
            continue
        stage = Stage(dotted.split(":", 1)[1], order)
        stages.append(stage)

        def make(original: Callable[..., Any], stage: Stage) -> Callable[..., Any]:
            @functools.wraps(original)
            def recorded(*args: Any, **kwargs: Any) -> Any:
                peak_before = _maxrss()
                stage.depth = len(active)
                active.append(stage.name)
                started = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    stage.seconds += time.perf_counter() - started
                    active.pop()
                    stage.calls += 1
                    stage.rss_after = me.memory_info().rss
                    stage.peak_pushed = max(stage.peak_pushed, _maxrss() - peak_before)

            return recorded

        def make_generator(original: Callable[..., Any], stage: Stage) -> Callable[..., Any]:
            """A generator's stage is the time spent producing its items, not their consumer's."""
            @functools.wraps(original)
            def recorded(*args: Any, **kwargs: Any) -> Any:
                produce = original(*args, **kwargs)
                stage.calls += 1
                while True:
                    stage.depth = len(active)
                    started = time.perf_counter()
                    try:
                        item = next(produce)
                    except StopIteration:
                        return
                    finally:
                        stage.seconds += time.perf_counter() - started
                        stage.rss_after = me.memory_info().rss
                    yield item

            return recorded

        wrapper = make_generator if inspect.isgeneratorfunction(original) else make
        setattr(owner, leaf, wrapper(original, stage))
    return stages, missing


def run_command(path: str) -> float:
    from tracewhy.cli import main

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["kernels", path, "--json"])
    if code != 0:
        raise SystemExit(f"tracewhy exited {code}")
    return time.perf_counter() - started


def view_stages(path: str) -> None:
    t0 = time.perf_counter()
    import tracewhy.cli  # noqa: F401  (import cost is part of a cold run)

    import_s = time.perf_counter() - t0
    rss_imported = psutil.Process().memory_info().rss
    stages, missing = wrap_stages(STAGES)
    total = run_command(path)
    size = _size_of(path)
    print(f"## stages: tracewhy kernels {path.rsplit('/', 1)[-1]} --json "
          f"({size / MB:,.0f} MB uncompressed)\n")
    print(f"import tracewhy.cli: {import_s:.2f} s, RSS after imports {rss_imported / MB:,.0f} MB; "
          f"command {total:.2f} s; peak RSS {_maxrss() / MB:,.0f} MB "
          f"({_maxrss() / size:.2f} x the uncompressed size)\n")
    print("| stage (nesting by indent) | calls | seconds | share of command | RSS after MB "
          "| peak RSS pushed up by MB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for s in sorted(stages, key=lambda s: s.order):
        if not s.calls:
            continue
        indent = "· " * s.depth
        print(f"| {indent}{s.name} | {s.calls} | {s.seconds:.2f} | {s.seconds / total:.0%} | "
              f"{s.rss_after / MB:,.0f} | {s.peak_pushed / MB:,.0f} |")
    if missing:
        print(f"\n(not in this reader, skipped: {', '.join(missing)})")


def view_cprofile(path: str, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    import tracewhy.cli  # noqa: F401

    total = run_command(path)
    profiler.disable()
    print(f"## cProfile: {total:.2f} s under the profiler (imports included in the listing)\n")
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats(key).print_stats(top)
        text = out.getvalue()
        start = text.find("   ncalls")
        print(f"### by {key}\n\n```\n{_short_paths(text[start:]).rstrip()}\n```\n")


def view_imports(top: int) -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import tracewhy.cli"],
                          capture_output=True, text=True, check=True)
    rows = []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(2)), int(m.group(1)), len(m.group(3)) // 2, m.group(4)))
    whole = max(rows)[0] if rows else 0
    print(f"## imports: `import tracewhy.cli` takes {whole / 1e6:.2f} s (python -X importtime)\n")
    print("| module | cumulative s | self s |")
    print("| --- | ---: | ---: |")
    for cumulative, own, _depth, name in sorted(rows, reverse=True)[:top]:
        print(f"| {name} | {cumulative / 1e6:.3f} | {own / 1e6:.3f} |")
    print()


def _short_paths(text: str) -> str:
    text = text.replace(str(Path(__file__).resolve().parent.parent) + "/", "")
    return re.sub(r"\S*/(site-packages|src|lib/python3\.\d+)/", "", text)


def _size_of(path: str) -> int:
    import gzip

    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if not gz:
        return os.stat(path).st_size
    with gzip.open(path, "rb") as f:
        n = 0
        while chunk := f.read(16 * MB):
            n += len(chunk)
        return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="trace to read")
    p.add_argument("--view", choices=("stages", "imports", "cprofile", "all"), default="stages")
    p.add_argument("--top", type=int, default=25, help="rows in the imports and cProfile listings")
    args = p.parse_args(argv)
    if args.view == "all":
        # One fresh interpreter per view: none may warm another's caches.
        for view in ("imports", "stages", "cprofile"):
            subprocess.run([sys.executable, __file__, args.file, "--view", view,
                            "--top", str(args.top)], check=True)
        return 0
    if args.view == "imports":
        view_imports(args.top)
    elif args.view == "stages":
        view_stages(args.file)
    else:
        view_cprofile(args.file, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
