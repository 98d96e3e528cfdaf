"""How one table of a parse-cache entry is stored and loaded back.

Most columns go to an uncompressed Parquet file. In a table of at least ``MAPPED_MIN_ROWS`` rows,
the columns of a fixed-width number type without nulls (ids, times, pids and tids of the slices;
most of memory, kernel_attrs and flows) go instead to one file of raw little-endian arrays, which
a hit maps and hands to polars without a copy: their pages come from the OS file cache instead of
being decoded into new memory (on 1.9 M slices, five of the slices' fifteen columns and 19 k of
its 49 k page faults). Both files carry their size and xxh3-64 in the manifest, verified on load.
"""

from __future__ import annotations

import itertools
import mmap
import os
from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl
import xxhash

from tracewhy.cache_place import open_regular
from tracewhy.model.schema import TABLE_SCHEMAS

#: Smaller tables stay whole in Parquet: they read in a millisecond, and a mapped file costs a
#: second open and map.
MAPPED_MIN_ROWS: Final = 1 << 16
#: Each mapped column starts at a multiple of this, so that every array is aligned for its type.
_ALIGN: Final = 64
_LITTLE_ENDIAN: Final[dict[pl.DataType, str]] = {
    pl.Int8(): "<i1", pl.Int16(): "<i2", pl.Int32(): "<i4", pl.Int64(): "<i8",
    pl.UInt8(): "<u1", pl.UInt16(): "<u2", pl.UInt32(): "<u4", pl.UInt64(): "<u8",
    pl.Float32(): "<f4", pl.Float64(): "<f8",
}


def write_table(df: pl.DataFrame, name: str, into: Path) -> dict[str, Any]:
    """Write table ``name`` into the entry directory ``into``; its manifest record."""
    mapped = [c for c, t in df.schema.items() if t in _LITTLE_ENDIAN and df.get_column(c).null_count() == 0]
    if df.height < MAPPED_MIN_ROWS:
        mapped = []
    info: dict[str, Any] = {"rows": df.height}
    rest = df.drop(mapped)
    if rest.width or not mapped:
        file = into / f"{name}.parquet"
        # Uncompressed: a third larger than lz4 (0.07 of the trace's size for Kineto JSON)
        # and read twice as fast, and the hit's speed is what the cache is for.
        rest.write_parquet(file, compression="uncompressed", statistics=False)
        info |= _file_record(file)
    if mapped:
        file = into / f"{name}.columns"
        offsets: list[list[Any]] = []
        with open(file, "wb") as f:
            for c in mapped:
                f.write(b"\0" * (-f.tell() % _ALIGN))
                offsets.append([c, f.tell()])
                values = df.get_column(c).to_numpy().astype(_LITTLE_ENDIAN[df.schema[c]], copy=False)
                f.write(np.ascontiguousarray(values).data)
        info["mapped"] = {**_file_record(file), "columns": offsets}
    return info


def load_table(entry: Path, name: str, info: dict[str, Any]) -> pl.DataFrame:
    """Table ``name`` of the entry, verified against its manifest record ``info``, with exactly
    its declared dtypes; ValueError (or OSError) when anything differs."""
    schema = TABLE_SCHEMAS[name]
    rows = info["rows"]
    stored = pl.DataFrame()
    if "file" in info:
        file = entry / info["file"]
        _verified_map(file, info).close()
        # Uncompressed Parquet read by path: polars maps the file and copies the columns
        # straight out (0.03 s for 1.9M slices, where lz4 from bytes took 0.07 s). Parquet keeps
        # Enum and Categorical as dictionaries; the cast restores the exact declared dtypes (and
        # fails, rejecting the entry, if a value does not fit or a column is unknown).
        stored = pl.read_parquet(file)
        stored = stored.cast({c: schema[c] for c in stored.columns}, strict=True)
        if stored.height != rows:
            raise ValueError(f"{name}: row count differs from the manifest")
    columns = {c: stored.get_column(c) for c in stored.columns}
    if "mapped" in info:
        record = info["mapped"]
        data = _verified_map(entry / record["file"], record)
        # Cut as the Parquet columns are (one chunk per row group): columns chunked alike are
        # never copied to align them, here or in the analyses.
        chunks = stored.get_column(stored.columns[0]).chunk_lengths() if stored.width else [rows]
        cuts = list(itertools.pairwise(np.cumsum([0, *chunks]).tolist()))
        for column, offset in record["columns"]:
            dtype = _LITTLE_ENDIAN.get(schema[column]) if column in schema else None
            if dtype is None or offset % _ALIGN or offset + rows * np.dtype(dtype).itemsize > len(data):
                raise ValueError(f"{name}.{column}: not a mapped column of this table")
            values = np.frombuffer(data, dtype=dtype, count=rows, offset=offset)
            # The dtype is the declared one already: a cast would copy the column.
            parts = [pl.Series(column, values[start:end]) for start, end in cuts]
            columns[column] = parts[0] if len(parts) == 1 else pl.concat(parts, rechunk=False)
    missing = [c for c in schema if c not in columns]
    if missing:
        raise ValueError(f"{name}: no column {missing[0]}")
    return pl.DataFrame([columns[c] for c in schema])


def _file_record(file: Path) -> dict[str, Any]:
    data = file.read_bytes()
    return {"file": file.name, "bytes": len(data), "xxh3_64": xxhash.xxh3_64_intdigest(data)}


def _verified_map(file: Path, record: dict[str, Any]) -> mmap.mmap:
    """A read-only map of ``file``, which has the size and xxh3-64 the manifest recorded (hashed
    through the map, no copy: 0.005 s for 64 MB). A file of the cache is only ever renamed or
    unlinked, never truncated in place, so the map cannot lose its pages; the mapped columns a
    hit hands to polars keep it open for the Trace's life."""
    with open_regular(file) as f:
        size = os.fstat(f.fileno()).st_size
        if size != record["bytes"]:
            raise ValueError(f"{file.name}: size differs from the manifest")
        if size == 0:
            raise ValueError(f"{file.name}: empty")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if xxhash.xxh3_64_intdigest(data) != record["xxh3_64"]:
        data.close()
        raise ValueError(f"{file.name}: checksum differs from the manifest")
    return data
