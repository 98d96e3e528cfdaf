"""Shared test fixtures: where the real traces are, and a way to find them by name."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest

if TYPE_CHECKING:
    from tracewhy.analyses.account import AccountResult
    from tracewhy.findings.codes import Code
    from tracewhy.findings.model import Finding
    from tracewhy.reports.diagnose import DiagnoseReport, DiagnoseReportOptions, Report
    from tracewhy.reports.inputs import Loader, TraceSource

ROOT = Path(__file__).resolve().parent.parent
#: The shared folder lives beside the clone (CI puts it there too).
SHARED = Path(os.environ.get("TRACEWHY_SHARED", ROOT.parent / "shared"))
TRACES = SHARED / "traces"
GENERATED = ROOT / "tests" / "data" / "generated"


def shared_trace(relative: str) -> Path:
    """Path of a real trace under ../shared/traces; skips the test only when ../shared is absent."""
    if not SHARED.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the shared traces beside the clone ({SHARED} is missing)")
        pytest.skip("../shared is absent: the real-trace tests need the shared traces beside the clone")
    path = TRACES / relative
    assert path.exists(), f"missing shared trace {relative}"
    return path


def diagnose_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``tracewhy diagnose PATH --json --no-cache``'s document (the command must succeed)."""
    from tracewhy.cli import main

    assert main(["diagnose", str(path), "--json", "--no-cache"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def finding_of(doc: dict[str, Any], code: str) -> dict[str, Any] | None:
    """The document's first finding of ``code``, or None."""
    return next((f for f in doc["findings"] if f["code"] == code), None)


#: The test files that share their diagnoses of the same traces (``cli_output``,
#: ``checked_report``, ``account_of``: each made once per worker, let go after the last of these
#: files); they run on one worker. The test command's ``--dist loadgroup`` sends every other
#: file to a worker whole, a group of its own (``pytest_xdist_make_scheduler``).
SHARED_DIAGNOSES: frozenset[str] = frozenset({
    "test_diagnose_account", "test_small_captures", "test_platform_advice", "test_diagnose_real",
    "test_spike_contents", "test_grad_sync", "test_inference_autograd", "test_account_real",
    "test_memory_wiring", "test_sync_blocks"})
#: What a command's standard output depends on beside its arguments: the terminal's size and colour.
OUTPUT_ENVIRONMENT = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM")


def _group(nodeid: str) -> str:
    """The work unit a test belongs to: the files of SHARED_DIAGNOSES together, any other file whole."""
    file = nodeid.split("::")[0]
    return "shared-diagnoses" if Path(file).stem in SHARED_DIAGNOSES else file


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The work units with a slow test first, then the others, each unit's tests together, in
    the order collected: a worker that took a minute of fuzzing last would leave the other idle
    that long. (The order is the same in every worker, as pytest-xdist requires.)"""
    first: dict[str, int] = {}
    for k, item in enumerate(items):
        first.setdefault(_group(item.nodeid), k)
    slow = {_group(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (_group(item.nodeid) not in slow, first[_group(item.nodeid)]))


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: a run without it has no such hook)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by ``_group``, read off each test's id by the controller, the units
    dealt in the order collected (``pytest_collection_modifyitems``), not by their number of
    tests. (Not by ``xdist_group`` marks: pytest-xdist 3.8 passes them to the controller by
    appending them to the test's id, which pytest 9.2 ignores, pytest-dev/pytest-xdist#1386;
    the tests were then dealt out one by one, and each worker diagnosed the shared traces again.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByGroup(config, log)


def _shares(item: pytest.Item | None) -> bool:
    return item is not None and _group(item.nodeid) == "shared-diagnoses"


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of the files that share diagnoses, the shared ones are let go: the
    worker goes on with other files, whose every collection would otherwise walk them."""
    if _shares(item) and not _shares(nextitem):
        for shared in (_cli_output, checked_report, account_of):
            shared.cache_clear()
        _DIAGNOSES.clear()
        gc.collect()


def cli_output(*argv: str) -> str:
    """``tracewhy ARGV --no-cache``'s standard output (the command must succeed). Made once per
    worker for each argument list and terminal setting (``OUTPUT_ENVIRONMENT``): a command's
    output depends on nothing else, so a test that patches tracewhy's own code runs ``main``
    itself. The first run's warnings reach the test's captured stderr, later ones none.
    ``diagnose PATH`` and ``diagnose PATH --json`` print one diagnosis (``_diagnosed_once``)."""
    return _cli_output(argv, tuple(os.environ.get(name) for name in OUTPUT_ENVIRONMENT))


@cache
def _cli_output(argv: tuple[str, ...], environment: tuple[str | None, ...]) -> str:
    from tracewhy.cli import main
    from tracewhy.cli.commands import diagnose

    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.object(diagnose, "diagnose_report", _diagnosed_once):
        code = main([*argv, "--no-cache"])
    assert code == 0, (argv, code)
    return out.getvalue()


#: One diagnosis per trace file and options, whichever of ``diagnose PATH``, ``diagnose PATH
#: --json`` (``cli_output``) and ``checked_report`` asks first; with the warnings it said, which
#: a later ask says again (a command's ``--json`` document carries them).
_DIAGNOSES: dict[tuple[str, DiagnoseReportOptions], tuple[DiagnoseReport, list[tuple[str, list[str]]]]] = {}


def _diagnosed_once(source: TraceSource, options: DiagnoseReportOptions | None = None,
                    loader: Loader | None = None) -> DiagnoseReport:
    """``reports.diagnose.diagnose_report`` for the commands ``cli_output`` runs, made once per
    file and options (``_DIAGNOSES``); a Trace given as such is diagnosed each time."""
    from tracewhy.reports.diagnose import DiagnoseReportOptions, diagnose_report
    from tracewhy.reports.inputs import PLAIN, Loader

    loader = loader or PLAIN
    if not isinstance(source, (str, os.PathLike)):
        return diagnose_report(source, options, loader)
    key = (str(source), options or DiagnoseReportOptions())
    if key in _DIAGNOSES:
        for said_of, lines in _DIAGNOSES[key][1]:
            loader.warn(said_of, lines)
        return _DIAGNOSES[key][0]
    said: list[tuple[str, list[str]]] = []

    def read(path: str, kinds: Any) -> Any:
        trace = loader.read(path, kinds)  # (the command's reader says the trace's warnings itself)
        said.append((path, list(trace.meta.warnings)))
        return trace

    def warn(said_of: str | Path, lines: Any) -> None:
        said.append((str(said_of), list(lines)))
        loader.warn(said_of, said[-1][1])

    _DIAGNOSES[key] = (diagnose_report(source, options, Loader(read=read, warn=warn)), said)
    return _DIAGNOSES[key][0]


@cache
def checked_report(path: Path) -> Report:
    """``diagnose`` of the trace at ``path``, its model checked first; once per path (until the
    files of SHARED_DIAGNOSES are done), and the same diagnosis ``cli_output``'s ``diagnose PATH``
    prints (made once for both, by whichever asks first: the model is checked either way)."""
    import tracewhy
    from tracewhy.reports.diagnose import DiagnoseReportOptions, diagnose_report

    trace = tracewhy.load(path)
    trace.check()
    key = (str(path), DiagnoseReportOptions())
    if key not in _DIAGNOSES:
        _DIAGNOSES[key] = (diagnose_report(trace), [(str(path), list(trace.meta.warnings))])
    return _DIAGNOSES[key][0].report


@cache
def account_of(path: Path) -> AccountResult:
    """``step_account`` of the trace at ``path`` with the default options; once per path (as
    ``checked_report``; a file that is no profiler trace raises TraceError each time)."""
    from tracewhy.analyses.account import step_account
    from tracewhy.readers import read_trace

    return step_account(read_trace(path))


def the_finding(path: Path, code: Code) -> Finding:
    """The one finding of ``code`` in ``checked_report(path)`` (exactly one must be there)."""
    found = [f for f in checked_report(path).findings if f.code == code]
    assert len(found) == 1, [f.code for f in checked_report(path).findings]
    return found[0]


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the shared traces beside the clone ({TRACES} is missing)")
        pytest.skip("../shared is absent: the real-trace tests need the shared traces beside the clone")
    return TRACES


@pytest.fixture(scope="session", autouse=True)
def _fixed_inputs_parsed_once() -> Iterator[None]:
    """The shared traces and the project's own test and example traces are parsed once per
    worker; each later read is a new Trace over the same tables (``read_once``)."""
    import read_once

    undo = read_once.install((TRACES, ROOT / "tests" / "data", ROOT / "examples"))
    yield
    undo()


@pytest.fixture(autouse=True)
def _json_documents_follow_their_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``--json`` document a test makes (``renderers.jsonout.envelope`` makes them all, the
    error documents and the HTML report's data too) is checked against its command's shipped
    JSON Schema; a document that breaks it fails the test (json_contract.DocumentInvalid)."""
    from json_contract import check_document
    from tracewhy.renderers import jsonout

    monkeypatch.setattr(jsonout, "document_hook", check_document)
