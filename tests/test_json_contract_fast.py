"""The compiled validator (jsonschema-rs) that accepts most documents in the tests' schema hook
agrees with the strict Python validator: on real documents and on each of them broken in many
places (a value of another type, a key taken away or added, an integer written as ``12.0``)."""

from __future__ import annotations

import copy
import io
import json
import random
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import pytest

from conftest import shared_trace
from json_contract import errors, fast_accepts, fast_validator, integral_floats
from tracewhy.cli import main

#: Commands and traces whose documents are broken here (small ones: the Python validator reads
#: each broken copy).
RUNS = [("diagnose", "hta/a100_cuda_event_sync_small.json.gz"), ("gaps", "hta/a100_cuda_event_sync_small.json.gz"),
        ("steps", "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"),
        ("nvtx", "nsys/nsysai_mock_rtx3080.sqlite.gz"), ("info", "nsys/nsysai_mock_rtx3080.sqlite.gz")]
#: Broken copies made of each document.
COPIES = 60


def _document(command: str, relative: str) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([command, "--json", "--no-cache", str(shared_trace(relative))]) == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def _off_integral(doc: Any) -> Any:
    """``doc`` with each integral float (``12.0``) moved off its integer (``12.25``): a base the
    fast path decides (those are numbers the schema lets be any number, or the strict validator
    would have refused the document)."""
    if isinstance(doc, dict):
        return {k: _off_integral(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_off_integral(v) for v in doc]
    return doc + 0.25 if isinstance(doc, float) and doc.is_integer() else doc


def _places(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value in ``doc`` (the document itself left out)."""
    if isinstance(doc, dict):
        items: Any = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        return
    for key, value in items:
        yield (*path, key)
        yield from _places(value, (*path, key))


def _broken(doc: Any, place: tuple[Any, ...], how: int) -> Any:
    out = copy.deepcopy(doc)
    parent = out
    for key in place[:-1]:
        parent = parent[key]
    key, value = place[-1], parent[place[-1]]
    if how == 0:
        parent[key] = "not what the schema says"
    elif how == 1:
        parent[key] = float(value) if isinstance(value, int) and not isinstance(value, bool) else None
    elif how == 2 and isinstance(parent, dict):
        del parent[key]
    elif how == 3 and isinstance(value, dict):
        value["no_such_key"] = 1
    else:
        parent[key] = [] if not isinstance(value, list) else {}
    return out


@pytest.mark.parametrize(("command", "relative"), RUNS, ids=[f"{c} {t.split('/')[0]}" for c, t in RUNS])
def test_the_fast_path_accepts_only_what_the_strict_validator_accepts(command: str, relative: str) -> None:
    printed = _document(command, relative)
    assert not errors(printed)
    assert fast_accepts(printed) or integral_floats(printed)
    doc = _off_integral(printed)
    assert not errors(doc) and fast_accepts(doc)
    places = list(_places(doc))
    rng = random.Random(f"{command} {relative}")
    verdicts = {True: 0, False: 0}
    for _ in range(COPIES):
        broken = _broken(doc, rng.choice(places), rng.randrange(5))
        strict_ok = not errors(broken)
        if fast_accepts(broken):
            assert strict_ok, "the compiled validator accepted what the strict one refuses"
        if not integral_floats(broken):
            assert bool(fast_validator(command).is_valid(broken)) == strict_ok
            verdicts[strict_ok] += 1
    # (The sweep must test something: both verdicts occur.)
    assert verdicts[True] >= 1 and verdicts[False] >= COPIES // 4, verdicts
