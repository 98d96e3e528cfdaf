"""The JSON Schema (draft 2020-12) of a command's ``--json`` document, generated from the payload
declarations: the TypedDicts beside each payload function, the result dataclasses they hold and
the polars schemas of their tables (``rows``).

msgspec turns the types into a schema; this module adds what the encoder guarantees and msgspec
cannot know: every declared object is closed (``additionalProperties: false``) and has all its
fields (``to_jsonable`` writes a dataclass field that has a default too), a float may be null
(NaN and infinity are written as null), a ``*_ns`` property is an integer, and the envelope's
fields are part of every document. Each schema is one document, its parts under ``$defs``.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import inspect
import re
import sys
import textwrap
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, get_args, get_origin

import msgspec
import polars as pl

from tracewhy.renderers.jsonout import JSON_SCHEMA_VERSION, Envelope, ErrorDocument

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
#: The schemas' ``$id``: a name, not a place (the files are in the package, ``tracewhy/schemas``).
ID_BASE: Final = "urn:tracewhy:json-schema:{version}:"
#: Said once per schema instead of on each of the many time properties.
NS_NOTE: Final = ("Every property whose name ends in _ns is a whole number of nanoseconds: a statistic that falls "
                  "between two (a mean, the median of an even count, an interpolated percentile) is rounded to the "
                  "nearest, ties to even. A number may be null where the value is not a finite number.")
_NS_NAME: Final = re.compile(r"_ns$")


def rows(schema: Mapping[str, pl.DataType | type[pl.DataType]], description: str | None = None,
         patterns: Mapping[str, pl.DataType | type[pl.DataType]] | None = None) -> msgspec.Meta:
    """Declares a polars table in a payload (``Annotated[pl.DataFrame, rows(STEPS_SCHEMA)]``): in
    JSON an array of row objects, one property per column of ``schema``, each of which may be null
    (a polars schema does not say which columns hold nulls). ``patterns``: columns named by the
    input (pipeline stages), as a regular expression of their names and their dtype."""
    items = row_schema(schema)
    if patterns:
        items["patternProperties"] = {p: _dtype_schema(d) for p, d in patterns.items()}
    return msgspec.Meta(description=description, extra_json_schema={"type": "array", "items": items})


def rows_of_either(schemas: Sequence[Mapping[str, pl.DataType | type[pl.DataType]]],
                   description: str | None = None) -> msgspec.Meta:
    """Declares a table that has one of ``schemas`` (the report's overlap rows: per steady step,
    or per device over the trace)."""
    return msgspec.Meta(description=description, extra_json_schema={
        "type": "array", "items": {"anyOf": [row_schema(s) for s in schemas]}})


def times_under_ns_keys(value_type: type) -> msgspec.Meta:
    """Declares a map whose values are ``value_type`` (a TypedDict of numbers) and whose values
    under a key ending in ``_ns`` are times: there every number is an integer."""
    generated = msgspec.json.schema(value_type)
    timed: dict[str, Any] = generated["$defs"][_ref_name(generated)]
    _tighten(timed)
    for name, prop in timed["properties"].items():
        timed["properties"][name] = {**prop}
        _integer_times(timed["properties"][name])
    return msgspec.Meta(extra_json_schema={"patternProperties": {"_ns$": timed}})


def free_rows(description: str | None = None) -> msgspec.Meta:
    """Declares a table whose columns vary with the input (``sql``'s query): rows of any shape,
    their names and values the query's."""
    return msgspec.Meta(description=description,
                        extra_json_schema={"type": "array", "items": {"type": "object", "additionalProperties": True}})


def row_schema(schema: Mapping[str, pl.DataType | type[pl.DataType]]) -> dict[str, Any]:
    """The JSON Schema of one row of a table with ``schema``."""
    props = {}
    for name, dtype in schema.items():
        prop = _dtype_schema(dtype)
        if _NS_NAME.search(name) and prop.get("type") != ["integer", "null"]:
            raise TypeError(f"column {name!r} is a time in ns but declared {dtype}: declare it Int64")
        props[name] = prop
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _dtype_schema(dtype: Any) -> dict[str, Any]:
    d = dtype if isinstance(dtype, pl.DataType) else dtype()
    if d.is_integer():
        return {"type": ["integer", "null"]}
    if d.is_float():
        return {"type": ["number", "null"]}
    if isinstance(d, (pl.String, pl.Categorical, pl.Enum)):
        return {"type": ["string", "null"]}
    if isinstance(d, pl.Boolean):
        return {"type": ["boolean", "null"]}
    if isinstance(d, pl.Null):
        return {"type": "null"}
    if isinstance(d, (pl.List, pl.Array)):
        return {"type": ["array", "null"], "items": _dtype_schema(d.inner)}
    if isinstance(d, pl.Struct):
        fields = {f.name: _dtype_schema(f.dtype) for f in d.fields}
        return {"type": ["object", "null"], "properties": fields, "required": list(fields),
                "additionalProperties": False}
    raise TypeError(f"no JSON form declared for the polars dtype {d}")


def _hook(cls: type) -> dict[str, Any]:
    """Types msgspec does not know: a bare DataFrame must be declared with ``rows``."""
    if cls is pl.DataFrame:
        return {"type": "array"}  # (``rows`` adds the row schema)
    raise NotImplementedError


def command_schema(command: str, payloads: Sequence[Any], description: str,
                   extra_documents: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The schema of ``tracewhy COMMAND --json``: one of the ``payloads`` (TypedDicts; several
    when the input decides the shape, as ``memory`` on a trace or on a snapshot) in the envelope,
    the error document, or one of ``extra_documents`` (schemas of documents printed without the
    envelope: ``schema COMMAND`` prints a JSON Schema)."""
    _resolve_deferred_imports()
    types = [*payloads, ErrorDocument]
    tops, defs = msgspec.json.schema_components(types, schema_hook=_hook, ref_template="#/$defs/{name}")
    envelope = _envelope_properties(command, defs)
    documents = []
    for declared, top in zip(types, tops, strict=True):
        name = _ref_name(top)
        body = defs[name]
        own = {k: v for k, v in body["properties"].items() if declared is not ErrorDocument or k not in envelope}
        clash = sorted(set(own) & set(envelope))
        if clash:
            raise TypeError(f"{command}: {name} declares the envelope's fields {clash}")
        documents.append({**{k: v for k, v in body.items() if k not in ("properties", "required")},
                          "type": "object", "properties": {**envelope, **own},
                          "required": [*envelope, *(r for r in body["required"] if r in own)],
                          "additionalProperties": False})
        del defs[name]
    classes = _classes([*payloads, ErrorDocument])
    _all_fields_written(defs, classes)
    _describe_fields(defs, classes)
    doc = {
        "$schema": DIALECT,
        "$id": f"{ID_BASE.format(version=JSON_SCHEMA_VERSION)}{command}",
        "title": f"tracewhy {command} --json",
        "description": f"{description}\n\n{NS_NOTE}",
        "type": "object",
        "anyOf": [*documents, *(dict(d) for d in extra_documents)],
        "$defs": dict(sorted(defs.items())),
    }
    _tighten(doc)
    if FREE_OBJECT in set(_refs(doc)):
        defs.update(copy.deepcopy(FREE_DEFS))
        doc["$defs"] = dict(sorted(defs.items()))
    missing = sorted(set(_refs(doc)) - set(defs))
    if missing:
        raise TypeError(f"{command}: references to undeclared parts {missing}")
    return doc


def _envelope_properties(command: str, defs: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = dict(msgspec.json.schema(Envelope)["$defs"]["Envelope"]["properties"])
    props["command"] = {"const": command}
    props["json_schema"] = {"const": JSON_SCHEMA_VERSION}
    defs.pop("Envelope", None)
    return props


def _ref_name(schema: Mapping[str, Any]) -> str:
    return str(schema["$ref"]).rsplit("/", 1)[-1]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v.rsplit("/", 1)[-1]
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _tighten(node: Any, name: str | None = None) -> None:
    """What the encoder guarantees, made explicit: see the module docstring."""
    if isinstance(node, list):  # (an anyOf's members: a time's name holds for each)
        for v in node:
            _tighten(v, name)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("description"), str):
        node["description"] = _plain(node["description"])
    props = node.get("properties")
    if isinstance(props, dict) and node.get("type") in ("object", ["object", "null"]):
        node.setdefault("additionalProperties", False)
        for key, prop in props.items():
            prop.pop("default", None)
            _tighten(prop, key)
        for k, v in node.items():
            if k != "properties":
                _tighten(v)
        return
    if node.get("type") == "number":
        node["type"] = ["number", "null"]
    if node.get("type") == "object" and not _SHAPED & set(node):
        # An object whose content varies (a finding's evidence): its times are integers too.
        del node["type"]
        node["$ref"] = f"#/$defs/{FREE_OBJECT}"
        return
    if name is not None and _NS_NAME.search(name):
        _integer_times(node)
    for k, v in node.items():
        _tighten(v, name if k in ("anyOf", "items", "additionalProperties") else None)


#: What makes an object's schema say its content (an object without them is free-form).
_SHAPED: Final = {"properties", "additionalProperties", "patternProperties", "anyOf", "oneOf", "allOf", "$ref"}
#: The ``$defs`` of free-form content (a finding's evidence, a capture's settings): any JSON, in
#: which a time (a key ending in _ns) is whole nanoseconds at any depth, or lists and maps of them.
FREE_OBJECT: Final = "FreeObject"
FREE_DEFS: Final = {
    FREE_OBJECT: {
        "description": "Content that varies with the input; a time in it (a key ending in _ns, at any depth) "
                       "is whole nanoseconds.",
        "type": "object",
        "patternProperties": {"_ns$": {"$ref": "#/$defs/FreeTime"}},
        "additionalProperties": {"$ref": "#/$defs/FreeValue"},
    },
    "FreeValue": {"anyOf": [
        {"type": ["string", "number", "boolean", "null"]},
        {"$ref": f"#/$defs/{FREE_OBJECT}"},
        {"type": "array", "items": {"$ref": "#/$defs/FreeValue"}},
    ]},
    "FreeTime": {"anyOf": [
        {"type": ["integer", "null"]},
        {"type": "array", "items": {"$ref": "#/$defs/FreeTime"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/FreeTime"}},
    ]},
}


def _plain(doc: str) -> str:
    """A docstring as a description: dedented, ``literal`` as `literal` (Markdown)."""
    return inspect.cleandoc(doc).replace("``", "`")


def _integer_times(node: dict[str, Any]) -> None:
    """A time (a ``*_ns`` property) is an integer, even where its Python type says float (a
    statistic typed for any sample, rounded for durations)."""
    t = node.get("type")
    if t == "number":
        node["type"] = "integer"
    elif isinstance(t, list) and "number" in t:
        node["type"] = ["integer" if x == "number" else x for x in t]


def _all_fields_written(defs: dict[str, Any], classes: Sequence[type]) -> None:
    """A dataclass's fields are all written (``to_jsonable``), those with defaults too: all required.
    (A TypedDict's ``NotRequired`` keys stay optional: a payload sets them only for some options.)"""
    for cls in classes:
        schema = _def_of(defs, cls)
        if schema is not None and dataclasses.is_dataclass(cls):
            schema["required"] = list(schema["properties"])


def _def_of(defs: dict[str, Any], cls: type) -> dict[str, Any] | None:
    """The ``$defs`` entry msgspec made for ``cls``: its name, or its full name where two classes
    share the name."""
    for key in (re.sub(r"[^a-zA-Z0-9.\-_]", "_", f"{cls.__module__}.{cls.__qualname__}"), cls.__name__):
        schema = defs.get(key)
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            return schema
    return None


# --- descriptions -------------------------------------------------------------------------------


def _describe_fields(defs: dict[str, Any], classes: Sequence[type]) -> None:
    """Field descriptions from ``#:`` comments above the fields of the declaring classes."""
    for cls in classes:
        schema = _def_of(defs, cls)
        if schema is None:
            continue
        for field, text in _field_comments(cls).items():
            prop = schema["properties"].get(field)
            if isinstance(prop, dict) and "description" not in prop:
                prop["description"] = text


def _classes(roots: Sequence[Any]) -> list[type]:
    seen: list[type] = []

    def visit(t: Any) -> None:
        for arg in get_args(t):
            visit(arg)
        origin = get_origin(t)
        if origin is not None:
            visit(origin)
        if isinstance(t, type) and t not in seen and t.__module__.startswith("tracewhy"):
            seen.append(t)
            for hint in getattr(t, "__annotations__", {}).values():
                if not isinstance(hint, str):
                    visit(hint)
            for value in _resolved_hints(t).values():
                visit(value)

    for root in roots:
        visit(root)
    return seen


def _resolved_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # (a class whose annotations do not resolve holds nothing to describe)
        return {}


def _field_comments(cls: type) -> dict[str, str]:
    """``#:`` comment lines right above each annotated field of ``cls``, joined."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    out: dict[str, str] = {}
    tree = ast.parse(source).body
    if not tree or not isinstance(tree[0], ast.ClassDef):
        return out
    for node in tree[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment: list[str] = []
            i = node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                comment.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            if comment:
                out[node.target.id] = " ".join(comment)
    return out


# --- names only imported for type checking ---------------------------------------------------------


#: The modules whose type-checking imports have been made (each once).
_RESOLVED: set[str] = set()


def _resolve_deferred_imports() -> None:
    """Import, into each tracewhy module, the names it imports only for type checking: its
    annotations name them, and the schema generator evaluates annotations (a command imports
    them lazily, to start fast)."""
    while True:
        todo = [(n, m) for n, m in list(sys.modules.items())
                if n.startswith("tracewhy") and m is not None and n not in _RESOLVED]
        if not todo:
            return
        for name, module in todo:
            _RESOLVED.add(name)
            _resolve_module(module)


def _resolve_module(module: Any) -> None:
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    _import_into(module.__dict__, stmt)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_into(namespace: dict[str, Any], stmt: ast.Import | ast.ImportFrom) -> None:
    for alias in stmt.names:
        try:
            if isinstance(stmt, ast.Import):
                top = importlib.import_module(alias.name)
                namespace.setdefault(alias.asname or alias.name.split(".")[0],
                                     top if alias.asname else importlib.import_module(alias.name.split(".")[0]))
            else:
                module = importlib.import_module(stmt.module or "")
                namespace.setdefault(alias.asname or alias.name, getattr(module, alias.name))
        except (ImportError, AttributeError):
            continue  # (an optional dependency that is absent: nothing declared needs it)
