"""Advice that fits the platform and the program: no GPU advice on a CPU-only run, no TF32/BF16
on GPUs without them, no NCCL where NCCL does not run, no PyTorch advice for a program that is
not PyTorch, and DataLoader advice that knows whether workers already run. Each case is checked
against what the raw file holds (its header, its SQLite string table), not against tracewhy."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import tracewhy
from builders import KinetoBuilder
from conftest import GENERATED, checked_report, shared_trace
from tracewhy.findings.applicability import facts_of
from tracewhy.findings.input_advice import loader_advice
from tracewhy.reports.diagnose import diagnose
from tracewhy.reports.ranks import ranks_report

#: Advice that only a run with an (NVIDIA/AMD) GPU can act on.
GPU_ADVICE = ("ProfilerActivity.CUDA", "allow_tf32", "bfloat16", "TF32", "BF16", "expandable_segments",
              "PYTORCH_CUDA_ALLOC_CONF", "pin_memory", "clocks", "torch.cuda", "autocast('cuda'", "Nsight")
#: Advice that names PyTorch's API.
PYTORCH_ADVICE = ("DataLoader", "pin_memory", "tensor.", "torch", "PYTORCH_CUDA_ALLOC_CONF", "non_blocking")

CPU_ONLY = ("hta/cpu_only_gloo_rank34of300.json.gz", "hta/edge_cpu_ops_only_no_deviceprops_rank0.json.gz")
CPU_GENERATED = ("cpu_dataloader_slow.pt.trace.json.gz", "cpu_dataloader_few_workers.pt.trace.json.gz",
                 "cpu_adam_memory.pt.trace.json.gz", "cpu_item_sync.pt.trace.json.gz",
                 "cpu_with_stack_memory.pt.trace.json.gz", "ddp_gloo_rank1.pt.trace.json.gz",
                 "cpu_lines_loop.pt.trace.json.gz", "cpu_slow_step_planted.pt.trace.json.gz")
V100 = ("hta/tracediff_test_v100_rank1of2.json.gz", "hta/v100_ddp2_rank1_memprofile.json.gz",
        "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz")
SAXPY = "nsys/pipit_saxpy_mpi_cuda_a100_2022.2.sqlite.gz"
NW4 = "kineto/resnet50_nw4_span1_worker0.1623212756351.pt.trace.json.gz"
NW0 = "kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz"


def _header(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rb") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _texts(path: Path) -> dict[str, str]:
    """Each finding's statement and next step, by code."""
    return {f.code: f"{f.statement} || {f.next_step}" for f in checked_report(path).findings}


def _advising(texts: dict[str, str], words: tuple[str, ...]) -> dict[str, list[str]]:
    return {code: hits for code, text in texts.items() if (hits := [w for w in words if w in text])}


@pytest.mark.parametrize("path", [*CPU_ONLY, *(f"generated:{n}" for n in CPU_GENERATED)])
def test_a_cpu_only_run_gets_no_gpu_advice(path: str) -> None:
    file = GENERATED / path.split(":", 1)[1] if path.startswith("generated:") else shared_trace(path)
    doc = _header(file)
    # The raw file: no device described, no device-side event of any kind.
    assert not doc.get("deviceProperties")
    device_cats = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver"}
    assert not device_cats & {e.get("cat") for e in doc["traceEvents"]}
    texts = _texts(file)
    assert _advising(texts, GPU_ADVICE) == {}
    # No next step speaks of the GPU at all (host work "beside the GPU work" has none to hide under).
    assert [f.code for f in checked_report(file).findings if "GPU" in f.next_step] == []
    assert "CPU-only capture" in texts["cpu-only-trace"]
    assert "no GPU advice" in texts["cpu-only-trace"]


def test_a_gpu_run_captured_without_device_activity_is_told_how_to_record_it() -> None:
    # The contrast: this capture has no device activity but its header describes eight A100s.
    path = shared_trace("hta/edge_no_distributedinfo_a100_cpu_ops_only.json.gz")
    assert len(_header(path)["deviceProperties"]) == 8
    assert "ProfilerActivity.CUDA" in _texts(path)["cpu-only-trace"]


