"""JSON output: versioned, sorted keys, deterministic. Every ``--json`` goes through here."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

import msgspec

from tracewhy import __version__

if TYPE_CHECKING:
    import polars as pl

#: Bumped when a field is removed or changes meaning; adding fields does not bump it.
JSON_SCHEMA_VERSION = 1


def to_jsonable(value: Any) -> Any:
    """Plain JSON values from results: dataclasses, DataFrames, enums, numpy scalars."""
    if _is_frame(value):
        if _all_flat(value):
            return _flat_rows(value)
        return [to_jsonable(row) for row in value.to_dicts()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return to_jsonable(value.item())
    return value


def _is_frame(value: Any) -> bool:
    """Whether ``value`` is a polars DataFrame. A run that never imported polars holds none
    (``which --json``), so polars is not imported to ask: it would be a third of that run."""
    polars = sys.modules.get("polars")
    return polars is not None and isinstance(value, polars.DataFrame)


def _all_flat(frame: pl.DataFrame) -> bool:
    """Whether every column has a dtype whose values ``to_dicts`` already gives as plain JSON
    values (floats aside)."""
    import polars as pl

    flat = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64,
            pl.Float32, pl.Float64, pl.String, pl.Boolean, pl.Null, pl.Categorical)
    return all(dtype in flat for dtype in frame.dtypes)


def _flat_rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    """Rows of a frame of plain columns, NaN and infinity as null, without a Python call per
    value (an 18k-row table took over a second the generic way)."""
    import polars as pl

    floats = [name for name, dtype in frame.schema.items() if dtype.is_float()]
    if floats:
        frame = frame.with_columns(pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c) for c in floats)
    return frame.to_dicts()


class Envelope(TypedDict):
    """The fields around every payload: which tool, version and schema wrote the document, for
    which command, and what the readers skipped or reinterpreted."""

    tool: Literal["tracewhy"]
    tool_version: str
    #: The version of this JSON contract: bumped when a field is removed or changes meaning.
    json_schema: int
    command: str
    #: Reader warnings of the run, one line each (FILE: what was skipped or reinterpreted).
    warnings: list[str]


class ErrorInfo(TypedDict):
    """Why the command failed: its one-line message (also on stderr) and its exit code."""

    message: str
    #: 2: bad usage; 3: bad input file; 70: an internal error (a bug).
    exit_code: int


class ErrorDocument(Envelope):
    """What ``--json`` prints when the command fails: the envelope and the error."""

    error: ErrorInfo


#: The fields the envelope sets around every payload; a payload never sets them itself.
ENVELOPE_FIELDS: Final = tuple(Envelope.__annotations__)

#: Called with every document ``envelope`` makes, before it is encoded. None in a normal run; the
#: test suite sets it to validate each document against its command's JSON Schema.
document_hook: Callable[[dict[str, Any]], None] | None = None


def envelope(command: str, payload: Mapping[str, Any], warnings: list[str]) -> dict[str, Any]:
    """The one JSON document every output is: which tool, version and schema wrote it, for which
    command, the reader warnings of the run, and the result's payload beside them. ``--json`` of
    every command and the HTML report's embedded data are this document."""
    clash = sorted(set(payload) & set(ENVELOPE_FIELDS))
    if clash:
        raise ValueError(f"a payload may not set the envelope's fields: {', '.join(clash)}")
    doc = {
        "tool": "tracewhy",
        "tool_version": __version__,
        "json_schema": JSON_SCHEMA_VERSION,
        "command": command,
        "warnings": list(warnings),
        **{k: to_jsonable(v) for k, v in payload.items()},
    }
    if document_hook is not None:
        document_hook(doc)
    return doc


def encode_json(doc: dict[str, Any], indent: bool = True) -> bytes:
    """``doc`` as JSON with sorted keys: indented for people, compact to embed in a page."""
    raw = msgspec.json.encode(doc, order="sorted")
    return msgspec.json.format(raw, indent=2) if indent else raw


def render_json(command: str, payload: Mapping[str, Any], warnings: list[str]) -> str:
    """The ``--json`` text of a command: its envelope, indented."""
    return encode_json(envelope(command, payload, warnings)).decode()


def render_error_json(command: str, message: str, exit_code: int, warnings: list[str]) -> str:
    """The ``--json`` text of a failed command: the envelope with ``error`` (ErrorDocument)."""
    info: ErrorInfo = {"message": message, "exit_code": exit_code}
    return render_json(command, {"error": info}, warnings)
