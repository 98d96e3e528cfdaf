"""Every command's output, byte for byte, on a few inputs that cover every input format and every
payload shape: a SHA-256 per output, compared with tests/data/golden/digests.txt. A change that
alters an output fails here with the outputs it changed named; when the change is meant,
``TRACEWHY_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`` rewrites the digests (look at
what changed first: ``python scripts/golden.py write DIR --only NAME`` writes the outputs).

The runs are ``scripts/golden.py``'s (its command lists, each output recorded with its exit code,
stdout, stderr and the files it wrote), on a subset small enough for CI. They run in a folder of
their own where the inputs are reached by relative paths (``shared/`` and ``gen/`` are links to
the shared traces and to tests/data/generated): a table is as wide as the paths it shows, so
absolute paths would make the digests depend on where the checkout lies.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
from pathlib import Path
from types import ModuleType

import pytest

from conftest import GENERATED, ROOT, shared_trace
from test_memory import build_snapshot
from tracewhy.cli.commands import COMMAND_MODULES

pytestmark = pytest.mark.slow

DIGESTS = ROOT / "tests" / "data" / "golden" / "digests.txt"
UPDATE = "TRACEWHY_UPDATE_GOLDEN"

#: Inputs every command runs on (those ``info`` reads get the trace commands, the others the
#: commands of other inputs, as scripts/golden.py does), relative to the run's folder.
INPUTS: tuple[str, ...] = (
    "shared/hta/tracecompare_tiny_base_rank1.json.gz",  # Kineto, GPU, steps
    "shared/hta/gp100_step_sync_gpu_user_annotation_2023.json.gz",  # Kineto, GPU: annotated blocks, syncs
    "shared/tracelens/h100_bert-small_bs1_seq512.json.gz",  # Kineto with input shapes: the op roofline
    "shared/nsys/nsysai_mock_rtx3080.sqlite.gz",  # Nsight Systems export
    "shared/ncu/csv_rtx5070_olajide/saxpy.csv",  # Nsight Compute CSV, one run
    "shared/ncu/a100pcie_mistic_searchkernel_ncu2020.ncu-rep",  # Nsight Compute report
    "gen/cpu_adam_memory.pt.trace.json.gz",  # CPU-only, profile_memory
    "gen/cpu_compile_break_item.pt.trace.json.gz",  # torch.compile with a graph break
    "gen/memory_timeline/cpu_adam_memory_timeline.json.gz",  # memory-timeline export
    "gen/pipeline/d1",  # instrument logs (a directory of rank logs)
    "ncu_runs.csv",  # two real ncu CSV exports appended into one file: shown run by run
    "snapshot.pickle",  # a CUDA caching-allocator snapshot, built inline
)
#: Commands on more than one input, or none.
OTHER_RUNS: tuple[tuple[str, ...], ...] = (
    ("diff", "shared/hta/tracecompare_tiny_base_rank1.json.gz", "shared/hta/tracecompare_tiny_test_rank1.json.gz"),
    ("diff", "shared/hta/tracecompare_tiny_base_rank1.json.gz", "shared/hta/tracecompare_tiny_test_rank1.json.gz",
     "--json"),
    ("ranks", "gen/ddp_gloo_rank0.pt.trace.json.gz", "gen/ddp_gloo_rank1.pt.trace.json.gz", "--workers", "0"),
    ("ranks", "gen/ddp_gloo_rank0.pt.trace.json.gz", "gen/ddp_gloo_rank1.pt.trace.json.gz", "--workers", "0",
     "--json"),
    ("report", "ranks", "--json"),  # a directory of rank traces
    ("report", "ranks", "-o", "{out}.html"),
    ("compile", "gen/cpu_compile_break_item.pt.trace.json.gz", "--logs", "gen/cpu_compile_break_item.torch_logs.txt"),
    ("diagnose", "gen/cpu_compile_break_item.pt.trace.json.gz", "--logs", "gen/cpu_compile_break_item.torch_logs.txt",
     "--json"),
    ("steps", "shared/hta/tracecompare_tiny_base_rank1.json.gz", "--items-per-step", "32", "--json"),
    ("kernels", "shared/hta/gp100_step_sync_gpu_user_annotation_2023.json.gz", "--ncu",
     "shared/ncu/csv_rtx5070_olajide/saxpy.csv"),
    ("blocks", "gen/pipeline/d1", "--step", "X"),  # refused: an instrument log's blocks carry their step
    ("which",), ("which", "gpu", "idle"), ("which", "--json"),
    ("schema",), ("schema", "--json"), ("schema", "diff"),
    ("capture", "nsys", "--dry-run", "--", "python", "train.py"),
    ("capture", "ncu", "--kernel", "gemm", "--dry-run", "--json", "--", "python", "train.py"),
)


def _golden() -> ModuleType:
    spec = importlib.util.spec_from_file_location("golden", ROOT / "scripts" / "golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inputs(folder: Path) -> None:
    """The run's folder: links to the input roots, and the inputs made here."""
    (folder / "shared").symlink_to(shared_trace("."))
    (folder / "gen").symlink_to(GENERATED)
    (folder / "ranks").mkdir()
    for rank in (0, 1):
        (folder / "ranks" / f"ddp_gloo_rank{rank}.pt.trace.json.gz").symlink_to(
            GENERATED / f"ddp_gloo_rank{rank}.pt.trace.json.gz")
    csv = shared_trace("ncu/csv_rtx5070_olajide")
    (folder / "ncu_runs.csv").write_bytes((csv / "saxpy.csv").read_bytes() + (csv / "gemm_naive.csv").read_bytes())
    (folder / "snapshot.pickle").write_bytes(pickle.dumps(build_snapshot(oom=True), protocol=4))


