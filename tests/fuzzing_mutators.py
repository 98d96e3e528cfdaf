"""The mutations of tests/fuzzing_kinds.py: memory-snapshot pickles built as torch writes them
and damaged opcode by opcode, JSON documents changed node by node, text and JSON-lines files
changed line by line. Pure functions of bytes and a random generator."""

from __future__ import annotations

import json
import pickle
import pickletools
import random
from typing import Any

from fuzzing import random_value


def built_snapshot(variant: int) -> dict[str, Any]:
    """A snapshot in the layout torch/cuda/memory.py documents (``_snapshot()``): segments with
    their blocks, one trace per device, allocator settings; plain dicts, lists, str and int."""
    rng = random.Random(variant)
    frames = [{"filename": f"train_{k}.py", "line": 10 * k + 1, "name": f"fn{k}"} for k in range(4)]
    segments, trace = [], []
    for s in range(1 + variant):
        base, size = 0x7F00_0000_0000 + (s << 28), (2 + 2 * s) << 20
        blocks = [{"address": base, "size": size // 2, "requested_size": size // 2 - 512,
                   "state": "active_allocated", "frames": frames[: 1 + s % 3]},
                  {"address": base + size // 2, "size": size // 2, "requested_size": 0, "state": "inactive",
                   "frames": []}]
        segments.append({"device": s % 2, "address": base, "total_size": size, "stream": 0, "segment_type": "large",
                         "segment_pool_id": (0, 0), "allocated_size": size // 2, "active_size": size // 2,
                         "is_expandable": variant == 2, "blocks": blocks})
        trace.append({"action": "segment_alloc", "addr": base, "size": size, "stream": 0, "frames": frames[:1]})
        for k in range(3 + variant):
            addr = base + (k % 2) * (size // 4)
            for action in ("alloc", "free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": size // 4, "stream": 0,
                              "frames": frames[k % 4: k % 4 + 2]})
    if variant == 1:
        trace.append({"action": "oom", "addr": 0, "size": 1 << 30, "stream": 0, "frames": frames,
                      "device_free": 1 << 20})
    for i, entry in enumerate(trace):
        entry["time_us"] = 1_000 + 7 * i + rng.randrange(3)
    return {"segments": segments, "device_traces": [trace, []] if variant == 1 else [trace],
            "allocator_settings": {"expandable_segments": variant == 2, "PYTORCH_CUDA_ALLOC_CONF": ""}}


# ----------------------------------------------------------------------------- pickle opcodes

#: Opcode sequences a hostile pickle holds: globals and calls (refused by name), a persistent id,
#: a floor of marks, deep nesting, and lengths that claim far more than the file has.
_PICKLE_INJECTIONS: tuple[tuple[str, bytes], ...] = (
    ("GLOBAL os.system", b"cos\nsystem\n"),
    ("STACK_GLOBAL builtins.eval", b"\x8c\x08builtins\x8c\x04eval\x93"),
    ("REDUCE on a global", b"cbuiltins\nlist\n)R"),
    ("PERSID", b"P0\n"),
    ("BUILD", b"}b"),
    ("100,000 MARKs", b"(" * 100_000),
    ("list nested 50,000 deep", b"]" * 50_000 + b"a" * 49_999),
    ("BINUNICODE claiming 2 GB", b"X\x00\x00\x00\x80abc"),
    ("LONG4 claiming 2 GB", b"\x8b\x00\x00\x00\x80\x01"),
    ("FRAME claiming 2**62 bytes", b"\x95" + (2**62).to_bytes(8, "little")),
    ("BINGET of memo 255", b"h\xff"),
    ("LONG_BINGET of memo 2**31", b"j\x00\x00\x00\x80"),
    ("STOP", b"."),
    ("POP_MARK without a MARK", b"1"),
    ("DICT of an odd count", b"(K\x01d"),
    ("SETITEMS with a list key", b"(]K\x01u"),
    ("a dict of 2,000 int keys that all hash alike", b"}(" + b"".join(
        b"\x8a\x0a" + (k * (2**61 - 1)).to_bytes(10, "little", signed=True) + b"N" for k in range(5, 2_005)) + b"u"),
)


def _opcodes(data: bytes) -> list[tuple[str, Any, int, int]]:
    """(name, arg, start, end) of each opcode the pickle parses to (up to where it stops parsing)."""
    ops: list[tuple[str, Any, int]] = []
    try:
        for op, arg, pos in pickletools.genops(data):
            ops.append((op.name, arg, pos if pos is not None else 0))
    except Exception:  # a damaged pickle: the opcodes before the damage
        pass
    if not ops:  # damaged at its first byte: nothing parses (the harness had crashed on zip here)
        return []
    ends = [p for _, _, p in ops[1:]] + [_end_of_last(data, ops[-1][2])]
    return [(name, arg, start, end) for (name, arg, start), end in zip(ops, ends, strict=True)]


def _end_of_last(data: bytes, start: int) -> int:
    return min(len(data), start + 1) if data[start:start + 1] == b"." else len(data)


