"""The top-level fields of a Kineto file (kept raw by the event decode) as values, and its
``deviceProperties`` as the devices table; what does not fit is counted, never raised."""

from __future__ import annotations

from typing import Any, Final

import msgspec
import polars as pl

from tracewhy.model.schema import DEVICES_SCHEMA, DeviceCol
from tracewhy.readers.kineto.repair import DEVICE_RANGE, merge_counts, repair_json
from tracewhy.readers.limits import bad_utf8

_DEVICE_KEYS: Final = {
    DeviceCol.DEVICE: "id",
    DeviceCol.NAME: "name",
    DeviceCol.TOTAL_MEM: "totalGlobalMem",
    DeviceCol.CC_MAJOR: "computeMajor",
    DeviceCol.CC_MINOR: "computeMinor",
    DeviceCol.NUM_SMS: "numSms",
    DeviceCol.MAX_THREADS_PER_SM: "maxThreadsPerMultiprocessor",
    DeviceCol.REGS_PER_SM: "regsPerMultiprocessor",
    DeviceCol.SHARED_MEM_PER_SM: "sharedMemPerMultiprocessor",
}
_INT_RANGE: Final[dict[pl.DataType, tuple[int, int]]] = {
    pl.Int32(): (-(2**31), 2**31 - 1), pl.Int64(): (-(2**63), 2**63 - 1)}


def decode_value(raw: msgspec.Raw, problems: dict[str, int]) -> Any:
    """A header field's value; None when it is not JSON. Invalid UTF-8 in it (the piece reader
    keeps the header raw, so it was never repaired) is replaced and counted."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        if not bad_utf8(e):
            return None
        fixed = repair_json(raw)
        merge_counts(problems, fixed.counts)
        return decode_value(msgspec.Raw(fixed.data), problems) if fixed.counts else None


def device_table(header: dict[str, msgspec.Raw], problems: dict[str, int]) -> pl.DataFrame:
    # tb_plugin's 2021 test fixture calls the list "computeProperties".
    raw = header.get("deviceProperties", header.get("computeProperties"))
    items = decode_value(raw, problems) if raw is not None else None
    rows = [
        {col: _scalar(item.get(key), DEVICES_SCHEMA[col], problems) for col, key in _DEVICE_KEYS.items()}
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, dict)
    ]
    return pl.DataFrame(rows, schema=DEVICES_SCHEMA) if rows else pl.DataFrame(schema=DEVICES_SCHEMA)


def _scalar(value: Any, dtype: pl.DataType, problems: dict[str, int]) -> Any:
    if dtype == pl.String:
        return value if isinstance(value, str) else None
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    lo, hi = _INT_RANGE[dtype]
    if lo <= value <= hi:
        return value
    # An id or size past the column's integers (99999999999999999999999 in a corrupt file)
    # made polars refuse the whole table.
    problems[DEVICE_RANGE] = problems.get(DEVICE_RANGE, 0) + 1
    return None
