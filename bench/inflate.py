"""Inflate a real Kineto trace to a target size, for read benchmarks at the 1 GB scale.

The source's events are repeated k times. Repetition r (0-based) shifts every ``ts`` by
``r * shift`` (shift = the source's span rounded up to a whole microsecond, plus a gap) and
adds ``r * stride`` to every id-like value, so ids stay unique and links stay consistent:
args ``correlation``, ``External id``/``external id``, ``Python id``/``Python parent id``,
``Ev Idx``, ``Record function id``, ``Sequence number`` and flow-event ``id`` (one stride for
all, so an ``ac2g`` flow id still equals its launch's correlation). ``ProfilerStep#N``
becomes ``ProfilerStep#(N + r * nsteps)``. Metadata (ph "M") events and top-level fields are
written once; the profiler-window slice (cat "Trace") is written once, stretched to cover
all repetitions. Repetition 0 is the source, byte for byte.

Events are rewritten as text (one regex pass per repetition over the source's event bytes)
and written as they are made: numbers keep their exact digits (the integer part of a
timestamp is shifted, its fraction copied), the source's formatting is kept, and memory
stays near twice the source's size whatever the output size.

Usage: python bench/inflate.py [SOURCE] [-o OUT] [--target-bytes N] [--gzip] [--no-check]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import msgspec

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# ../shared/traces beside the repo: the largest real trace we have (55 MB uncompressed).
DEFAULT_SOURCE = REPO.parent / "shared/traces/tracelens/h100_owlv2-large_zero-shot.json.gz"
DEFAULT_OUT_DIR = BENCH / "out"
DEFAULT_TARGET_BYTES = 1_000_000_000
DEFAULT_GAP_US = 1000

# Id-like arg keys. "Python module id" is not here on purpose: it names a module object,
# which a repeated step runs again. pid/tid/"Fwd thread id" name threads: kept as well.
ID_KEYS = (
    "id", "correlation", "External id", "external id", "Python id", "Python parent id",
    "Ev Idx", "Record function id", "Sequence number",
)
# Where 0 is a real value, not "unset": the first event's index, the first autograd sequence
# number. Elsewhere (correlation, External id, Record function id...) 0 or less means "none"
# and stays as it is in every repetition.
ZERO_IS_ID = frozenset({b"Ev Idx", b"Sequence number"})
_NUMBER = rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_KEYS = b"|".join(re.escape(k.encode()) for k in ("ts", *ID_KEYS))
# A key is a whole JSON string ("id" does not match inside "Python id"); the step name is a
# whole string value wherever it appears.
EDIT_RE = re.compile(rb'"(' + _KEYS + rb')"(\s*:\s*)(' + _NUMBER + rb")|\"ProfilerStep#(\d+)\"")
DUR_RE = re.compile(rb'"dur"(\s*:\s*)(' + _NUMBER + rb")")


class _Head(msgspec.Struct):
    """The fields that decide how an event is repeated."""

    ph: str = ""
    cat: str | None = None
    ts: float | None = None
    dur: float | None = None


@dataclass(frozen=True)
class Plan:
    """How the source is repeated: counts, shifts and strides, all derived from the source."""

    repeats: int
    shift_us: int
    id_stride: int
    step_stride: int
    span_us: float
    source_bytes: int
    repeat_bytes: int


def add_to_number(text: bytes, delta: int) -> bytes:
    """``text`` (a JSON number) plus the integer ``delta``, keeping the fraction's digits."""
    if delta == 0:
        return text
    if b"e" in text or b"E" in text:
        return repr(float(text) + delta).encode()
    whole, dot, frac = text.partition(b".")
    value = int(whole)
    if value < 0 and frac:  # -3.25 + 10 is not 7.25: go through float for negatives
        return repr(float(text) + delta).encode()
    return str(value + delta).encode() + dot + frac


def _scan(events: list[msgspec.Raw], heads: list[_Head]) -> tuple[float, float, int, int, int]:
    """Return (first ts, last end, largest id value, smallest and largest step number)."""
    first, last = math.inf, -math.inf
    for h in heads:
        if h.ph == "M" or h.ts is None:
            continue
        first = min(first, h.ts)
        last = max(last, h.ts + (h.dur or 0.0))
    max_id, step_lo, step_hi = 0, 0, -1
    for raw in events:
        for m in EDIT_RE.finditer(raw):
            if m.group(4) is not None:
                n = int(m.group(4))
                step_lo, step_hi = (n, n) if step_hi < 0 else (min(step_lo, n), max(step_hi, n))
            elif m.group(1) != b"ts":
                max_id = max(max_id, int(float(m.group(3))))
    return first, last, max_id, step_lo, step_hi


