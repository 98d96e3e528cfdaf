"""One op's recorded inputs as ``record_shapes`` writes them: dims and dtypes per argument and,
in newer PyTorch, the concrete values of scalar arguments (``Concrete Inputs``), parsed once for
the shape formulas (``shapes``) and the step classes and bytes that read them."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from tracewhy.analyses.tensor_sizes import DTYPE_BYTES


class OpInputs(msgspec.Struct, frozen=True):
    """One op's recorded inputs: dims and types per argument, concrete values when recorded."""

    dims: list[Any]
    types: list[str]
    concrete: list[Any] | None = None

    @staticmethod
    def parse(dims_json: str | None, types_json: str | None, concrete_json: str | None = None) -> OpInputs | None:
        try:
            dims = json.loads(dims_json) if dims_json else None
            types = json.loads(types_json) if types_json else []
            concrete = json.loads(concrete_json) if concrete_json else None
        except (json.JSONDecodeError, TypeError):
            return None
        if not isinstance(dims, list):
            return None
        types = [str(t) for t in types] if isinstance(types, list) else []
        return OpInputs(dims, types, concrete if isinstance(concrete, list) else None)

    def tensor(self, i: int) -> tuple[list[int], str] | None:
        """Argument ``i`` as (shape, dtype) if it is a tensor (a list of ints with a dtype)."""
        if i >= len(self.dims):
            return None
        shape = self.dims[i]
        dtype = self.types[i] if i < len(self.types) else ""
        if not isinstance(shape, list) or not all(isinstance(x, int) for x in shape):
            return None
        if dtype in ("", "Scalar", "ScalarList", "TensorList", "GenericList") or dtype not in DTYPE_BYTES:
            return None
        return shape, dtype

    def tensors(self) -> list[tuple[list[int], str]]:
        return [t for i in range(len(self.dims)) if (t := self.tensor(i)) is not None]

    def value(self, i: int) -> Any:
        """The concrete value of argument ``i`` ("True", "2", "[1, 1]" parsed), or None."""
        if self.concrete is None or i >= len(self.concrete):
            return None
        raw = self.concrete[i]
        if raw in ("", None):
            return None
        if isinstance(raw, str):
            low = raw.strip()
            if low in ("True", "False"):
                return low == "True"
            try:
                # bool lists are written as Python prints them: "[False, True, True]"
                return json.loads(low.replace("(", "[").replace(")", "]").replace("True", "true")
                                  .replace("False", "false"))
            except json.JSONDecodeError:
                return low
        return raw


class InputsById:
    """Each op's ``OpInputs`` by slice id, parsed when first asked for and once per distinct
    recorded text: an analysis that reads a few ops' shapes parses those alone (parsing all 23 k
    ops of a ResNet-50 trace up front took 0.45 s of its 1.7 s diagnosis), and ops recorded with
    the same dims and types share one parse, which is read, never changed."""

    def __init__(self, ids: list[int], dims: list[str | None], types: list[str | None]) -> None:
        self._raw = dict(zip(ids, zip(dims, types, strict=True), strict=True))
        self._parsed: dict[tuple[str | None, str | None], OpInputs | None] = {}

    def get(self, op: int) -> OpInputs | None:
        """The recorded inputs of op ``op``; None where it has none, or they do not parse."""
        raw = self._raw.get(op)
        return self._parse_once(raw) if raw is not None else None

    def any(self) -> bool:
        """Whether any op's inputs parse (the trace recorded shapes)."""
        return any(self._parse_once(raw) is not None for raw in dict.fromkeys(self._raw.values()))

    def _parse_once(self, raw: tuple[str | None, str | None]) -> OpInputs | None:
        if raw not in self._parsed:
            self._parsed[raw] = OpInputs.parse(*raw)
        return self._parsed[raw]