@pytest.mark.parametrize("path", V100)
def test_volta_gets_no_tf32_or_bf16_advice(path: str) -> None:
    file = shared_trace(path)
    # The header: every GPU is compute capability 7.0 (Volta), which has FP16 tensor cores only.
    assert {(d["computeMajor"], d["computeMinor"]) for d in _header(file)["deviceProperties"]} == {(7, 0)}
    assert facts_of(tracewhy.load(file)).tf32_bf16 is False
    texts = _texts(file)
    for text in texts.values():
        for advice in ("allow_tf32", "bfloat16", "dtype=torch.bfloat16", "tensorfloat32", "CUBLAS_TF32"):
            assert advice not in text
    if "tensor-cores-unused" in texts:
        assert "float16" in texts["tensor-cores-unused"]


def _gpu_job(tmp_path: Path, world_size: int) -> Path:
    """One kernel a step on an NVIDIA GPU, collectives configured on gloo in a world of ``world_size``."""
    b = KinetoBuilder()
    b.header["distributedInfo"] = {"backend": "gloo", "rank": 0, "world_size": world_size}
    b.header["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-40GB", "computeMajor": 8,
                                     "computeMinor": 0, "totalGlobalMem": 40 << 30}]
    for i in range(4):
        b.annotation(f"ProfilerStep#{i}", i * 1000.0, 1000.0)
        b.launch("volta_sgemm_128x64_nn", i * 1000.0 + 10, 5.0, i * 1000.0 + 20, 900.0)
    return b.write(tmp_path / f"gloo_world{world_size}.json")


def test_no_nccl_advice_in_a_world_of_one(tmp_path: Path) -> None:
    assert "slow-comm-backend" not in _texts(_gpu_job(tmp_path, 1))
    # The contrast: two ranks on gloo with GPUs are told to use NCCL.
    assert "backend='nccl'" in _texts(_gpu_job(tmp_path, 2))["slow-comm-backend"]


def test_no_nccl_advice_on_mtia(tmp_path: Path) -> None:
    """The same two-rank gloo job on an MTIA device (the categories Kineto writes for MTIA, as
    tests/test_accelerators.py cites them): MTIA's collectives are its own, not NCCL."""
    b = KinetoBuilder()
    b.header["distributedInfo"] = {"backend": "gloo", "rank": 0, "world_size": 2}
    for i in range(4):
        b.annotation(f"ProfilerStep#{i}", i * 1000.0, 1000.0)
        b.launch("mtia::gemm", i * 1000.0 + 10, 5.0, i * 1000.0 + 20, 900.0, api="mtiaLaunchKernel")
    for e in b.events:
        e["cat"] = {"cuda_runtime": "mtia_runtime", "kernel": "mtia_ccp_events"}.get(e["cat"], e["cat"])
    trace = tracewhy.load(b.write(tmp_path / "mtia_gloo.json"))
    assert trace.meta.accelerator == "MTIA"
    texts = {f.code: f"{f.statement} || {f.next_step}" for f in diagnose(trace).findings}
    assert "slow-comm-backend" not in texts
    assert not [t for t in texts.values() if "nccl" in t.lower()]
    # Nor CUDA's tensor-core advice: MTIA has neither TF32 nor autocast('cuda').
    assert _advising(texts, ("allow_tf32", "autocast('cuda'", "tensor cores")) == {}