def _repeat_editor(r: int, plan: Plan) -> Callable[[re.Match[bytes]], bytes]:
    shift, id_delta, step_delta = r * plan.shift_us, r * plan.id_stride, r * plan.step_stride

    def edit(m: re.Match[bytes]) -> bytes:
        key = m.group(1)
        if key is None:
            return b'"ProfilerStep#%d"' % (int(m.group(4)) + step_delta)
        number = m.group(3)
        if key == b"ts":
            new = add_to_number(number, shift)
        else:
            value = int(float(number))
            unset = value < 0 or (value == 0 and key not in ZERO_IS_ID)
            new = number if unset else b"%d" % (value + id_delta)
        return b'"' + key + b'"' + m.group(2) + new

    return edit


def read_source(path: Path) -> bytes:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    with opener(path, "rb") as f:
        return f.read()  # type: ignore[no-any-return]


def inflate(
    source: Path,
    out: Path,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    gap_us: int = DEFAULT_GAP_US,
    use_gzip: bool = False,
    log: Callable[[str], None] = print,
) -> Plan:
    """Write ``out``: ``source`` repeated until about ``target_bytes`` (uncompressed)."""
    buf = read_source(source)
    if buf.lstrip()[:1] == b"[":  # a bare event array (some exporters write one)
        header: dict[str, msgspec.Raw] = {}
        events = msgspec.json.decode(buf, type=list[msgspec.Raw])
        order = ["traceEvents"]
    else:
        header = msgspec.json.decode(buf, type=dict[str, msgspec.Raw])
        order = list(header)  # top-level fields are written back in the source's order
        events = msgspec.json.decode(header.pop("traceEvents"), type=list[msgspec.Raw])
    heads = [msgspec.json.decode(raw, type=_Head) for raw in events]
    first, last, max_id, step_lo, step_hi = _scan(events, heads)
    if not math.isfinite(first):
        raise SystemExit(f"{source}: no timed events to repeat")
    span = last - first
    once = [i for i, h in enumerate(heads) if h.ph == "M" or (h.cat or "").lower() == "trace"]
    once_set = set(once)
    sep = b",\n  "
    body = sep.join(bytes(raw) for i, raw in enumerate(events) if i not in once_set)
    fixed_bytes = len(buf) - len(body)
    repeats = max(1, round((target_bytes - fixed_bytes) / max(1, len(body) + len(sep))))
    plan = Plan(
        repeats=repeats,
        shift_us=math.ceil(span) + gap_us,
        id_stride=10 ** len(str(max_id + 1)),  # next power of ten: ids stay readable
        step_stride=step_hi - step_lo + 1 if step_hi >= 0 else 0,
        span_us=span,
        source_bytes=len(buf),
        repeat_bytes=len(body) + len(sep),
    )
    log(f"source {source.name}: {len(buf):,} bytes, {len(events):,} events "
        f"({len(once)} written once), span {span / 1e6:.3f} s, ids < {max_id + 1:,}, "
        f"steps {step_lo}..{step_hi}")
    log(f"plan: {plan.repeats} repetitions, ts shift {plan.shift_us} us, id stride "
        f"{plan.id_stride:,}, step stride {plan.step_stride}")
    stretch = (plan.repeats - 1) * plan.shift_us

    def stretched(raw: msgspec.Raw, h: _Head) -> bytes:
        if h.ph == "M" or stretch == 0:
            return bytes(raw)
        return DUR_RE.sub(lambda m: b'"dur"' + m.group(1) + add_to_number(m.group(2), stretch),
                          bytes(raw), count=1)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    started = time.perf_counter()
    opener = gzip.open if use_gzip else open
    with opener(tmp, "wb") as f:
        _write(f, order, header, events, heads, once_set, body, plan, stretched, sep, log)
    tmp.replace(out)
    seconds = time.perf_counter() - started
    log(f"wrote {out} ({out.stat().st_size:,} bytes on disk) in {seconds:.1f} s")
    return plan


def _write(
    f: IO[bytes],
    order: list[str],
    header: dict[str, msgspec.Raw],
    events: list[msgspec.Raw],
    heads: list[_Head],
    once: set[int],
    body: bytes,
    plan: Plan,
    stretched: Callable[[msgspec.Raw, _Head], bytes],
    sep: bytes,
    log: Callable[[str], None],
) -> None:
    bare = not header and order == ["traceEvents"]
    f.write(b"[\n  " if bare else b"{")
    for n, key in enumerate(order):
        if not bare:
            f.write((b",\n  " if n else b"\n  ") + msgspec.json.encode(key) + b": ")
        if key != "traceEvents":
            f.write(bytes(header[key]))
            continue
        if not bare:
            f.write(b"[\n  ")
        # Repetition 0: the source as it is (ids and ts unchanged), window slice stretched.
        f.write(sep.join(stretched(raw, heads[i]) if i in once else bytes(raw)
                         for i, raw in enumerate(events)))
        for r in range(1, plan.repeats):
            f.write(sep)
            f.write(EDIT_RE.sub(_repeat_editor(r, plan), body))
            log(f"  repetition {r + 1}/{plan.repeats}")
        f.write(b"\n  ]" if not bare else b"\n]")
    if not bare:
        f.write(b"\n}\n")


