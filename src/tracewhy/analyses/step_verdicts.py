"""What an inference step did, and the evidence that says so: the attention ops' recorded
shapes (a query of one token per sequence is a decode; only in a trace that reads a KV cache) or
the engine's own per-iteration annotation (vLLM's ``execute_..._context_N(...)_generation_M(...)``,
SGLang's ``step[DECODE bs=N]``)."""

from __future__ import annotations

import re
from typing import Final

import msgspec
import polars as pl

from tracewhy.analyses.op_families import FLASH_BNHD, SDPA_BHND, base_name
from tracewhy.analyses.op_inputs import OpInputs
from tracewhy.model.schema import Col, Kind, OpAttrCol
from tracewhy.model.trace import Trace

_ATTENTION: Final = SDPA_BHND | FLASH_BNHD


class StepClass:
    """What an inference step did: the prompt's tokens (prefill), one new token per sequence
    (decode), or both in one batch (mixed: chunked prefill beside decodes)."""

    PREFILL: Final = "prefill"
    DECODE: Final = "decode"
    MIXED: Final = "mixed"


ORDER: Final = (StepClass.PREFILL, StepClass.DECODE, StepClass.MIXED)


class Evidence:
    """What decided a step's class, in the order it is tried."""

    SHAPES: Final = "attention shapes"  # query length per sequence of the attention ops
    ANNOTATION: Final = "engine annotation"  # the engine's per-iteration record_function


# vLLM's per-iteration annotation (ROCm builds, 2025: "execute_8192_context_9(sq8155sk8430...)_
# generation_37(sq37sk34489...)"; B200 eager: "execute_context_1(888_788544)_generation_0(0)"):
# tokens scheduled, then prefill ("context") and decode ("generation") request counts.
_VLLM_ITERATION: Final = re.compile(r"^execute_(?:(\d+)_)?context_(\d+)\(([^)]*)\)_generation_(\d+)\(")
# SGLang's (2025): "step[DECODE bs=32]", "step[EXTEND bs=4]", "step[MIXED ...]".
_SGLANG_ITERATION: Final = re.compile(r"^step\[(DECODE|EXTEND|PREFILL|MIXED)\b(?:[^\]]*?\bbs=(\d+))?")
_SGLANG_CLASS: Final = {"DECODE": StepClass.DECODE, "EXTEND": StepClass.PREFILL, "PREFILL": StepClass.PREFILL,
                        "MIXED": StepClass.MIXED}


class Verdict(msgspec.Struct, frozen=True):
    step_class: str
    evidence: str
    #: Tokens the step handled (query tokens over all sequences), where the evidence says.
    tokens: int | None
    detail: str


def annotation_verdict(name: str) -> Verdict | None:
    """The class an engine's per-iteration annotation states, or None for any other name."""
    m = _VLLM_ITERATION.match(name)
    if m:
        tokens, prefills, decodes = (int(m.group(1)) if m.group(1) else None), int(m.group(2)), int(m.group(4))
        if prefills == 0 and decodes == 0:
            return None
        cls = StepClass.MIXED if prefills and decodes else StepClass.PREFILL if prefills else StepClass.DECODE
        return Verdict(cls, Evidence.ANNOTATION, tokens,
                       f"{name.split('(')[0]}: {prefills} prefill and {decodes} decode request(s)")
    m = _SGLANG_ITERATION.match(name)
    if m:
        cls = _SGLANG_CLASS[m.group(1)]
        batch = int(m.group(2)) if m.group(2) else None
        return Verdict(cls, Evidence.ANNOTATION, batch if cls == StepClass.DECODE else None, name)
    return None


