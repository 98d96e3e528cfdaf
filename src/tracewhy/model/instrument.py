"""Instrument logs as tables: what ``tracewhy.instrument`` (or any code writing its JSON Lines
format) recorded, one row per block and per stage mark, every rank's records on its own clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec
import polars as pl


class LogBlockCol:
    """Columns of ``InstrumentLog.blocks``."""

    RANK: Final = "rank"
    STEP: Final = "step"
    CHUNK: Final = "chunk"
    NAME: Final = "name"
    START: Final = "start_ns"  # on the rank's own clock; null where the writer gave none
    HOST: Final = "host_ns"
    GPU: Final = "gpu_ns"  # null where no GPU time was measured
    DEPTH: Final = "depth"
    SYNC: Final = "sync"


LOG_BLOCKS_SCHEMA: Final = pl.Schema({
    LogBlockCol.RANK: pl.Int64, LogBlockCol.STEP: pl.Int64, LogBlockCol.CHUNK: pl.Int64, LogBlockCol.NAME: pl.String,
    LogBlockCol.START: pl.Int64, LogBlockCol.HOST: pl.Int64, LogBlockCol.GPU: pl.Int64, LogBlockCol.DEPTH: pl.Int64,
    LogBlockCol.SYNC: pl.Boolean,
})


class MarkCol:
    """Columns of ``InstrumentLog.marks``."""

    RANK: Final = "rank"
    CHUNK: Final = "chunk"
    NAME: Final = "name"
    T: Final = "t_ns"  # the rank's own clock
    GPU_T: Final = "gpu_t_ns"  # from the rank's first CUDA mark; null without one


MARKS_SCHEMA: Final = pl.Schema({
    MarkCol.RANK: pl.Int64, MarkCol.CHUNK: pl.Int64, MarkCol.NAME: pl.String, MarkCol.T: pl.Int64,
    MarkCol.GPU_T: pl.Int64,
})


class RankHeader(msgspec.Struct, frozen=True):
    """A rank's ``header`` record; ``present`` False when the log had none (hand-written logs)."""

    rank: int
    file: str
    present: bool
    world_size: int | None = None
    clock: str | None = None
    sync: bool = False
    cuda_events: bool | None = None
    device: str | None = None
    versions: dict[str, str] = msgspec.field(default_factory=dict)


@dataclass(frozen=True)
class InstrumentLog:
    """Every rank's records; ``warnings`` name what was skipped."""

    source: str
    headers: tuple[RankHeader, ...]
    blocks: pl.DataFrame
    marks: pl.DataFrame
    warnings: tuple[str, ...] = ()

    @property
    def sync(self) -> bool:
        """Written in attribution mode (a synchronize at each block's end) on any rank."""
        return any(h.sync for h in self.headers) or bool(self.blocks.get_column(LogBlockCol.SYNC).any())

    @property
    def ranks(self) -> list[int]:
        return sorted({h.rank for h in self.headers})