# --- validation -----------------------------------------------------------------------------


def tracewhy_json(command: str, path: Path) -> dict[str, object]:
    """Run ``tracewhy COMMAND PATH --json`` in a fresh interpreter and return its JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "tracewhy", command, str(path), "--json"],
        check=True, capture_output=True,
    )
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def check(source: Path, out: Path, repeats: int, log: Callable[[str], None] = print) -> list[str]:
    """Compare tracewhy's view of ``out`` with ``repeats`` times its view of ``source``.

    Returns the list of mismatches (empty when the inflated trace is what it should be).
    """
    problems: list[str] = []
    k_src, k_out = tracewhy_json("kernels", source), tracewhy_json("kernels", out)
    for key in ("total_count", "total_time_ns"):
        want = repeats * int(k_src[key])  # type: ignore[call-overload]
        if k_out[key] != want:
            problems.append(f"kernels {key}: {k_out[key]} != {repeats} x {k_src[key]} = {want}")
    log(f"check kernels: {k_out['total_count']} kernels, {k_out['total_time_ns']} ns "
        f"= {repeats} x ({k_src['total_count']}, {k_src['total_time_ns']})")
    s_src, s_out = tracewhy_json("steps", source), tracewhy_json("steps", out)
    src_steps, out_steps = s_src["steps"], s_out["steps"]
    assert isinstance(src_steps, list) and isinstance(out_steps, list)
    names = [s["name"] for s in out_steps]
    if len(set(names)) != len(names):
        problems.append("step names are not unique")
    per_step = [s["kernel_count"] for s in src_steps] * repeats
    if [s["kernel_count"] for s in out_steps] != per_step:
        problems.append("kernels per step differ from the source's, repeated")
    log(f"check steps: {len(out_steps)} steps ({names[0] if names else '-'} .. "
        f"{names[-1] if names else '-'}), kernels per step as in the source")
    i_src, i_out = tracewhy_json("info", source)["info"], tracewhy_json("info", out)["info"]
    assert isinstance(i_src, dict) and isinstance(i_out, dict)
    for key in ("flow_events", "memory_events"):
        if i_out[key] != repeats * i_src[key]:
            problems.append(f"info {key}: {i_out[key]} != {repeats} x {i_src[key]}")
    for kind, n in i_src["slices_by_kind"].items():
        got = i_out["slices_by_kind"].get(kind)
        if got != repeats * n:
            problems.append(f"slices of kind {kind}: {got} != {repeats} x {n}")
    log(f"check info: slices by kind, flows and memory events are {repeats} x the source's")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE,
                   help="Kineto trace to repeat (default: ../shared/traces/tracelens/"
                        "h100_owlv2-large_zero-shot.json.gz beside the repo)")
    p.add_argument("-o", "--out", type=Path, default=None,
                   help="output file (default bench/out/<source>.inflated.json[.gz])")
    p.add_argument("--target-bytes", type=float, default=DEFAULT_TARGET_BYTES,
                   help="uncompressed size to reach (default 1e9)")
    p.add_argument("--gap-us", type=int, default=DEFAULT_GAP_US,
                   help="idle gap between repetitions, microseconds (default 1000)")
    p.add_argument("--gzip", action="store_true", help="write gzip-compressed output")
    p.add_argument("--no-check", action="store_true",
                   help="skip the check with tracewhy (kernels, steps, info = k x the source)")
    args = p.parse_args(argv)
    source: Path = args.source
    if not source.is_file():
        p.error(f"{source}: no such file")
    stem = source.name.removesuffix(".gz").removesuffix(".json")
    out: Path = args.out or DEFAULT_OUT_DIR / f"{stem}.inflated.json{'.gz' if args.gzip else ''}"
    plan = inflate(source, out, int(args.target_bytes), args.gap_us, args.gzip)
    if args.no_check:
        return 0
    problems = check(source, out, plan.repeats)
    for problem in problems:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    if not problems:
        print(f"check passed: {out.name} reads as {plan.repeats} x {source.name}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