def shape_verdict(queries: list[tuple[int, int]]) -> Verdict | None:
    """From the attention ops' (sequences, query length) pairs: a query of one token per
    sequence is a decode, a longer one a prefill (its prompt, or a chunk of it)."""
    if not queries:
        return None
    decode = [q for q in queries if q[1] == 1]
    prefill = [q for q in queries if q[1] > 1]
    cls = StepClass.MIXED if decode and prefill else StepClass.DECODE if decode else StepClass.PREFILL
    batch, length = queries[0]
    detail = (f"{len(queries)} attention call(s), query length {'1' if not prefill else max(q[1] for q in prefill)}"
              f" over {batch} sequence(s)")
    return Verdict(cls, Evidence.SHAPES, batch * length if cls != StepClass.MIXED else None, detail)


class StepOps:
    """The attention calls with recorded shapes and the engine annotations, by process, to look up
    by step window. Shapes class steps only in a trace whose attention reads a KV cache somewhere
    (a key longer than its query): a forward pass over whole sequences alone (an encoder, a ViT,
    a training step's forward) is no prefill."""

    def __init__(self, trace: Trace) -> None:
        names = trace.kind_columns((Kind.CPU_OP,), pl.col(Col.NAME).cast(pl.String)).get_column(Col.NAME).unique()
        attention = [n for n in names.to_list() if n and base_name(n) in _ATTENTION]
        ops = (trace.slices_where(pl.col(Col.KIND).eq(Kind.CPU_OP.value) & pl.col(Col.NAME).is_in(attention),
                                  Col.ID, pl.col(Col.NAME).cast(pl.String), Col.TS, Col.DUR, Col.PID, Col.TID)
               .join(trace.op_attrs.select(Col.ID, OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES), on=Col.ID, how="left")
               .sort(Col.TID, Col.TS))
        rows = []
        open_end: dict[int, int] = {}
        for name, ts, dur, pid, tid, dims, types in ops.select(
                Col.NAME, Col.TS, Col.DUR, Col.PID, Col.TID, OpAttrCol.INPUT_DIMS, OpAttrCol.INPUT_TYPES).iter_rows():
            # A call inside another (SDPA and the kernel-specific op it dispatches to) is the same call.
            if ts < open_end.get(tid, ts):
                continue
            open_end[tid] = ts + dur
            x = OpInputs.parse(dims, types)
            q, k = (x.tensor(0), x.tensor(1)) if x else (None, None)
            if q is None or k is None or len(q[0]) != 4 or len(k[0]) != 4:
                continue
            # (batch, seqlen, heads, dim) or (batch, heads, seqlen, dim)
            seq = 1 if base_name(name) in FLASH_BNHD else 2
            rows.append((pid, ts, q[0][0], q[0][seq], k[0][seq]))
        self.attention = pl.DataFrame(rows, schema={Col.PID: pl.Int64, Col.TS: pl.Int64, "batch": pl.Int64,
                                                    "query": pl.Int64, "key": pl.Int64}, orient="row").sort(Col.TS)
        self.reads_cache = bool((self.attention.get_column("key") > self.attention.get_column("query")).any())
        notes = trace.slices_where(pl.col(Col.KIND).eq(Kind.ANNOTATION.value),
                                   pl.col(Col.NAME).cast(pl.String), Col.TS, Col.PID)
        engine = [n for n in notes.get_column(Col.NAME).unique().to_list() if n and annotation_verdict(n) is not None]
        self.annotations = notes.filter(pl.col(Col.NAME).is_in(engine)).sort(Col.TS)

    def queries(self, pid: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """(sequences, query length) of each attention call in the window; none when the trace's
        attention never reads a KV cache."""
        if not self.reads_cache:
            return []
        mine = self.attention.filter((pl.col(Col.PID) == pid) & (pl.col(Col.TS) >= lo) & (pl.col(Col.TS) < hi))
        return [(int(b), int(q)) for b, q in mine.select("batch", "query").iter_rows()]

    def annotation(self, pid: int, lo: int, hi: int) -> Verdict | None:
        """The first engine annotation that opens in the window (the outer one of SGLang's two)."""
        mine = self.annotations.filter((pl.col(Col.PID) == pid) & (pl.col(Col.TS) >= lo) & (pl.col(Col.TS) < hi))
        return annotation_verdict(mine.get_column(Col.NAME)[0]) if mine.height else None
