"""``tracewhy diff``: the shift estimate and its interval, the verdict, the deltas, comparability.

Expected values come from hand computation (small samples written out), from SciPy's exact
Mann-Whitney test (an independent implementation of the same null distribution), from the raw
JSON of the real traces, and from what was planted in the generated CPU runs.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import msgspec
import numpy as np
import pytest
import scipy.stats

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from tracewhy.analyses.diff import DiffOptions, diff
from tracewhy.analyses.shift import hodges_lehmann
from tracewhy.cli import main
from tracewhy.findings.compare import FASTER, NOT_MEASURED, SLOWER, WITHIN_NOISE, judge
from tracewhy.findings.model import Finding, Severity
from tracewhy.readers import read_trace
from tracewhy.reports.diff import compare

BASE = GENERATED / "cpu_slow_step_base.pt.trace.json.gz"
PLANTED = GENERATED / "cpu_slow_step_planted.pt.trace.json.gz"
SAME_CODE = GENERATED / "cpu_eager_schedule.pt.trace.json.gz"  # the same loop as BASE, another run
HTA_A = "hta/tracediff_control_a100_rank3of8.json.gz"
HTA_B = "hta/tracediff_test_v100_rank1of2.json.gz"


class _Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0


class _Doc(msgspec.Struct):
    traceEvents: list[_Event]


def _raw_step_durations_ns(path: Path) -> list[int]:
    """ProfilerStep#N durations straight from the JSON (us -> ns), in time order; a plain
    msgspec decode of four fields, independent of tracewhy's reader."""
    with gzip.open(path) as f:
        events = msgspec.json.decode(f.read(), type=_Doc).traceEvents
    steps = sorted((e.ts, e.dur) for e in events if e.ph == "X" and re.fullmatch(r"ProfilerStep#\d+", e.name))
    return [round(dur * 1000) for _, dur in steps]


# --- the estimator -------------------------------------------------------------------------


def test_hodges_lehmann_by_hand() -> None:
    # b - a over all 25 pairs is 10 + (j - i): 6 once, 7 twice, ... 10 five times, ... 14 once.
    # Median 10. For 5 vs 5, P(U <= 2) = 4/252 <= 0.025 < P(U <= 3) = 7/252, so the 95%
    # interval is [D(3), D(23)] = [7, 13] with coverage 1 - 8/252; U = 25 gives p = 2/252.
    s = hodges_lehmann([1, 2, 3, 4, 5], [11, 12, 13, 14, 15], 0.95)
    assert s.hl_shift_ns == 10
    assert (s.ci_low_ns, s.ci_high_ns) == (7, 13)
    assert s.confidence == pytest.approx(1 - 8 / 252)
    assert s.p_value == pytest.approx(2 / 252)
    assert s.median_change_ns == 10


@pytest.mark.parametrize(("n", "m", "seed"), [(4, 9, 0), (5, 5, 1), (7, 12, 2), (20, 25, 3)])
def test_interval_inverts_scipys_exact_test(n: int, m: int, seed: int) -> None:
    """The Moses interval is the set of shifts d that the exact test of (b - d) vs a does not
    reject: just outside each end SciPy's p-value is <= 1 - coverage, just inside it is larger."""
    rng = np.random.default_rng(seed)
    a = rng.lognormal(0.0, 0.3, n) * 100
    b = rng.lognormal(0.2, 0.3, m) * 100
    s = hodges_lehmann(a, b, 0.95)
    assert s.ci_low_ns is not None and s.ci_high_ns is not None
    level = 1 - s.confidence

    def p(d: float) -> float:
        return float(scipy.stats.mannwhitneyu(b - d, a, method="exact").pvalue)

    eps = 1e-6
    assert p(s.ci_low_ns - eps) <= level + 1e-12 < p(s.ci_low_ns + eps)
    assert p(s.ci_high_ns + eps) <= level + 1e-12 < p(s.ci_high_ns - eps)
    assert s.p_value == pytest.approx(float(scipy.stats.mannwhitneyu(b, a, method="exact").pvalue))
    assert s.confidence >= 0.95


def test_too_few_steps_give_no_interval_and_within_noise() -> None:
    # 3 vs 3: the smallest two-sided exact p-value is 2/20 = 0.1, so no 95% interval exists.
    s = hodges_lehmann([1, 2, 3], [10, 11, 12])
    assert s.ci_low_ns is None and s.p_value == pytest.approx(0.1)


# --- real runs -------------------------------------------------------------------------------


