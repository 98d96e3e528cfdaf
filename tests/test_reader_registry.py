"""Every input format is registered once (``tracewhy.readers.registry``): its sniff tells its
files by their content, whatever they are called; telling a file imports no reader; and outside
``readers/`` nothing reaches into a format's folder, so that a new format is its folder and one
registry entry."""

from __future__ import annotations

import ast
import gzip
import importlib
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GENERATED, shared_trace
from tracewhy.model.trace import KINETO_FORMAT, NSYS_FORMAT
from tracewhy.readers import registry
from tracewhy.readers.registry import FORMATS, InputKind, detect, other_tool_hint

SRC = Path(registry.__file__).resolve().parent.parent
READERS = SRC / "readers"
#: About 400 lines is the sign to split a module (STYLE.md, rule 11).
MAX_LINES = 400


#: The kinds in the order a command that takes any input would try them: a timeline trace's sniff
#: (JSON that opens an object or array) takes a memory-timeline export too, so it comes last.
ANY_KIND = [*(k for k in InputKind if k is not InputKind.TIMELINE), InputKind.TIMELINE]


def _samples(tmp_path: Path) -> dict[str, Path]:
    """A real file of each format that is told by content."""
    snapshot = tmp_path / "snapshot.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=4))
    return {
        KINETO_FORMAT: shared_trace("hta/tracecompare_tiny_base_rank1.json.gz"),
        NSYS_FORMAT: shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"),
        "ncu": shared_trace("ncu/csv_rtx5070_olajide/saxpy.csv"),
        "memory-timeline": GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.raw.json.gz",
        "memory-snapshot": snapshot,
        "instrument-log": GENERATED / "pipeline" / "d1" / "tracewhy-instrument.rank0.jsonl",
        "torch-trace": GENERATED / "cpu_ttrace_break_item.torch_trace" / "dedicated_log_torch_trace_run.log.gz",
    }


def test_names_are_unique_and_the_timeline_formats_are_named_as_their_traces_say() -> None:
    names = [f.name for f in FORMATS]
    assert len(set(names)) == len(names)
    assert [f.name for f in registry.of_kind(InputKind.TIMELINE)] == [KINETO_FORMAT, NSYS_FORMAT]
    assert {f.kind for f in FORMATS} == set(InputKind)  # every kind has a reader


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_function_an_entry_names_exists(fmt: registry.InputFormat) -> None:
    for spec in (fmt.sniff, fmt.read, fmt.raw_events):
        if spec is not None:
            module, name = spec.split(":")
            assert module.startswith("tracewhy.readers."), spec
            assert callable(getattr(importlib.import_module(module), name)), spec


def test_each_sample_is_told_as_its_format_whatever_its_name(tmp_path: Path) -> None:
    for name, path in _samples(tmp_path).items():
        found = detect(path, ANY_KIND)
        assert found is not None and found.name == name, path
        # By content, never by the file's name: the same bytes under a name that says nothing.
        anonymous = tmp_path / f"anonymous-{name}"
        shutil.copyfile(path, anonymous)
        again = detect(anonymous, ANY_KIND)
        assert again is not None and again.name == name


def test_kinds_are_tried_in_the_order_given(tmp_path: Path) -> None:
    timeline = _samples(tmp_path)["memory-timeline"]
    assert detect(timeline, (InputKind.TIMELINE,)) is not None  # its JSON is also JSON
    found = detect(timeline, (InputKind.MEMORY_TIMELINE, InputKind.TIMELINE))
    assert found is not None and found.kind is InputKind.MEMORY_TIMELINE


def test_the_hint_names_the_file_and_the_command_that_reads_it(tmp_path: Path) -> None:
    samples = _samples(tmp_path)
    assert other_tool_hint(samples["ncu"]) == (
        f"an Nsight Compute report (kernel metrics), not a timeline trace: run tracewhy roofline {samples['ncu']}")
    assert other_tool_hint(samples["memory-snapshot"]) == (
        f"a CUDA memory snapshot (pickle), not a profiler trace: run tracewhy memory {samples['memory-snapshot']}")
    assert other_tool_hint(samples["torch-trace"]) == (
        f"a TORCH_TRACE compile log, not a profiler trace: run tracewhy compile TRACE --logs {samples['torch-trace']}")
    assert other_tool_hint(samples[KINETO_FORMAT]) is None  # a trace: nothing to redirect
    assert other_tool_hint(samples["instrument-log"].parent) is None  # only files are hinted


def test_the_trace_error_lists_every_timeline_format(tmp_path: Path) -> None:
    assert registry.expected(InputKind.TIMELINE) == (
        "PyTorch profiler JSON (.json or .json.gz) or an Nsight Systems SQLite export")
    assert registry.suffixes(InputKind.TIMELINE) == (".json", ".json.gz", ".sqlite", ".sqlite.gz", ".nsys-rep")


def test_raw_events_come_from_the_format_that_keeps_them() -> None:
    path = shared_trace("hta/tracecompare_tiny_base_rank1.json.gz")
    raw = registry.read_raw_events(KINETO_FORMAT, path)
    assert raw is not None
    assert len(raw.events) == len(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])
    assert registry.read_raw_events(NSYS_FORMAT, path) is None  # written from the model instead


#: Tells every sample in a fresh interpreter and prints the tracewhy modules it then holds.
PROBE = """
import json, sys
from pathlib import Path
from tracewhy.readers.registry import InputKind, detect
for path in sys.argv[1:]:
    assert detect(Path(path), [*InputKind][::-1]) is not None, path
print(json.dumps(sorted(m for m in sys.modules if m.startswith("tracewhy.readers."))))
"""


def test_telling_a_file_imports_only_the_sniffs(tmp_path: Path) -> None:
    paths = [str(p) for p in _samples(tmp_path).values()]
    done = subprocess.run([sys.executable, "-c", PROBE, *paths], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    packages = {f"tracewhy.readers.{d.name}" for d in READERS.iterdir() if (d / "__init__.py").exists()}
    allowed = {"tracewhy.readers.registry", "tracewhy.readers.source"} | packages | {f"{p}.sniff" for p in packages}
    assert loaded - allowed == set()
    assert "tracewhy.readers.kineto.sniff" in loaded and "tracewhy.readers.memory.sniff" in loaded


@pytest.mark.parametrize("folder", sorted(d.name for d in READERS.iterdir() if (d / "__init__.py").exists()))
def test_a_format_folder_imports_nothing_when_it_is_imported(folder: str) -> None:
    tree = ast.parse((READERS / folder / "__init__.py").read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


@pytest.mark.parametrize("path", sorted(READERS.rglob("*.py")), ids=lambda p: str(p.relative_to(READERS)))
def test_no_reader_module_is_over_the_size_to_split(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(READERS)} has {lines} lines: split it"


def test_only_the_registry_reaches_into_a_format_s_folder() -> None:
    """Outside ``readers/``, code reads through ``read_trace`` and the registry (and the shared
    plumbing in ``readers/source.py``), never a format's own modules."""
    folders = {d.name for d in READERS.iterdir() if (d / "__init__.py").exists()}
    reaching: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path.is_relative_to(READERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["tracewhy", "readers"] and len(parts) > 2 and parts[2] in folders:
                    reaching.append(f"{path.relative_to(SRC)}: {name}")
    assert reaching == []
