"""JSON output: versioned, sorted keys, deterministic. Every ``--json`` goes through here."""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from typing import Any

import msgspec
import polars as pl

from tracewhy import __version__

#: Bumped when a field is removed or changes meaning; adding fields does not bump it.
JSON_SCHEMA_VERSION = 1


def to_jsonable(value: Any) -> Any:
    """Plain JSON values from results: dataclasses, DataFrames, enums, numpy scalars."""
    if isinstance(value, pl.DataFrame):
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


def render_json(command: str, payload: dict[str, Any]) -> str:
    doc = {
        "tool": "tracewhy",
        "tool_version": __version__,
        "json_schema": JSON_SCHEMA_VERSION,
        "command": command,
        **{k: to_jsonable(v) for k, v in payload.items()},
    }
    return msgspec.json.format(msgspec.json.encode(doc, order="sorted"), indent=2).decode()