def test_planted_5ms_sleep_is_slower_by_about_5ms() -> None:
    c = compare(read_trace(BASE), read_trace(PLANTED))
    assert c.verdict == SLOWER and c.comparable
    # The steady steps are the ProfilerStep spans exactly as in the JSON. Both captures start at
    # ProfilerStep#2 (schedule wait=1, warmup=1), so no step is warm-up by position; BASE's first
    # step took 3.1 times the median of the others (16 MADs above it): that one is left out.
    base, planted_raw = _raw_step_durations_ns(BASE), _raw_step_durations_ns(PLANTED)
    assert base[0] > 3 * sorted(base[1:])[len(base[1:]) // 2]
    assert c.diff.a_step_durations_ns == base[1:]
    assert c.diff.b_step_durations_ns == planted_raw
    s = c.diff.steps
    assert s is not None and s.ci_low_ns is not None
    # time.sleep(0.005) sleeps at least 5 ms and, on an idle-ish machine, well under 6 ms.
    assert 4.5e6 < s.hl_shift_ns < 6.5e6 and s.ci_low_ns > 0
    planted = c.diff.annotations.row(0, named=True)  # largest change first
    assert planted["name"] == "planted_slowdown"
    assert planted["a_calls_per_step"] == 0 and planted["b_calls_per_step"] == 1
    assert 5.0e6 <= planted["b_ns_per_step"] < 6.5e6
    assert "B is slower" in c.statement


def test_same_code_twice_is_within_noise() -> None:
    # cpu_eager_schedule and cpu_slow_step_base run the same _scheduled_loop (MANIFEST.md),
    # captured at different times: nothing to find.
    c = compare(read_trace(SAME_CODE), read_trace(BASE))
    assert c.verdict == WITHIN_NOISE and c.comparable
    same = compare(read_trace(BASE), read_trace(BASE))
    assert same.verdict == WITHIN_NOISE
    assert same.diff.steps is not None and same.diff.steps.hl_shift_ns == 0
    assert same.diff.ops.get_column("delta_ns_per_step").abs().max() == 0


def test_hta_trace_diff_pair_is_slower_and_not_comparable() -> None:
    """One might expect "within noise" here; the data say otherwise, for two reasons.

    1. Every one of B's 6 steady steps (82-166 ms) is longer than every one of A's (75-81 ms),
       read straight from the JSON below. With no overlap at all the Mann-Whitney U is 36 of 36
       and the exact two-sided p-value is 2/924 = 0.002: no sound test calls that noise (a
       bootstrap of the medians agrees: every resampled B median exceeds every A median). All
       six are steady in both: the captures start at step 1009, far into the run, and no first
       step stands out from the others.
    2. They are not two runs of one job on one machine: A is rank 3 of 8 on A100s, B rank 1 of
       2 on V100s (deviceProperties, distributedInfo). A V100 is slower than an A100, so
       "slower" is the expected outcome, and diff must say the runs are not comparable.
    """
    a_raw = _raw_step_durations_ns(shared_trace(HTA_A))
    b_raw = _raw_step_durations_ns(shared_trace(HTA_B))
    assert min(b_raw) > max(a_raw)
    c = compare(read_trace(shared_trace(HTA_A)), read_trace(shared_trace(HTA_B)))
    assert c.diff.a_step_durations_ns == a_raw and c.diff.b_step_durations_ns == b_raw
    assert c.verdict == SLOWER
    assert c.diff.steps is not None and c.diff.steps.p_value == pytest.approx(2 / 924)
    assert not c.comparable
    reasons = " ".join(c.not_comparable_because)
    assert "8 x NVIDIA A100-PG509-200" in reasons and "2 x Tesla V100-SXM2-16GB" in reasons
    assert "world_size: 8 (A) vs 2 (B)" in reasons
    assert any(r.startswith("rank: 3 (A) vs 1 (B)") for r in c.caveats)
    # Both are diagnosed: B replays CUDA graphs (MANIFEST.md: graph_launches 12 in B, 0 in A),
    # so the finding about graph replay appears in B and not in A.
    assert c.findings_compared
    assert "cuda-graph-replay" in {f.code for f in c.findings_appeared}
    assert "cuda-graph-replay" not in {f.code for f in c.findings_disappeared}


def test_heavy_capture_options_make_runs_not_comparable() -> None:
    # cpu_with_stack_memory adds with_stack and profile_memory to the same loop (MANIFEST.md).
    c = compare(read_trace(SAME_CODE), read_trace(GENERATED / "cpu_with_stack_memory.pt.trace.json.gz"))
    assert not c.comparable
    whats = {r.split(":")[0] for r in c.not_comparable_because}
    assert {"capture.with_stack", "capture.profile_memory"} <= whats
    assert any(r.startswith("capture.with_flops") for r in c.caveats)


# --- deltas, exactly, on tiny traces -----------------------------------------------------------


def _run(tmp_path: Path, name: str, extra_kernel_us: float | None, step_us: float) -> Path:
    """Three steps; each launches k1 (10 us) and optionally k2; step spans step_us."""
    b = KinetoBuilder()
    for i in range(3):
        t0 = i * 1000.0
        b.annotation(f"ProfilerStep#{i}", t0, step_us)
        b.op("aten::mm", t0 + 1, 20)
        b.launch("k1", t0 + 2, 5, t0 + 30, 10)
        if extra_kernel_us is not None:
            b.launch("k2", t0 + 10, 5, t0 + 50, extra_kernel_us)
    return b.write(tmp_path / name)


def test_kernel_and_op_deltas_per_step(tmp_path: Path) -> None:
    a = read_trace(_run(tmp_path, "a.json", None, 100))
    b = read_trace(_run(tmp_path, "b.json", 5, 100))
    d = diff(a, b, DiffOptions(warmup=0))
    k = {r["name"]: r for r in d.kernels.iter_rows(named=True)}
    assert list(k) == ["k2", "k1"]  # largest change first
    assert (k["k2"]["a_ns_per_step"], k["k2"]["b_ns_per_step"], k["k2"]["delta_ns_per_step"]) == (0, 5000, 5000)
    assert (k["k1"]["a_calls_per_step"], k["k1"]["b_calls_per_step"], k["k1"]["delta_ns_per_step"]) == (1, 1, 0)
    ops = {r["name"]: r for r in d.ops.iter_rows(named=True)}
    assert ops["aten::mm"]["a_ns_per_step"] == ops["aten::mm"]["b_ns_per_step"] == 20_000
    # The 3-step runs have identical step spans: no shift at all.
    assert d.steps is not None and d.steps.hl_shift_ns == 0


def test_no_steps_compares_totals(tmp_path: Path) -> None:
    """No steps on either side: no per-step verdict (steps is None); the captures' totals decide
    (the real pair is in tests/test_diff_totals.py)."""
    b = KinetoBuilder().op("aten::mm", 0, 10)
    t = read_trace(b.write(tmp_path / "nosteps.json"))
    c = compare(t, t)
    assert c.diff.steps is None and c.verdict == WITHIN_NOISE and c.relative_change == 0
    assert "CPU op self time 10.0 µs -> 10.0 µs" in c.statement
    empty = read_trace(KinetoBuilder().annotation("setup", 0, 10).write(tmp_path / "nothing.json"))
    assert compare(empty, empty).verdict == NOT_MEASURED


def test_small_but_certain_shift_is_within_noise_and_large_one_is_faster(tmp_path: Path) -> None:
    a = [100_000 + i for i in range(10)]
    tiny = [v - 1_000 for v in a]  # 1% faster, every step: significant, but under the 2% floor
    big = [v - 10_000 for v in a]  # 10% faster
    base = diff(read_trace(_run(tmp_path, "a.json", None, 100)), read_trace(_run(tmp_path, "b.json", None, 100)))
    for durations, expected in ((tiny, WITHIN_NOISE), (big, FASTER)):
        shifted = type(base)(**{**base.__dict__, "steps": hodges_lehmann(a, durations),
                                "a_step_durations_ns": a, "b_step_durations_ns": durations})
        assert judge(shifted).verdict == expected


def test_findings_that_appeared_and_disappeared() -> None:
    t = read_trace(BASE)
    d = diff(t, t)
    idle = Finding("gpu-idle-dataloader", Severity.HIGH, "GPU idle 31%", "tracewhy gaps")
    sync = Finding("host-sync-item", Severity.MEDIUM, ".item() every step", "remove .item()")
    spikes = Finding("p99-spikes", Severity.LOW, "p99 3x p50", "tracewhy steps")
    c = judge(d, findings_a=[idle, spikes], findings_b=[sync, spikes])
    assert c.findings_compared
    assert [f.code for f in c.findings_appeared] == ["host-sync-item"]
    assert [f.code for f in c.findings_disappeared] == ["gpu-idle-dataloader"]
    assert not judge(d).findings_compared


def test_cli_diff_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "--json", str(BASE), str(PLANTED)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "diff" and doc["verdict"] == "slower" and doc["comparable"] is True
    assert doc["annotations"][0]["name"] == "planted_slowdown"
    assert doc["steps"]["ci_low_ns"] > 0
    assert set(doc["findings"]) == {"compared", "appeared", "disappeared"}
    assert main(["diff", str(BASE), str(PLANTED)]) == 0
    out = capsys.readouterr().out
    assert "B is slower" in out and "planted_slowdown" in out
