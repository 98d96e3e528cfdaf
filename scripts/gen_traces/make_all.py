"""Entry point: make every CPU trace, each in its own fresh Python process, then write
MANIFEST.md beside them.

    python scripts/gen_traces/make_all.py --out tests/data/generated --demo examples
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from capture import REPO_ROOT
from manifest import write_manifest
from specs import BY_KEY, DEMO, SPECS, TraceSpec


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def _run_isolated(spec: TraceSpec, out_dir: Path) -> None:
    """Run one generator in a child interpreter: no Dynamo, profiler or RNG state leaks
    from one trace into the next, and a hung run is killed after ``spec.timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="gen_traces_") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, **spec.env}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", spec.key,
               "--out", str(out_dir)]
        subprocess.run(cmd, env=env, check=True, timeout=spec.timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the traces")
    parser.add_argument("--demo", type=Path, help="also write the README demo trace here")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_KEY), help="make only these")
    parser.add_argument("--manifest-only", action="store_true",
                        help="rewrite MANIFEST.md from the traces already in --out")
    parser.add_argument("--one", choices=sorted(BY_KEY), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one:  # child mode, see _run_isolated
        BY_KEY[args.one].make(args.out)
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set() if args.manifest_only else set(args.only or BY_KEY)
    jobs = [(spec, args.out) for spec in SPECS if spec.key in wanted]
    if args.demo is not None and DEMO.key in wanted:
        jobs.append((DEMO, args.demo))
    for spec, out_dir in jobs:
        started = time.monotonic()
        print(f"{spec.key:<20} ...", end="", flush=True)
        _run_isolated(spec, out_dir)
        print(f" {time.monotonic() - started:6.1f} s  {', '.join(spec.files)}")

    rel_demo = _relative(args.demo) if args.demo is not None else "examples"
    manifest = write_manifest(
        args.out, _relative(args.out), SPECS, DEMO, args.demo, rel_demo,
        torch.__version__,
    )
    print(f"wrote {manifest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
