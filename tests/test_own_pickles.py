"""``own_pickles``: what tracewhy's helper processes send back is read by an unpickler that builds
only tracewhy's own objects, polars' frames, numpy's arrays and paths. A diagnosis of a real
trace and a diff's side round-trip whole (compared field by field with the originals); a pickle
that names anything else, the way a pickle runs code, is refused before it is called."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from conftest import shared_trace
from tracewhy import own_pickles
from tracewhy.analyses.diff import side
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.readers import read_trace
from tracewhy.reports.diagnose import diagnose_in, rule_findings


@pytest.mark.parametrize("relative", ["tracelens/h100_bert-small_bs1_seq512.json.gz",
                                      "nsys/nsysai_mfu_2gpu_before.sqlite.gz"])
def test_a_diagnosis_and_a_side_come_back_whole(relative: str) -> None:
    trace = read_trace(shared_trace(relative))
    ctx = Context(trace, DiagnoseOptions(fixes_together=False))
    report = diagnose_in(ctx, rule_findings(ctx))
    sent = side(trace, report.steps, report.memory)
    back_side, back_report = own_pickles.loads(pickle.dumps((sent, report), protocol=pickle.HIGHEST_PROTOCOL))
    assert [f.code for f in back_report.findings] == [f.code for f in report.findings]
    assert back_report.findings == report.findings
    assert back_side.summary == sent.summary and back_side.steady_ns == sent.steady_ns
    for name in ("ops", "kernels", "annotations"):
        assert_frame_equal(getattr(back_side, name), getattr(sent, name))
    assert_frame_equal(back_report.steps.table, report.steps.table)


def test_arrays_frames_and_paths_come_back() -> None:
    value = {"a": np.arange(5, dtype=np.int32), "f": pl.DataFrame({"x": [1, 2]}), "s": pl.Series("y", [1.5]),
             "p": Path("some/where"), "n": np.float64(2.5), "k": frozenset({1, 2})}
    back = own_pickles.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    assert isinstance(back, dict) and back["p"] == Path("some/where") and back["k"] == frozenset({1, 2})
    np.testing.assert_array_equal(back["a"], value["a"])
    assert_frame_equal(back["f"], value["f"])
    assert back["s"].to_list() == [1.5] and back["n"] == 2.5


class _Calls:
    """Pickles as a call of ``function`` with ``args`` (what a crafted pickle does)."""

    def __init__(self, function: object, *args: object) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.function, self.args


@pytest.mark.parametrize("crafted", [
    _Calls(os.system, "echo ran"),
    _Calls(subprocess.check_output, ["echo", "ran"]),
    _Calls(eval, "1 + 1"),
    _Calls(np.load, "anything.npy"),
    _Calls(pl.read_csv, "anything.csv"),
    _Calls(getattr, Path("x"), "unlink"),
])
def test_anything_else_is_refused(crafted: _Calls, tmp_path: Path) -> None:
    data = pickle.dumps(crafted, protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(pickle.UnpicklingError, match="not one of tracewhy's own objects"):
        own_pickles.loads(data)
    assert not list(tmp_path.iterdir())


def test_a_function_of_ours_is_refused() -> None:
    from tracewhy.output_files import write_output

    with pytest.raises(pickle.UnpicklingError):
        own_pickles.loads(pickle.dumps(_Calls(write_output, Path("x"), b"")))