def p_delete(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    ops = _opcodes(data)
    name, _, i, j = rng.choice(ops)
    return data[:i] + data[j:], f"deleted opcode {name} at {i}"


def p_duplicate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    name, _, i, j = rng.choice(_opcodes(data))
    return data[:j] + data[i:j] + data[j:], f"repeated opcode {name} at {i}"


def p_swap(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    ops = _opcodes(data)
    a, b = sorted(rng.sample(range(len(ops)), 2)) if len(ops) > 1 else (0, 0)
    (na, _, ia, ja), (nb, _, ib, jb) = ops[a], ops[b]
    if a == b:
        return data, "one opcode: nothing to swap"
    return data[:ia] + data[ib:jb] + data[ja:ib] + data[ia:ja] + data[jb:], f"swapped {na} at {ia} with {nb} at {ib}"


def p_memo(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A memo reference pointed elsewhere: another slot, one never stored, or a GET turned PUT."""
    refs = [o for o in _opcodes(data) if o[0] in ("BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "GET")]
    if not refs:
        return p_delete(data, rng)
    name, arg, i, j = rng.choice(refs)
    if name in ("BINGET", "BINPUT"):
        new = rng.choice((0, 1, 255, (int(arg) + 1) % 256))
        out = data[:i + 1] + bytes([new]) + data[i + 2:]
    elif name in ("LONG_BINGET", "LONG_BINPUT"):
        new = rng.choice((0, 2**31 - 1, 2**32 - 1, int(arg) + 1))
        out = data[:i + 1] + new.to_bytes(4, "little") + data[i + 5:]
    else:
        new = rng.choice((0, 10**9))
        out = data[:i] + f"g{new}\n".encode() + data[j:]
    if name.endswith("GET") and rng.random() < 0.3:  # the GET becomes a PUT of the same slot
        out = out[:i] + {"BINGET": b"q", "LONG_BINGET": b"r", "GET": b"p"}[name] + out[i + 1:]
        return out, f"{name} at {i} turned into a PUT"
    return out, f"{name} at {i}: memo {arg} -> {new}"


def p_int(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """An integer argument (a size, an address, a time) made extreme: BININT1/2 to the top of
    their range, BININT to -1 or 2**31-1, LONG1 to an 8-byte 2**63."""
    ints = [o for o in _opcodes(data) if o[0] in ("BININT1", "BININT2", "BININT", "LONG1")]
    if not ints:
        return p_delete(data, rng)
    name, arg, i, j = rng.choice(ints)
    if name == "BININT1":
        return data[:i] + b"K\xff" + data[j:], f"BININT1 {arg} -> 255 at {i}"
    if name == "BININT2":
        return data[:i] + b"M\xff\xff" + data[j:], f"BININT2 {arg} -> 65535 at {i}"
    value = rng.choice((-1, -(2**31), 2**31 - 1, 2**63, -(2**63) - 1, 10**30))
    encoded = pickle.dumps(value, protocol=4)[2:-1]  # (past PROTO, before STOP)
    return data[:i] + encoded + data[j:], f"{name} {arg} -> {value} at {i}"


def p_inject(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    what, ops = rng.choice(_PICKLE_INJECTIONS)
    points = [start for _, _, start, _ in _opcodes(data)] or [0]
    at = rng.choice(points)
    return data[:at] + ops + data[at:], f"inserted {what} at {at}"


def p_truncate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    ops = _opcodes(data)
    name, _, i, _ = rng.choice(ops)
    return data[:i], f"cut before opcode {name} at {i}"


PICKLE_MUTATORS = (p_delete, p_duplicate, p_swap, p_memo, p_memo, p_int, p_int, p_inject, p_inject, p_truncate)


def mutate_pickle(data: bytes, rng: random.Random, steps: int) -> tuple[bytes, list[str]]:
    """Opcode-level damage: the pickle parsed into opcodes, each mutation working on whole opcodes."""
    done = []
    protocol = rng.choice((2, 3, 4, 4, 5))  # 2 memoizes with BINPUT, 4 and 5 frame and MEMOIZE
    if rng.random() < 0.4:  # the data changed first (our own seed: plain data), so the reader gets far
        doc = pickle.loads(data)
        for _ in range(rng.choice((1, 2, 3))):
            done.append(f"data: {_mutate_number(doc, rng) if rng.random() < 0.5 else _mutate_tree(doc, rng)[1]}")
        data = pickle.dumps(doc, protocol=protocol)
        steps = rng.choice((0, 0, 1))
    elif protocol != 4:
        data = pickle.dumps(pickle.loads(data), protocol=protocol)
    if protocol != 4:
        done.append(f"pickled with protocol {protocol}")
    for _ in range(steps):
        if not _opcodes(data):  # an earlier mutation left nothing that parses: nothing to work on
            break
        mutator = rng.choice(PICKLE_MUTATORS)
        data, what = mutator(data, rng)
        done.append(f"{mutator.__name__}: {what}")
    return data, done


# ----------------------------------------------------------------------------- JSON and lines

def _mutate_tree(value: Any, rng: random.Random, depth: int = 0) -> tuple[Any, str]:
    """One change somewhere in a JSON document: a value replaced, dropped, repeated or nested."""
    if isinstance(value, dict) and value and (depth < 6 and rng.random() < 0.75):
        key = rng.choice(list(value))
        how = rng.randrange(5)
        if how == 0:
            del value[key]
            return value, f"deleted key {key!r}"
        if how == 1:
            value[key] = random_value(rng)
            return value, f"{key!r} = {value[key]!r:.60}"
        value[key], what = _mutate_tree(value[key], rng, depth + 1)
        return value, f"{key!r}/{what}"
    if isinstance(value, list) and value and (depth < 6 and rng.random() < 0.75):
        i = rng.randrange(len(value))
        how = rng.randrange(6)
        if how == 0:
            del value[i:i + rng.choice((1, 1, 10, len(value)))]
            return value, f"deleted from item {i}"
        if how == 1:
            value[i:i] = [value[i]] * rng.choice((1, 2, 100))
            return value, f"repeated item {i}"
        if how == 2:
            value.reverse()
            return value, "reversed a list"
        value[i], what = _mutate_tree(value[i], rng, depth + 1)
        return value, f"[{i}]/{what}"
    if rng.random() < 0.1:
        return [[[[value]]]], "nested a value four lists deep"
    new = random_value(rng)
    return new, f"value -> {new!r:.60}"


def _mutate_number(doc: Any, rng: random.Random) -> str:
    """A number deep in the document (a time, a size) made extreme, the shape kept."""
    where, node = "", doc
    while isinstance(node, list | dict) and node:
        key = rng.randrange(len(node)) if isinstance(node, list) else rng.choice(list(node))
        child = node[key]
        if not isinstance(child, list | dict):
            if isinstance(child, int | float) and not isinstance(child, bool):
                node[key] = rng.choice(_EXTREME_NUMBERS)
                return f"{where}[{key!r}] {child} -> {node[key]}"
            return f"{where}[{key!r}] is not a number; left"
        where, node = f"{where}[{key!r}]", child
    return "no number found"


_EXTREME_NUMBERS: tuple[Any, ...] = (0, -1, -(2**63), 2**63 - 1, 2**64, 1e308, -1e308, float("nan"), float("inf"),
                                     0.5, 10**30, 2**53 + 1)


def mutate_json_doc(data: bytes, rng: random.Random, steps: int) -> tuple[bytes, list[str]]:
    """A JSON document changed in place: mostly numbers made extreme (the shape kept, so the
    reader gets past its checks of shape), sometimes a node replaced, dropped or repeated."""
    doc = json.loads(data)
    done = []
    for _ in range(steps):
        if rng.random() < 0.6:
            done.append(f"json number: {_mutate_number(doc, rng)}")
            continue
        doc, what = _mutate_tree(doc, rng)
        done.append(f"json: {what}")
    return json.dumps(doc, allow_nan=True).encode(), done


def mutate_lines(data: bytes, rng: random.Random, steps: int, as_json: bool) -> tuple[bytes, list[str]]:
    """Line-level damage: lines dropped, repeated, reordered, a JSON record's field changed, a
    number made extreme, a line of control characters or a very long one added."""
    lines = data.split(b"\n")
    done = []
    for _ in range(steps):
        if not lines:  # every line deleted by the steps before: one empty line to work on
            lines = [b""]
        i = rng.randrange(len(lines))
        how = rng.randrange(7)
        if how == 0:
            del lines[i]
            done.append(f"deleted line {i}")
        elif how == 1:
            lines[i:i] = [lines[i]] * rng.choice((1, 3))
            done.append(f"repeated line {i}")
        elif how == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            done.append(f"swapped lines {i} and {j}")
        elif how == 3 and as_json:
            try:
                record, what = _mutate_tree(json.loads(lines[i]), rng)
                lines[i] = json.dumps(record, allow_nan=True).encode()
                done.append(f"line {i}: {what}")
            except ValueError:
                done.append(f"line {i} is not JSON; left")
        elif how == 4:
            digits = [k for k, c in enumerate(lines[i]) if 48 <= c <= 57]
            if digits:
                k = rng.choice(digits)
                lines[i] = lines[i][:k] + rng.choice((b"99999999999999999999", b"-", b"0", b"1e308")) + lines[i][k + 1:]
            done.append(f"line {i}: a number changed")
        elif how == 5:
            lines.insert(i, rng.choice((b"\x1b[31m\x00\xff\xfe", b"{" * 20_000, b"x" * 300_000, b"",
                                        b'{"type":"header"}', b"[0/0] [__recompiles] Recompiling function")))
            done.append(f"inserted a hostile line at {i}")
        else:
            del lines[i + 1:]
            done.append(f"cut after line {i}")
    return b"\n".join(lines), done
