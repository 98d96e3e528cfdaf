"""The ``--json`` contract, on real inputs: every command prints one document that its shipped
JSON Schema admits, every shape a command's document can take is met on a real input, every
time (``*_ns``) is an integer, the schemas are not vacuous (a document broken on purpose is
refused), and a failed command prints the error document with its exit code."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from conftest import GENERATED, TRACES, shared_trace
from json_contract import (
    DocumentInvalid,
    StrictValidator,
    describe,
    errors,
    fractional_times,
    schema,
    variant,
)
from test_memory import build_snapshot
from tracewhy.cli import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_USAGE, main
from tracewhy.cli.commands import COMMAND_MODULES, load_command
from tracewhy.renderers import jsonout

GPU: Final = "hta/a100_ddp2_rank0_nccl2.17.json.gz"  # steps, NCCL collectives overlapping compute, blocks
CPU: Final = "gen:cpu_lines_item.pt.trace.json.gz"  # CPU-only, with_stack (lines), steps
NSYS: Final = "nsys/nvfuser_xent_h200_2025.1.sqlite.gz"  # an Nsight Systems export with NVTX ranges
NCU: Final = "ncu/a100pcie_mistic_multikernel_basic.ncu-rep"
SHAPES: Final = "tracelens/h100_bert-small_bs1_seq512.json.gz"  # record_shapes: the shape roofline
MEMORY: Final = "gen:cpu_adam_memory.pt.trace.json.gz"  # profile_memory
TIMELINE: Final = "gen:memory_timeline/cpu_adam_memory_timeline.json.gz"
COMPILE: Final = "gen:cpu_compile_break_item"
LOGS_A, LOGS_B = "gen:pipeline/d1", "gen:pipeline/d2"  # tracewhy.instrument logs
RANKS: Final = ("gen:ddp_gloo_rank0.pt.trace.json.gz", "gen:ddp_gloo_rank1.pt.trace.json.gz")
MEMORY_RANKS: Final = ("gen:cpu_memory_ranks_rank0.pt.trace.json.gz", "gen:cpu_memory_ranks_rank1.pt.trace.json.gz")
MEMORY_VS: Final = ("gen:cpu_memory_vs_a.pt.trace.json.gz", "gen:cpu_memory_vs_b.pt.trace.json.gz")
DIFF: Final = ("gen:cpu_slow_step_base.pt.trace.json.gz", "gen:cpu_slow_step_planted.pt.trace.json.gz")
NCU_CSVS: Final = ("ncu/csv_rtx5070_olajide/saxpy.csv", "ncu/csv_rtx5070_olajide/gemm_naive.csv")

#: Each run: a name and the arguments; ``{tmp}`` is a scratch folder, ``gen:`` the generated inputs.
RUNS: Final[dict[str, tuple[str, ...]]] = {
    **{f"{c} gpu": (c, GPU) for c in ("diagnose", "account", "gaps", "info", "ops", "lines", "kernels", "nvtx", "steps",
                                     "overlap", "blocks", "critical-path", "compile", "memory", "report")},
    "ops --shapes gpu": ("ops", GPU, "--shapes"),
    "steps throughput gpu": ("steps", GPU, "--items-per-step", "32", "--unit", "images"),
    "diagnose throughput gpu": ("diagnose", GPU, "--items-per-step", "32"),
    "check gpu": ("check", GPU, "--max-gpu-idle", "50%", "--max-step-p50", "1s"),
    "check baseline": ("check", GPU, "--baseline", GPU, "--max-gpu-idle", "1%"),
    "sql gpu": ("sql", GPU, "SELECT name, count(*) AS calls, sum(dur_ns) AS total_ns FROM kernels GROUP BY name"),
    "export gpu": ("export", GPU, "-o", "{tmp}/annotated.json.gz", "--parquet", "{tmp}/tables"),
    "export parquet": ("export", CPU, "--parquet", "{tmp}/cpu_tables"),
    **{f"{c} cpu": (c, CPU) for c in ("diagnose", "account", "gaps", "info", "ops", "lines", "kernels", "nvtx", "steps",
                                     "overlap", "blocks", "critical-path", "report")},
    **{f"{c} nsys": (c, NSYS) for c in ("diagnose", "account", "gaps", "info", "kernels", "nvtx", "steps", "overlap",
                                       "critical-path", "report")},
    "roofline ncu": ("roofline", NCU),
    "roofline ncu runs": ("roofline", "{tmp}/appended.csv"),
    "roofline shapes": ("roofline", SHAPES),
    "report ncu": ("report", NCU),
    "kernels --ncu": ("kernels", GPU, "--ncu", NCU),
    "memory trace": ("memory", MEMORY),
    "memory timeline": ("memory", TIMELINE),
    "memory snapshot": ("memory", "{tmp}/snapshot.pickle"),
    "memory ranks": ("memory", *MEMORY_RANKS),
    "memory --vs": ("memory", MEMORY_VS[0], "--vs", MEMORY_VS[1]),
    "report timeline": ("report", TIMELINE),
    "compile": ("compile", f"{COMPILE}.pt.trace.json.gz"),
    "compile --logs": ("compile", f"{COMPILE}.pt.trace.json.gz", "--logs", f"{COMPILE}.torch_logs.txt"),
    "pipeline": ("pipeline", LOGS_A),
    "pipeline --vs": ("pipeline", LOGS_A, "--vs", LOGS_B),
    "pipeline throughput": ("pipeline", LOGS_B, "--items-per-step", "16", "--unit", "frames"),
    "pipeline --vs throughput": ("pipeline", LOGS_A, "--vs", LOGS_B, "--items-per-step", "16"),
    "blocks logs": ("blocks", LOGS_A),
    "diff": ("diff", *DIFF),
    "diff throughput": ("diff", *DIFF, "--items-per-step", "8", "--unit", "frames"),
    "ranks": ("ranks", *RANKS, "--workers", "0"),
    "report ranks": ("report", "{tmp}/ranks"),
    "diagnose ranks": ("diagnose", *RANKS),
    "check ranks": ("check", *RANKS, "--max-step-p50", "1s"),
    "steps runs": ("steps", *DIFF),
    "gaps runs": ("gaps", *DIFF),
    "diagnose runs": ("diagnose", *DIFF),
    "report runs": ("report", *DIFF),
    "which": ("which",),
    "which gaps": ("which", "gpu", "idle"),
    "which nothing": ("which", "no", "such", "symptom"),
    "schema": ("schema",),
    "capture dry run": ("capture", "nsys", "--dry-run", "--", "python", "train.py", "--json"),
    "capture ncu run": ("capture", "ncu", "--kernel", "k", "--name", "mine", "--", "python", "job.py"),
}


def _resolve(arg: str, tmp: Path) -> str:
    if arg.startswith("gen:"):
        return str(GENERATED / arg[4:])
    if arg.endswith((".gz", ".ncu-rep")) and "/" in arg and not arg.startswith("{"):
        return str(shared_trace(arg))
    return arg.replace("{tmp}", str(tmp))


def _inputs(tmp: Path) -> None:
    """The inputs a run builds: a snapshot pickle (torch's documented layout), a CSV of appended
    ncu runs, a folder of rank traces, and a stand-in ncu on PATH that writes a real report."""
    (tmp / "snapshot.pickle").write_bytes(pickle.dumps(build_snapshot(oom=True), protocol=4))
    (tmp / "appended.csv").write_bytes(b"".join(shared_trace(s).read_bytes() for s in (*NCU_CSVS, NCU_CSVS[0])))
    (tmp / "ranks").mkdir()
    for name in RANKS:
        (tmp / "ranks" / name[4:]).symlink_to(GENERATED / name[4:])
    fake = tmp / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\n"
                    f"shutil.copyfile({str(shared_trace(NCU))!r}, sys.argv[sys.argv.index('-o') + 1] + '.ncu-rep')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)


@contextlib.contextmanager
def _in(folder: Path, path_first: Path) -> Iterator[None]:
    """Run in ``folder`` with ``path_first`` ahead on PATH (capture writes its report here)."""
    cwd, path = Path.cwd(), os.environ.get("PATH", "")
    os.chdir(folder)
    os.environ["PATH"] = f"{path_first}{os.pathsep}{path}"
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ["PATH"] = path


Outputs = dict[str, tuple[int, str, str]]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Outputs:
    """Each run's exit code, stdout and stderr (every command with --json, once per module)."""
    if not TRACES.is_dir():
        pytest.skip("../shared is absent")
    tmp = tmp_path_factory.mktemp("json_contract")
    _inputs(tmp)
    out: Outputs = {}
    with _in(tmp, tmp / "bin"):
        for name, argv in RUNS.items():
            args = [_resolve(a, tmp) for a in argv]
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                # (right after the command: after "--" it would be the profiled job's argument)
                code = main([args[0], "--json", "--no-cache", *args[1:]])
            out[name] = (code, stdout.getvalue(), stderr.getvalue())
    return out


#: Runs whose command also exits 1 with its normal document: a gate that failed, a symptom not found.
MAY_EXIT_1: Final = ("check", "pipeline", "which")


@pytest.mark.parametrize("name", list(RUNS))
def test_each_run_prints_one_document_its_schema_admits(name: str, outputs: Outputs) -> None:
    code, out, err = outputs[name]
    assert code in ((0, 1) if RUNS[name][0] in MAY_EXIT_1 else (0,)), (name, code, err)
    doc = json.loads(out)  # one document, and nothing else, on stdout
    assert doc["command"] == RUNS[name][0] and doc["tool"] == "tracewhy" and doc["json_schema"] == 1
    assert "error" not in doc, doc.get("error")
    assert not errors(doc), [describe(e) for e in errors(doc)]


def test_every_command_and_every_shape_of_its_document_is_met(outputs: Outputs) -> None:
    """The runs cover every command, and every payload shape each command declares: a shape no
    real input produces would be a schema nobody checked."""
    seen = {(json.loads(out)["command"], variant(json.loads(out))) for _, out, _ in outputs.values()}
    assert {c for c, _ in seen} == set(COMMAND_MODULES)
    declared = {(name, t.__name__) for name in COMMAND_MODULES for t in load_command(name).json_payloads}
    assert declared - seen == set()


@pytest.mark.parametrize("name", list(RUNS))
def test_every_time_is_whole_nanoseconds(name: str, outputs: Outputs) -> None:
    """No number under a key ending in _ns is fractional, at any depth, table rows included."""
    doc = json.loads(outputs[name][1])
    assert list(fractional_times(doc)) == []


def test_the_rounded_statistics_are_the_nearest_nanosecond(outputs: Outputs) -> None:
    """The step statistics recomputed from the steps table: the median and mean of the steady
    durations, to the nearest nanosecond."""
    import statistics

    doc = json.loads(outputs["steps gpu"][1])
    durations = [s["dur_ns"] for s in doc["steps"] if s["steady"]]
    assert doc["stats"]["p50_ns"] == round(statistics.median(durations))
    assert doc["stats"]["mean_ns"] == round(statistics.fmean(durations))
    assert doc["stats"]["count"] == len(durations)


def test_schema_prints_a_valid_schema_document(capsys: pytest.CaptureFixture[str]) -> None:
    """``schema COMMAND`` prints the command's schema, with or without --json: a draft 2020-12
    schema, which the schema command's own schema admits."""
    from jsonschema import Draft202012Validator

    assert main(["schema", "steps"]) == 0
    plain = capsys.readouterr().out
    assert main(["schema", "steps", "--json"]) == 0
    assert capsys.readouterr().out == plain
    doc = json.loads(plain)
    Draft202012Validator.check_schema(doc)
    assert doc == schema("steps")
    assert not list(StrictValidator(schema("schema")).iter_errors(doc))


# --- the schemas are not vacuous ----------------------------------------------------------------


def _first(doc: Any, want: Any, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """The path of the first node (depth first) for which ``want(key, value)`` holds."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        if want(key, value) and path:
            return (*path, key)
        found = _first(value, want, (*path, key))
        if found is not None:
            return found
    return None


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


#: Documents to break: a nested object of declared shape in each, and a row of a table.
BROKEN: Final = {
    "steps gpu": (("stats",), ("steps", 0)),
    "diagnose gpu": (("basis",), ("top_gaps", 0)),
    "report gpu": (("trace",), ("ops", 0)),
    "memory snapshot": (("devices", 0), ("devices", 0, "live_at_peak", 0)),
    "roofline ncu": (("report",), ("launches", 0)),
    "pipeline --vs": (("vs",), ("vs", "chunks", 0)),
    "ranks": (("ranks", 0), ("matched", 0)),
    "check baseline": (("baseline", "a"), ("baseline", "kernels", 0)),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_document_is_refused(name: str, outputs: Outputs) -> None:
    doc = json.loads(outputs[name][1])
    assert not errors(doc)
    # A time turned into a float, deep in the document.
    broken = json.loads(outputs[name][1])
    path = _first(broken, lambda k, v: isinstance(k, str) and k.endswith("_ns") and type(v) is int)
    assert path is not None
    _at(broken, path)[path[-1]] += 0.5
    assert errors(broken), path
    # A required field dropped, at the top and in the nested object.
    broken = json.loads(outputs[name][1])
    del broken["warnings"]
    assert errors(broken)
    nested, row = BROKEN[name]
    broken = json.loads(outputs[name][1])
    obj = _at(broken, (*nested, None))
    obj.pop(sorted(obj)[0])
    assert errors(broken), nested
    # A stray field in a closed object: the top, and a row of a table.
    broken = json.loads(outputs[name][1])
    broken["stray"] = 1
    assert errors(broken)
    broken = json.loads(outputs[name][1])
    _at(broken, (*row, None))["stray"] = 1
    assert errors(broken), row


def test_the_envelope_checks_every_document() -> None:
    """The hook this suite puts on the envelope (conftest) sees documents made anywhere."""
    with pytest.raises(DocumentInvalid, match="stray"):
        jsonout.envelope("which", {"asked": "", "answers": [], "stray": 1}, [])


# --- errors under --json ------------------------------------------------------------------------


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    empty = tmp / "empty.json"
    empty.write_bytes(b"")
    text = tmp / "notes.json"
    text.write_text("these are notes, not a trace\n")
    cut = tmp / "cut.json.gz"
    cut.write_bytes(shared_trace(GPU).read_bytes()[:24])  # a download stopped in the gzip header
    return {"empty file": empty, "not a trace": text, "truncated gzip": cut}


def _error_document(capsys: pytest.CaptureFixture[str], argv: list[str], code: int) -> dict[str, Any]:
    assert main(argv) == code, argv
    out, err = capsys.readouterr()
    doc: dict[str, Any] = json.loads(out)
    assert doc["error"]["exit_code"] == code and doc["command"] == argv[0]
    lines = [x for x in err.splitlines() if "error" in x]
    assert lines and lines[-1].endswith(doc["error"]["message"]), (err, doc)
    assert not errors(doc)
    return doc


@pytest.mark.parametrize("command", ["diagnose", "steps", "gaps", "kernels", "report", "memory", "roofline"])
def test_bad_input_under_json_prints_the_error_document(command: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    for what, path in _bad_inputs(tmp_path).items():
        code = main([command, str(path), "--json", "--no-cache"])
        out, err = capsys.readouterr()
        assert code == EXIT_BAD_INPUT, (what, code, err)
        doc = json.loads(out)
        assert doc["error"] == {"exit_code": EXIT_BAD_INPUT, "message": doc["error"]["message"]}
        assert str(path) in doc["error"]["message"] and len(err.strip().splitlines()) >= 1
        assert err.strip().splitlines()[-1] == f"tracewhy: error: {doc['error']['message']}"
        assert not errors(doc)


def test_without_json_a_failure_prints_nothing_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = _bad_inputs(tmp_path)["empty file"]
    assert main(["steps", str(empty)]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("tracewhy: error: ")


def test_usage_errors_under_json(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(shared_trace(GPU))
    # argparse's own error for the command's option, then one of the command's own refusals.
    doc = _error_document(capsys, ["kernels", trace, "--top", "-3", "--json"], EXIT_USAGE)
    assert "--top" in doc["error"]["message"]
    doc = _error_document(capsys, ["sql", trace, "SELECT 1", "--csv", "--json"], EXIT_USAGE)
    assert "choose one" in doc["error"]["message"]
    doc = _error_document(capsys, ["check", trace, "--json"], EXIT_USAGE)
    assert "nothing to check" in doc["error"]["message"]
    _error_document(capsys, ["schema", "nosuch", "--json"], EXIT_USAGE)
    # A missing argument, and an option the command does not have.
    _error_document(capsys, ["diff", trace, "--json"], EXIT_USAGE)
    _error_document(capsys, ["steps", trace, "--frobnicate", "--json"], EXIT_USAGE)


def test_an_internal_error_under_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tracewhy.reports import steps as steps_report

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(steps_report, "steps", broken)
    doc = _error_document(capsys, ["steps", str(shared_trace(GPU)), "--json", "--no-cache"], EXIT_INTERNAL)
    assert "RuntimeError: planted" in doc["error"]["message"]


def test_a_failed_check_prints_its_own_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(shared_trace(GPU)), "--max-gpu-idle", "0%", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is False and "error" not in doc and not errors(doc)


def test_the_error_document_carries_the_warnings_so_far(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """diff reads A, a cut trace it warns about, then fails on B: the document says both."""
    data = gzip.decompress(shared_trace(GPU).read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) * 6 // 10])  # as `head -c` leaves a file copied mid-write
    doc = _error_document(capsys, ["diff", str(cut), str(_bad_inputs(tmp_path)["not a trace"]), "--json",
                                   "--no-cache"], EXIT_BAD_INPUT)
    assert len(doc["warnings"]) == 1 and str(cut) in doc["warnings"][0]


def test_an_unknown_command_under_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnoze", "x.json", "--json"]) == EXIT_USAGE
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "diagnoze" and doc["error"]["exit_code"] == EXIT_USAGE
    assert "did you mean 'diagnose'" in doc["error"]["message"]


def test_json_and_a_profile_on_stdout_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(GENERATED / CPU[4:])
    _error_document(capsys, ["lines", trace, "--flame", "-", "--json"], EXIT_USAGE)
    _error_document(capsys, ["export", trace, "-o", "-", "--json"], EXIT_USAGE)