def test_a_cpu_only_straggler_is_not_told_to_check_gpu_clocks() -> None:
    paths = [GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz" for r in (0, 1)]
    assert all(not _header(p).get("deviceProperties") for p in paths)
    found = {f.code: f for f in ranks_report([str(p) for p in paths], workers=1).findings}
    assert "rank-straggler" in found
    assert "clocks" not in found["rank-straggler"].next_step


def test_a_program_that_is_not_pytorch_gets_no_pytorch_advice(tmp_path: Path) -> None:
    path = shared_trace(SAXPY)
    plain = tmp_path / "saxpy.sqlite"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    # The export's own string table: no PyTorch op, range or source file anywhere in the capture.
    with sqlite3.connect(f"file:{plain}?mode=ro", uri=True) as db:
        strings = [s for (s,) in db.execute("SELECT value FROM StringIds")]
    assert strings and not [s for s in strings if "aten::" in s or "torch" in s.lower()]
    facts = facts_of(tracewhy.load(path))
    assert facts.pytorch is False
    texts = _texts(path)
    assert {"pageable-memcpy", "allocator-in-steady-state"} <= texts.keys()
    assert _advising(texts, PYTORCH_ADVICE) == {}
    assert "cudaMemcpyAsync" in texts["pageable-memcpy"]
    # The contrast: a PyTorch capture keeps PyTorch's calls.
    assert "DataLoader(pin_memory=True)" in _texts(shared_trace(NW0))["pageable-memcpy"]


def test_dataloader_workers_are_read_from_the_trace() -> None:
    # The MANIFEST's names: the nw4 capture ran DataLoader(num_workers=4), the nw0 one num_workers=0.
    assert facts_of(tracewhy.load(shared_trace(NW4))).loader_workers is True
    assert facts_of(tracewhy.load(shared_trace(NW0))).loader_workers is False
    assert facts_of(tracewhy.load(GENERATED / "cpu_dataloader_few_workers.pt.trace.json.gz")).loader_workers is True
    assert facts_of(tracewhy.load(GENERATED / "cpu_dataloader_slow.pt.trace.json.gz")).loader_workers is False


def test_workers_on_and_still_waiting_is_per_batch_work_not_turn_on_workers() -> None:
    """cpu_dataloader_few_workers: two workers, each with about 32 ms of work per batch (16 items
    sleeping 2 ms), feed a step that computes for about 2 ms: the main process waits."""
    # The generator's planted figures (scripts/gen_traces/dataloader_traces.py), as its manifest says.
    few_workers, per_batch_s = 2, 0.032
    manifest = (GENERATED / "MANIFEST.md").read_text(encoding="utf-8")
    assert f"about {per_batch_s * 1e3:g} ms of per-batch work) behind DataLoader(num_workers={few_workers})" in manifest
    report = checked_report(GENERATED / "cpu_dataloader_few_workers.pt.trace.json.gz")
    f = next(f for f in report.findings if f.code == "input-bound")
    assert "per-batch work" in f.next_step
    assert "Load batches in worker processes" not in f.next_step
    assert "pin_memory" not in f.next_step  # a CPU-only run
    # The sizing against the plant: workers needed = per-batch work / the step's own compute,
    # the compute taken from the same loop without the sleep (cpu_dataloader_fast).
    fast = checked_report(GENERATED / "cpu_dataloader_fast.pt.trace.json.gz")
    compute_ns = next(x for x in fast.findings if x.code == "input-bound").evidence
    step_compute_ns = compute_ns["mean_window_ns"] - compute_ns["mean_dataloader_ns_per_step"]
    needed = per_batch_s * 1e9 / step_compute_ns
    advised = few_workers * f.evidence["worker_scale"]
    assert 0.5 <= advised / needed <= 1.5


def test_nw4_is_never_told_to_turn_on_workers() -> None:
    facts = facts_of(tracewhy.load(shared_trace(NW4)))
    assert "Load batches in worker processes" not in " ".join(_texts(shared_trace(NW4)).values())
    advice = loader_advice(facts, wait_ns=1.3e6, window_ns=124e6)
    assert "per-batch work" in advice and "Load batches in worker processes" not in advice
    # The contrast: the nw0 capture, whose main process loads every batch, is told to turn them on.
    assert "Load batches in worker processes" in _texts(shared_trace(NW0))["gpu-idle-input"]
