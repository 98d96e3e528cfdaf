"""Several traces on one command line (``diagnose``, ``report``, ``steps``, ``gaps``, ``check``):
the ranks of one job read as ranks (the planted straggler of the gloo pair sets the pace, the
HTA 128-rank pair's world size from its raw JSON), runs of one program compared (the planted
5 ms sleep of the slow-step pair, the resnet50 captures with and without DataLoader workers),
traces of different programs shown one after another without a comparison. Each trace's part
of the output is checked against the same command on that trace alone."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from conftest import GENERATED, shared_trace
from tracewhy.analyses.run_identity import RunIdentity, name_share, run_identity
from tracewhy.analyses.steps import StepsOptions, steps
from tracewhy.cli import main
from tracewhy.findings import thresholds as th
from tracewhy.findings.inputs_grouping import AS_RANKS, AS_RUNS, group

BASE = GENERATED / "cpu_slow_step_base.pt.trace.json.gz"
PLANTED = GENERATED / "cpu_slow_step_planted.pt.trace.json.gz"  # time.sleep(0.005) in every step
GLOO = [GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz" for r in (0, 1)]  # rank 1 sleeps 20 ms a step
PLANTED_SLEEP_MS = 5.0
RESNET = ("resnet50_nw0_span1_worker0.1623143089861", "resnet50_nw0_span2_worker0.1623143566756",
          "resnet50_nw4_span1_worker0.1623212756351", "resnet50_nw4_span2_worker0.1623213129365")


def _json(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, dict[str, Any]]:
    rc = main([*map(str, argv), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _text(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = main(list(map(str, argv)))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _payload(doc: dict[str, Any]) -> dict[str, Any]:
    """A document without its envelope (the fields every ``--json`` document has)."""
    return {k: v for k, v in doc.items() if k not in ("tool", "tool_version", "json_schema", "command", "warnings")}


def _raw(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _raw_step_median_ms(path: Path) -> float:
    """The median ProfilerStep duration, read from the raw JSON (all steps, warm-up included)."""
    return statistics.median(e["dur"] / 1000 for e in _raw(path)["traceEvents"]
                             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))


# --- the ranks of one job ------------------------------------------------------------------------

@pytest.mark.parametrize("order", [GLOO, GLOO[::-1]], ids=["in-order", "reversed"])
def test_gloo_ranks_diagnosed_as_one_job_led_by_the_straggler(capsys: pytest.CaptureFixture[str],
                                                              order: list[Path]) -> None:
    for path, rank in zip(GLOO, (0, 1), strict=True):  # what the grouping is decided from, read independently
        info = _raw(path)["distributedInfo"]
        assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", rank, 2)
    rc, doc = _json(capsys, "diagnose", *order)
    assert rc == 0
    assert doc["grouping"]["read_as"] == "ranks"
    assert "world size 2, backend gloo" in doc["grouping"]["reason"]
    assert [i["rank"] for i in doc["inputs"]] == [0, 1]
    assert doc["ranks"]["straggler"] == 1 and doc["pace_rank"] == 1  # the rank planted to sleep
    assert doc["comparison"] is None
    rc, ranks_doc = _json(capsys, "ranks", *GLOO, "--workers", "0")
    assert [f["code"] for f in doc["ranks"]["findings"]] == [f["code"] for f in ranks_doc["findings"]]
    assert "rank-straggler" in [f["code"] for f in doc["ranks"]["findings"]]
    for entry, path in zip(doc["inputs"], GLOO, strict=True):  # each rank's diagnosis is the one it has alone
        _, alone = _json(capsys, "diagnose", path)
        assert {k: v for k, v in entry.items() if k not in ("path", "rank")} == _payload(alone)

    rc, out, _ = _text(capsys, "diagnose", *order)
    assert rc == 0
    assert out.index("rank-straggler") < out.index("rank 1: ") < out.index("sets the pace")
    assert "the other ranks" in out and f"rank 0: {GLOO[0]}: step p50" in out


def test_hta_128_rank_pair_steps_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    paths = [shared_trace(f"hta/sampled_128rank_job_rank{r}.json.gz") for r in (0, 1)]
    info = [_raw(p)["distributedInfo"] for p in paths]
    assert [(i["rank"], i["world_size"]) for i in info] == [(0, 128), (1, 128)]
    rc, doc = _json(capsys, "steps", *paths)
    assert rc == 0 and doc["grouping"]["read_as"] == "ranks"
    assert f"world size 128, backend {info[0]['backend']}" in doc["grouping"]["reason"]
    for entry, path in zip(doc["inputs"], paths, strict=True):
        _, alone = _json(capsys, "steps", path)
        assert {k: v for k, v in entry.items() if k not in ("path", "rank")} == _payload(alone)
    rc, out, _ = _text(capsys, "steps", *paths)
    assert out.index(f"rank 0: {paths[0]}") < out.index(f"rank 1: {paths[1]}")
    assert out.count("steady window:") == 2


def test_gaps_of_ranks_each_under_its_heading(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _json(capsys, "gaps", *GLOO)
    assert rc == 0 and doc["grouping"]["read_as"] == "ranks" and doc["comparison"] is None
    for entry, path in zip(doc["inputs"], GLOO, strict=True):
        _, alone = _json(capsys, "gaps", path)
        assert {k: v for k, v in entry.items() if k not in ("path", "rank")} == _payload(alone)
    _, out, _ = _text(capsys, "gaps", *GLOO)
    assert out.index(f"rank 0: {GLOO[0]}") < out.index(f"rank 1: {GLOO[1]}")


def test_check_of_ranks_fails_when_any_rank_fails_and_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _json(capsys, "check", *GLOO, "--max-step-p50", "1s")
    assert rc == 0 and doc["passed"] and doc["failed"] == []
    # CPU-only traces: the GPU idle share is not measured, which fails the gate on every rank.
    rc, doc = _json(capsys, "check", *GLOO, "--max-gpu-idle", "20%")
    assert rc == 1 and not doc["passed"]
    assert doc["failed"] == [f"rank {r} ({p})" for r, p in zip((0, 1), GLOO, strict=True)]
    rc, out, _ = _text(capsys, "check", *GLOO, "--max-gpu-idle", "20%")
    assert rc == 1 and out.splitlines()[-1].startswith("check: 2 of 2 traces failed: rank 0 (")


def test_report_of_rank_files_is_the_ranks_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, doc = _json(capsys, "report", *GLOO)
    assert rc == 0
    assert doc["ranks"]["straggler"] == 1
    # The same as a directory of them (what tensorboard_trace_handler writes), which report read already.
    folder = tmp_path / "log"
    folder.mkdir()
    for p in GLOO:
        (folder / p.name).symlink_to(p)
    _, from_folder = _json(capsys, "report", folder)
    assert from_folder["ranks"]["straggler"] == 1
    assert from_folder["ranks"]["rows"] == doc["ranks"]["rows"]
    assert [f["code"] for f in from_folder["findings"]] == [f["code"] for f in doc["findings"]]
    _, diagnosed = _json(capsys, "diagnose", folder)
    assert diagnosed["grouping"]["read_as"] == "ranks" and diagnosed["pace_rank"] == 1


# --- runs of one program, and of different programs ----------------------------------------------

def test_planted_slowdown_is_compared_with_the_first_run(capsys: pytest.CaptureFixture[str]) -> None:
    raw_shift_ms = _raw_step_median_ms(PLANTED) - _raw_step_median_ms(BASE)
    assert abs(raw_shift_ms - PLANTED_SLEEP_MS) < 1.0  # the planted sleep, seen in the raw files
    rc, doc = _json(capsys, "diagnose", BASE, PLANTED)
    assert rc == 0 and doc["grouping"]["read_as"] == "runs" and doc["ranks"] is None
    c = doc["comparison"]
    assert c["compared"] and c["baseline"] == str(BASE)
    first, second = c["runs"]
    assert first["verdict"] is None and second["verdict"] == "slower"
    assert second["name_share"] >= th.SAME_PROGRAM_MIN_NAME_SHARE
    assert second["ci_low_ns"] <= second["shift_ns"] <= second["ci_high_ns"]
    assert abs(second["shift_ns"] / 1e6 - raw_shift_ms) < 1.0
    assert second["details"] == f"tracewhy diff {BASE} {PLANTED}"
    for run, path in zip(c["runs"], (BASE, PLANTED), strict=True):  # each run's p50 is its own steps' p50
        _, alone = _json(capsys, "steps", path)
        assert run["step_p50_ns"] == alone["stats"]["p50_ns"]
    _, out, _ = _text(capsys, "diagnose", BASE, PLANTED)
    assert out.index(f"1 of 2: {BASE}") < out.index(f"2 of 2: {PLANTED}") < out.index("compared with the first")
    assert "slower" in out and f"tracewhy diff {BASE} {PLANTED}" in " ".join(out.split())


def test_resnet50_captures_are_one_program(capsys: pytest.CaptureFixture[str]) -> None:
    paths = [shared_trace(f"kineto/{n}.pt.trace.json.gz") for n in RESNET]
    rc, doc = _json(capsys, "steps", *paths)
    assert rc == 0
    runs = doc["comparison"]["runs"]
    assert [r["path"] for r in runs] == [str(p) for p in paths]
    assert all(r["verdict"] is not None and r["name_share"] >= th.SAME_PROGRAM_MIN_NAME_SHARE for r in runs[1:])
    # Four DataLoader workers take the loading off the step: both nw4 captures step faster than nw0.
    nw0 = max(r["step_p50_ns"] for r in runs[:2])
    assert all(r["step_p50_ns"] < nw0 for r in runs[2:])
    assert runs[2]["verdict"] == "faster"


def test_traces_of_different_programs_get_no_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    a100 = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")
    cpu = GENERATED / "cpu_item_sync.pt.trace.json.gz"
    rc, doc = _json(capsys, "diagnose", a100, cpu)
    assert rc == 0 and doc["grouping"]["read_as"] == "runs"
    c = doc["comparison"]
    assert not c["compared"] and c["runs"][1]["verdict"] is None
    assert c["runs"][1]["name_share"] < th.SAME_PROGRAM_MIN_NAME_SHARE
    assert "a different program" in c["note"]
    _, out, _ = _text(capsys, "diagnose", a100, cpu)
    assert "no comparison" in out and "a different program" in out


def test_check_of_runs_names_the_run_that_failed(capsys: pytest.CaptureFixture[str]) -> None:
    limit_ms = (_raw_step_median_ms(BASE) + _raw_step_median_ms(PLANTED)) / 2
    rc, out, _ = _text(capsys, "check", BASE, PLANTED, "--max-step-p50", f"{limit_ms:.3f}ms")
    assert rc == 1
    assert out.splitlines()[-1] == f"check: 1 of 2 traces failed: {PLANTED}"


def test_report_of_runs_is_one_page(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, doc = _json(capsys, "report", BASE, PLANTED)
    assert rc == 0 and [i["path"] for i in doc["inputs"]] == [str(BASE), str(PLANTED)]
    assert doc["comparison"]["runs"][1]["verdict"] == "slower"
    _, alone = _json(capsys, "report", BASE)
    assert {k: v for k, v in doc["inputs"][0].items() if k not in ("path", "rank")} == _payload(alone)
    out = tmp_path / "r.html"
    assert main(["report", str(BASE), str(PLANTED), "-o", str(out)]) == 0
    html = out.read_text()
    assert html.count('<article class="run"') == 2
    # Only the page's own scripts run (by hash): uPlot, the comparison, and per part the part's
    # switch and the single report's code; the data block is the --json document.
    csp = re.search(r'script-src ([^;"]+)', html)
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    assert csp is not None and len(scripts) == 2 + 2 * 2
    hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'" for s in scripts}
    assert set(csp.group(1).split()) == hashes
    block = re.search(r'<script type="application/json" id="runs-data">(.*?)</script>', html, flags=re.S)
    assert block is not None and _payload(json.loads(block.group(1))) == _payload(doc)


# --- how traces are grouped ------------------------------------------------------------------------

def _identity(path: str, rank: int | None, world: int | None = 2, backend: str | None = "nccl",
              steps: frozenset[int] = frozenset({1, 2, 3})) -> RunIdentity:
    return RunIdentity(path, "kineto", rank, world, backend, "ProfilerStep", len(steps), steps, frozenset({"aten::mm"}))


@pytest.mark.parametrize(("identities", "read_as", "why"), [
    ((_identity("a", 0), _identity("b", 1)), AS_RANKS, "ranks 0, 1 of one job"),
    ((_identity("a", 0), _identity("b", 0)), AS_RUNS, "rank 0 twice"),
    ((_identity("a", 0), _identity("b", 1, world=4)), AS_RUNS, "world sizes differ"),
    ((_identity("a", 0), _identity("b", 1, backend="gloo")), AS_RUNS, "backends differ"),
    ((_identity("a", 0), _identity("b", 1, steps=frozenset({7, 8}))), AS_RUNS, "no step number in common"),
    ((_identity("a", 0, world=1), _identity("b", 0, world=1)), AS_RUNS, "a world size of 1"),
    ((_identity("a", None, None, None), _identity("b", None, None, None)), AS_RUNS, "no rank metadata"),
])
def test_ranks_of_one_job_from_their_metadata(identities: tuple[RunIdentity, ...], read_as: str, why: str) -> None:
    g = group(identities)
    assert g.read_as == read_as and why in g.reason


def test_name_share_threshold_lies_between_runs_and_programs() -> None:
    """The threshold's reason, held on the real traces it was measured on: one model on an A100
    and on a V100 (different kernels) is still one program; HTA's A100 DDP job and its V100 DDP
    job with profile_memory, different models, are not."""
    def identity(relative: str) -> RunIdentity:
        t = tracewhy.load(shared_trace(relative))
        return run_identity(t, steps(t, StepsOptions()))

    one_model = name_share(identity("hta/tracediff_control_a100_rank3of8.json.gz"),
                           identity("hta/tracediff_test_v100_rank1of2.json.gz"))
    two_models = name_share(identity("hta/a100_ddp2_rank0_nccl2.17.json.gz"),
                            identity("hta/v100_ddp2_rank1_memprofile.json.gz"))
    assert two_models + 0.1 < th.SAME_PROGRAM_MIN_NAME_SHARE < one_model - 0.1