def _outputs(golden: ModuleType, folder: Path, dest: Path) -> dict[str, str]:
    """Every run's record, by name, as its SHA-256."""
    for name in INPUTS:
        golden.run_input(golden._slug(name), Path(name), dest)
    for argv in OTHER_RUNS:
        golden.run_one(golden._slug(" ".join(argv)), list(argv), dest)
    return {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dest.glob("*.txt"))}


def _read_digests() -> dict[str, str]:
    if not DIGESTS.is_file():
        return {}
    return {name: digest for digest, name in (line.split("  ", 1) for line in DIGESTS.read_text().splitlines() if line)}


def test_every_output_is_the_recorded_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    _inputs(folder)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("TRACEWHY_CACHE_DIR", str(tmp_path / "cache"))
    for variable in ("TRACEWHY_DEBUG", "TRACEWHY_NO_CACHE", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(variable, raising=False)
    dest = tmp_path / "outputs"
    dest.mkdir()
    got = _outputs(_golden(), folder, dest)
    # What keeps the digests independent of where the checkout lies: no output names the checkout,
    # the shared traces (scripts/golden.py writes them as <ROOT> and <SHARED>) or the run's folder.
    absolute = [p.name for p in dest.glob("*.txt")
                if any(root in p.read_text(encoding="utf-8") for root in ("<ROOT>", "<SHARED>", str(tmp_path)))]
    assert not absolute, f"outputs naming an absolute path: {sorted(absolute)}"
    ran = {p.read_text(encoding="utf-8").split(maxsplit=3)[2] for p in dest.glob("*.txt")}  # "$ tracewhy CMD ..."
    assert ran >= set(COMMAND_MODULES), f"commands the subset never runs: {sorted(set(COMMAND_MODULES) - ran)}"
    if os.environ.get(UPDATE):
        DIGESTS.parent.mkdir(parents=True, exist_ok=True)
        DIGESTS.write_text("".join(f"{digest}  {name}\n" for name, digest in got.items()))
        return
    want = _read_digests()
    assert want, f"no digests in {DIGESTS.relative_to(ROOT)}: run with {UPDATE}=1 to record them"
    changed = sorted(n for n in got.keys() & want.keys() if got[n] != want[n])
    new, gone = sorted(got.keys() - want.keys()), sorted(want.keys() - got.keys())
    assert not (changed or new or gone), (
        f"outputs changed: {changed}; new: {new}; no longer made: {gone}. If meant, rewrite the digests with "
        f"{UPDATE}=1 (the outputs of this run are in {dest})")
