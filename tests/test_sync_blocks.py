"""One rule for a run timed block by block (``blocks-synchronized``): ``blocks``, ``diagnose`` and
``check`` say it from the same measurement (analyses/blocks.py) and the same function
(findings/blocks.synchronized_blocks), on inline loops whose synchronizes are placed by hand and
on every real trace with annotations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import checked_report
from tracewhy.analyses.blocks import SYNC_AFTER_BLOCK_NS, BlocksOptions, blocks
from tracewhy.cli import main
from tracewhy.errors import TraceError
from tracewhy.findings import thresholds as th
from tracewhy.findings.blocks import synchronized_blocks
from tracewhy.findings.codes import Code
from tracewhy.model import Kind
from tracewhy.reports.check import CheckOptions, check
from tracewhy.reports.check_metrics import parse_limit

STEP_US = 10_000.0
#: Block starts in a step (µs); each block is 400 µs and launches two kernels.
BLOCK_START_US = {"forward": 10.0, "backward": 3_000.0, "optimizer": 6_000.0}
BLOCK_US = 400.0


def _loop(tmp_path: Path, names: tuple[str, ...], synced: tuple[str, ...], gap_us: float,
          step_markers: bool = True) -> Path:
    """Six 10 ms steps, each running ``names`` 3 ms apart; a cudaDeviceSynchronize (50 µs) starts
    ``gap_us`` after the end of each block in ``synced``, with no launch in between (a harness
    that reads a clock or logs before it synchronizes)."""
    b = KinetoBuilder()
    for i in range(6):
        o = STEP_US * i
        if step_markers:
            b.annotation(f"ProfilerStep#{i}", o, STEP_US)
        for name in names:
            start = o + BLOCK_START_US[name]
            b.annotation(name, start, BLOCK_US)
            b.launch(f"{name}_gemm", start + 10, 5, gpu_ts=start + 20, gpu_dur=200)
            b.launch(f"{name}_relu", start + 300, 5, gpu_ts=start + 310, gpu_dur=50)
            if name in synced:
                b.op("cudaDeviceSynchronize", start + BLOCK_US + gap_us, 50, cat="cuda_runtime")
    return b.write(tmp_path / "loop.json")


def _said(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, bool]:
    """Does each command say blocks-synchronized on this trace (through its --json)?"""
    out: dict[str, bool] = {}
    for command in ("blocks", "diagnose"):
        assert main([command, str(path), "--json"]) == 0
        out[command] = Code.BLOCKS_SYNCHRONIZED in {f["code"] for f in json.loads(capsys.readouterr().out)["findings"]}
    main(["check", str(path), "--json", "--max-step-p50", "1s"])
    doc = json.loads(capsys.readouterr().out)
    out["check"] = doc["attribution_only"]
    assert out["check"] == any(n["finding"]["code"] == Code.BLOCKS_SYNCHRONIZED for n in doc["notes"])
    return out


ALL_THREE = {"blocks": True, "diagnose": True, "check": True}
NONE = {"blocks": False, "diagnose": False, "check": False}


@pytest.mark.parametrize("gap_us", [100, 500])
def test_sync_after_each_block_is_said_by_all_three(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], gap_us: float) -> None:
    """A synchronize 100-500 µs after each block: past the 50 µs the old diagnose rule allowed,
    inside the structural rule's window."""
    names = ("forward", "backward", "optimizer")
    path = _loop(tmp_path, names, synced=names, gap_us=gap_us)
    assert _said(path, capsys) == ALL_THREE
    r = blocks(tracewhy.load(path))
    f = synchronized_blocks(r)
    assert f is not None and (r.steps, r.ending_syncs, r.synced_share) == (5, 15, 1.0)
    assert f.statement.startswith("A synchronize ends 15 of 15 annotated blocks that launched GPU work "
                                  "(100%; 3 synchronizes per step)")


def test_sync_past_the_window_is_not_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ("forward", "backward", "optimizer")
    gap_us = SYNC_AFTER_BLOCK_NS / 1000 + 500
    assert _said(_loop(tmp_path, names, synced=names, gap_us=gap_us), capsys) == NONE


