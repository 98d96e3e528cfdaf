"""Which tool answers which question, and the exact command that captures what it needs.

One table, used by ``tracewhy which`` and by findings' next steps, so a symptom and a finding
point at the same capture. The capture commands follow the tools' documentation: Nsight
Systems (``nsys profile`` with ``--capture-range=cudaProfilerApi`` so only the steps between
``torch.cuda.profiler.start()``/``stop()`` are recorded, ``%q{RANK}`` to name one report per
rank), Nsight Compute (``--set full`` for the roofline and stall sections, one launch of one
kernel so the replay overhead stays bounded), the PyTorch profiler's light options (the seeds'
overhead table: ``with_stack`` and ``profile_memory`` add 30-80% to CPU time) and TORCH_LOGS.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tracewhy.findings.codes import Code


def nsys_command(cmd: Sequence[str], name: str = "run") -> list[str]:
    """``nsys profile`` for CUDA, NVTX and OS runtime calls, one report per rank."""
    return ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", f"--output={name}_%q{{RANK}}", "--force-overwrite=true", *cmd]


def nsys_export_command(report: str) -> list[str]:
    """The SQLite export tracewhy reads (``nsys export`` writes ``<report>.sqlite``)."""
    return ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true", "--output",
            report.removesuffix(".nsys-rep") + ".sqlite", report]


def ncu_command(cmd: Sequence[str], kernel: str, launch_skip: int = 0, name: str = "kernel") -> list[str]:
    """``ncu`` on one launch of the kernels whose name matches ``kernel`` (a regex), every section."""
    return ["ncu", "--set", "full", "--target-processes", "all", "--kernel-name", f"regex:{kernel}",
            "--launch-skip", str(launch_skip), "--launch-count", "1", "-o", name, *cmd]


def shell(cmd: Sequence[str]) -> str:
    return shlex.join(cmd)


#: The PyTorch profiler capture with the light options, as ``tracewhy.capture.profile`` runs it.
TORCH_PROFILE: Final = (
    "with tracewhy.capture.profile('traces', steps=5) as prof:  # wait=1, warmup=1, active=5; no stack/memory\n"
    "    for batch in loader: train_step(batch); prof.step()"
)


@dataclass(frozen=True)
class Answer:
    """What to run for a symptom: the tool, the capture, and what to look for in the result."""

    symptom: str
    keywords: tuple[str, ...]
    tool: str
    capture: str
    look_for: str


_TRAIN: Final = ["python", "train.py"]

PLAYBOOK: Final[tuple[Answer, ...]] = (
    Answer("which line or op is slow", ("line", "lines", "op", "ops", "operator", "source", "code"),
           "torch.profiler (Kineto trace)", TORCH_PROFILE + "\ntracewhy ops traces/*.json.gz; tracewhy diagnose ...",
           "ops and blocks by GPU and CPU time per step; rerun one short capture with with_stack=True for lines"),
    Answer("where are the GPU's idle gaps", ("gap", "gaps", "idle", "utilization", "util", "bubble"),
           "Nsight Systems (or torch.profiler)", shell(nsys_command(_TRAIN)),
           "tracewhy gaps REPORT.sqlite: each gap's class and what the launching thread was doing"),
    Answer("GPU utilization under 80%", ("low", "80", "starved", "underutilized"),
           "torch.profiler, then Nsight Systems", TORCH_PROFILE,
           "tracewhy diagnose: gpu-idle-* findings say whether input, syncs, launches or host code starve the GPU"),
    Answer("CPU time about equal to CUDA time (launch-bound)", ("launch", "cpu", "overhead", "small", "kernels"),
           "torch.profiler", TORCH_PROFILE,
           "gpu-idle-launch: kernels shorter than their launch calls; try CUDA graphs or torch.compile"),
    Answer("why is this kernel slow", ("kernel", "roofline", "stall", "occupancy", "bound"),
           "Nsight Compute", shell(ncu_command(_TRAIN, "NAME")),
           "tracewhy roofline kernel.ncu-rep: bound, achieved vs peak, top stall reasons and rules"),
    Answer("one rank is slower than the others", ("rank", "straggler", "distributed", "ddp", "nccl", "imbalance"),
           "torch.profiler on every rank", TORCH_PROFILE + "  # one trace per rank",
           "tracewhy ranks TRACES_DIR: the straggler by who waits for whom, and what it did meanwhile"),
    Answer("is communication hidden under compute", ("overlap", "communication", "comm", "allreduce", "exposed"),
           "torch.profiler or Nsight Systems", TORCH_PROFILE,
           "tracewhy overlap TRACE: exposed communication per step and per collective"),
    Answer("memory grows or runs out (OOM)", ("memory", "oom", "leak", "grows", "fragmentation", "peak"),
           "torch.profiler with profile_memory, or a memory snapshot",
           "torch.cuda.memory._record_memory_history(); ...; torch.cuda.memory._dump_snapshot('snap.pickle')",
           "tracewhy memory snap.pickle: the peak, what it consists of, fragmentation"),
    Answer("step time spikes", ("spike", "spikes", "jitter", "p99", "variance"),
           "torch.profiler over more steps", TORCH_PROFILE.replace("steps=5", "steps=20"),
           "tracewhy steps TRACE: p50/p90/p99; step-time-spikes names what the slow steps held"),
    Answer("torch.compile is slow or recompiles",
           ("compile", "graph", "break", "breaks", str(Code.RECOMPILE), "dynamo"),
           "TORCH_LOGS and torch.profiler", "TORCH_LOGS=graph_breaks,recompiles python train.py 2> torch_logs.txt",
           "tracewhy compile TRACE --logs torch_logs.txt: breaks per step with their lines, recompiles and guards"),
    Answer("do pipeline stages overlap", ("pipeline", "stage", "stages", "overlapscore", "period"),
           "tracewhy.instrument StageClock", "clock = tracewhy.instrument.StageClock(); clock.mark('tA0', chunk=k) ...",
           "tracewhy pipeline LOGS: period vs stages, OverlapScore >= 0.30 after warm-up"),
    Answer("what changed between two runs", ("diff", "regression", "changed", "compare", "slower", "faster"),
           "the same capture in both runs", TORCH_PROFILE,
           "tracewhy diff A B: faster, slower or within noise, and which ops and kernels moved"),
)


#: Words a question is made of that name no symptom.
_STOP_WORDS: Final = frozenset({
    "a", "an", "and", "are", "as", "at", "do", "does", "how", "i", "in", "is", "it", "its", "my", "of", "on", "or",
    "slow", "so", "than", "that", "the", "this", "to", "too", "very", "what", "when", "where", "which", "who", "why",
    "with",
})


def answers(words: Sequence[str]) -> list[Answer]:
    """The playbook rows whose keywords the words mention, best match first; all rows when none."""
    wanted = {w.lower().strip(".,?!'\"") for phrase in words for w in phrase.split()} - _STOP_WORDS
    if not wanted:
        return list(PLAYBOOK)
    scored = [(len(wanted & set(a.keywords)), i, a) for i, a in enumerate(PLAYBOOK)]
    hits = [(s, i, a) for s, i, a in scored if s]
    return [a for _, _, a in sorted(hits, key=lambda t: (-t[0], t[1]))]
