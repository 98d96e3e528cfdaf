"""Checks every ``--json`` document against its command's shipped JSON Schema (draft 2020-12,
format checking off). ``conftest`` hooks ``check_document`` into ``renderers.jsonout.envelope``,
where every document is made, so each one any test produces is checked.

One thing is stricter than JSON Schema: an ``integer`` must be a JSON integer, not a float
with no fraction (``12.0``), since a script reading the document sees the float.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import msgspec
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from tracewhy.cli.commands import COMMAND_MODULES
from tracewhy.cli.schemas import shipped_text


class DocumentInvalid(BaseException):
    """A ``--json`` document that its command's schema refuses. A BaseException, so that the
    CLI's last-resort handler (``except Exception``: an internal error) does not swallow it and
    the test that made the document fails on it."""


def _strict_integer(checker: Any, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
)


@functools.cache
def schema(command: str) -> dict[str, Any]:
    """The shipped schema of ``command``; for a word that is no command (``tracewhy nosuch
    --json``), the error document alone, its command any string."""
    if command in COMMAND_MODULES:
        loaded: dict[str, Any] = json.loads(shipped_text(command))
        return loaded
    base = copy.deepcopy(json.loads(shipped_text("which")))
    error = next(d for d in base["anyOf"] if d.get("title") == "ErrorDocument")
    error["properties"]["command"] = {"type": "string"}
    base["anyOf"] = [error]
    return base


@functools.cache
def validator(command: str) -> Any:
    return StrictValidator(schema(command))


def as_json(doc: Any) -> Any:
    """``doc`` as a reader of the printed text gets it (tuples are lists, floats stay floats)."""
    return msgspec.json.decode(msgspec.json.encode(doc))


def errors(doc: Any, command: str | None = None) -> list[ValidationError]:
    """What the schema of ``command`` (by default the document's own) says is wrong with ``doc``."""
    return list(validator(command or str(doc.get("command"))).iter_errors(doc))


def deepest(error: ValidationError) -> ValidationError:
    """Of an ``anyOf`` failure, the branch error that got furthest into the document."""
    while error.context:
        error = max(error.context, key=lambda e: (len(e.absolute_path), -len(e.absolute_schema_path)))
    return error


def describe(error: ValidationError) -> str:
    e = deepest(error)
    return f"at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"


@functools.cache
def fast_validator(command: str) -> Any:
    """jsonschema-rs's validator of ``command``'s schema (its draft from the schema's ``$schema``)."""
    return jsonschema_rs.validator_for(schema(command))


def integral_floats(doc: Any) -> bool:
    """Whether ``doc`` holds a float with an integral value (``12.0``) anywhere."""
    pending = [doc]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, float) and value.is_integer():
            return True
    return False


def fast_accepts(doc: Any) -> bool:
    """Whether jsonschema-rs (compiled: a 25 MB critical-path document in 0.27 s, where the
    Python validator takes 12 s) accepts ``doc`` where its verdict is the strict validator's: a
    document without integral floats, on which JSON Schema's integer (``12.0`` is one) and the
    strict one are the same. Anything else, a refusal included, goes to the Python validator,
    whose errors name the place. ``tests/test_json_contract_fast.py`` checks the two agree."""
    return not integral_floats(doc) and bool(fast_validator(str(doc.get("command"))).is_valid(doc))


def check_document(doc: dict[str, Any]) -> None:
    """The envelope hook: raise DocumentInvalid when ``doc`` breaks its command's schema."""
    printed = as_json(doc)
    if fast_accepts(printed):
        return
    found = errors(printed)
    if found:
        raise DocumentInvalid(f"tracewhy {doc.get('command')} --json breaks its schema: "
                              + "; ".join(describe(e) for e in found[:3]))


def variant(doc: Any) -> str:
    """Which of its command's document shapes ``doc`` is (the anyOf branch's title)."""
    for branch in schema(str(doc["command"]))["anyOf"]:
        probe = {**schema(str(doc["command"])), "anyOf": [branch]}
        if not list(StrictValidator(probe).iter_errors(doc)):
            return str(branch.get("title"))
    raise AssertionError(f"{doc.get('command')}: no shape of its schema matches")


def fractional_times(doc: Any, path: str = "") -> Iterator[str]:
    """Where a number under a key ending in ``_ns`` (at any depth, in tables too) is not an
    integer: a time is whole nanoseconds."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            where = f"{path}/{key}"
            if key.endswith("_ns"):
                yield from _non_integers(value, where)
            yield from fractional_times(value, where)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from fractional_times(value, f"{path}/{i}")


def _non_integers(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, float):
        yield f"{where} = {value!r}"
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _non_integers(item, f"{where}/{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_integers(item, f"{where}/{key}")