def test_one_sync_per_step_is_incidental(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A per-step timer's synchronize after the last of two blocks ends half of them, as many as
    the share asks for; one a step is the loop's own, so nobody says it."""
    path = _loop(tmp_path, ("forward", "backward"), synced=("backward",), gap_us=100)
    r = blocks(tracewhy.load(path))
    assert r.synced_share == th.BLOCKS_SYNCED_MIN_SHARE and r.ending_syncs / r.steps == 1
    assert _said(path, capsys) == NONE


def test_without_step_markers_per_iteration(tmp_path: Path) -> None:
    """No step markers: the steps are the loop's iterations, one 'forward' block (the first of
    the equally repeated top-level blocks) to the next, and every block, 'forward' included,
    stays a block: the harness is still three per iteration and the per-step timer one."""
    names = ("forward", "backward", "optimizer")
    r = blocks(tracewhy.load(_loop(tmp_path, names, names, 100, step_markers=False)))
    assert r.step_marker == "forward" and r.steps == 5 and not r.per_capture  # 6 blocks, 5 whole iterations
    f = synchronized_blocks(r)
    assert f is not None and "15 of 15 annotated blocks" in f.statement and "3 synchronizes per step" in f.statement
    r = blocks(tracewhy.load(_loop(tmp_path, names[:2], ("backward",), 100, step_markers=False)))
    assert (r.per_capture, r.ending_syncs, r.synced_share, synchronized_blocks(r)) == (False, 5, 0.5, None)


def test_check_keeps_the_verdict_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gate's verdict on a speed limit stands (the syncs only add time: a pass holds without
    them); the line and the JSON say the figure is attribution, not throughput."""
    names = ("forward", "backward", "optimizer")
    path = str(_loop(tmp_path, names, synced=names, gap_us=100))
    assert main(["check", path, "--max-step-p50", "1s", "--max-kernels-per-step", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("ok   step-p50: 10.000 ms <= max 1.000 s (5 steady steps; attribution, not throughput: "
                        "blocks-synchronized)")
    assert lines[1] == "ok   kernels-per-step: 6 <= max 6 (mean of 5 steady steps)"  # a count: not qualified
    assert lines[2].startswith("note blocks-synchronized: A synchronize ends 15 of 15 annotated blocks")
    assert lines[-1] == "check: all 2 passed"
    assert main(["check", path, "--max-step-p50", "5ms", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["passed"], doc["attribution_only"], [x["attribution_only"] for x in doc["results"]]) == (
        False, True, [True])
    assert [n["about"] for n in doc["notes"]] == ["trace"]
    # Without a speed figure to qualify, the fact is not asked for (nor its cost paid).
    assert main(["check", path, "--max-kernels-per-step", "6"]) == 0
    assert capsys.readouterr().out.splitlines() == ["ok   kernels-per-step: 6 <= max 6 (mean of 5 steady steps)",
                                                    "check: all 1 passed"]


def test_check_says_it_of_a_synchronized_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ("forward", "backward", "optimizer")
    synced = _loop(tmp_path, names, synced=names, gap_us=100).rename(tmp_path / "synced.json")
    plain = _loop(tmp_path, names, synced=(), gap_us=100)
    main(["check", str(plain), "--baseline", str(synced), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["attribution_only"] is False and [n["about"] for n in doc["notes"]] == ["baseline"]


@pytest.mark.slow  # a diagnosis of each of 51 traces, shared with the files of conftest.SHARED_DIAGNOSES
def test_the_three_agree_on_every_real_annotated_trace(traces_dir: Path) -> None:
    """Same verdict from the one function on each real trace with annotations, through the
    Python API of each command. None of them was timed block by block: the PARAM benchmark
    traces (a synchronize ends every block, nested blocks ending together) have 1 per iteration."""
    verdicts = {}
    for path in sorted(p for p in traces_dir.rglob("*") if p.name.endswith((".json.gz", ".sqlite.gz"))):
        try:
            trace = tracewhy.load(path)
        except TraceError:
            continue  # not a profiler trace (an execution trace, a memory timeline)
        if trace.of_kind(Kind.ANNOTATION).height == 0:
            continue
        said = {
            "blocks": synchronized_blocks(blocks(trace, BlocksOptions())) is not None,
            "diagnose": Code.BLOCKS_SYNCHRONIZED in {f.code for f in checked_report(path).findings},
            "check": check(trace, CheckOptions(limits=(parse_limit("max-step-p50", "1s"),))).attribution_only,
        }
        assert len(set(said.values())) == 1, (path.name, said)
        verdicts[path.name] = said["blocks"]
    assert len(verdicts) >= 50  # 51 in ../shared/traces today
    assert not any(verdicts.values()), verdicts
