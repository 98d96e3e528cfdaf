"""Readable everywhere: names that can be told apart at any terminal width, whole names
where a script reads them, wrapped lines that keep their indent, colours that follow the user,
errors that say what to type instead, and progress only where someone is watching.

Terminal cases print through rich consoles of fixed width, so that they do not depend on the
terminal the tests run in."""

from __future__ import annotations

import argparse
import pickle
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from conftest import GENERATED, ROOT, shared_trace
from tracewhy.analyses.kernels import KernelCol, kernels
from tracewhy.cli import TOUR, main
from tracewhy.cli import base as cli_base
from tracewhy.errors import TraceError, install_hint
from tracewhy.readers import CacheOptions, read_trace
from tracewhy.renderers.diagnose import render_diagnose
from tracewhy.renderers.kernels import render_kernels
from tracewhy.renderers.names import cut_middle, name_cells, short_forms, shown_names
from tracewhy.reports.diagnose import diagnose
from tracewhy.reports.ranks import load_rank_summaries
from tracewhy.units import whole_names

DEMO = ROOT / "examples" / "demo_cpu_training.pt.trace.json.gz"
QWEN = "tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz"
NCU_REP = "ncu/a100pcie_mistic_nodecalc_full.ncu-rep"


def _text(renderable: RenderableType, width: int) -> str:
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def _kernel_cells(text: str) -> list[str]:
    """The kernel column of ``render_kernels``' first table, one entry per row (a name is cut,
    never wrapped onto a second line)."""
    first = text.split("└", 1)[0]
    return [line.split("│")[1].strip() for line in first.splitlines() if line.startswith("│")]


# --- names ---------------------------------------------------------------------------------------


def test_a_cut_keeps_the_end_and_marks_the_middle() -> None:
    name = "void at::native::elementwise_kernel<128, 4, at::native::CUDAFunctor_add<float> >(int, T)"
    cut = cut_middle(name, 40)
    assert 32 <= len(cut) <= 40 and "…" in cut
    assert cut.startswith("void at::") and cut.endswith("(int, T)")
    assert cut_middle(name, len(name)) == name


@pytest.mark.parametrize("width", range(12, 60))
def test_a_cut_never_splits_a_number(width: int) -> None:
    name = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
    cut = cut_middle(name, width, keep_from=40)
    assert len(cut) <= width
    assert not re.search(r"\d…|…\d", cut), cut
    numbers = set(re.findall(r"\d+", name))
    assert set(re.findall(r"\d+", cut)) <= numbers, cut


def test_a_cut_keeps_where_a_name_differs_from_its_neighbours() -> None:
    common = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
    a, b = common + "MulFunctor<float> >(int)::{lambda(int)#1}", common + "AddFunctor<float> >(int)::{lambda(int)#1}"
    cells = name_cells([a, b])
    shown = [c.cut(60) for c in cells]
    assert "MulFunctor" in shown[0] and "AddFunctor" in shown[1]
    assert all(s.endswith("#1}") and 50 <= len(s) <= 60 for s in shown)


def test_a_kernel_name_keeps_its_function_and_the_template_argument_that_tells_it() -> None:
    """``void``, namespaces and the parameter list go first; then the template arguments after
    the first that is itself a template or a function."""
    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
    forms = short_forms(name)
    assert forms[0] == name
    assert forms[-1] == "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>…>"
    nsys = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, " \
           "std::array<char *, (unsigned long)3>>(int, T2, T3)"  # nsys writes template values as casts
    assert short_forms(nsys)[-1] == forms[-1]
    functor = ("at::native::cos_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const"
               "::{lambda()#2}::operator()() const::{lambda(float)#1}")
    lambda_kernel = (f"void at::native::vectorized_elementwise_kernel<4, {functor}, std::array<char*, 2ul> >"
                     f"(int, {functor}, std::array<char*, 2ul>)")
    assert short_forms(lambda_kernel)[-1] == "vectorized_elementwise_kernel<4, cos_kernel_cuda::{lambda(float)#1}…>"
    for plain in ("triton_poi_fused_add_cos_sin_0", "aten::mm", "torch/nn/modules/module.py(1736): _call_impl",
                  "ProfilerStep#6 > aten::addmm > aten::addmm", "operator<(a, b)"):
        assert short_forms(plain) == [plain]  # no C++ signature (or unbalanced): only ever cut


def test_names_that_differ_only_in_their_tail_stay_apart() -> None:
    base = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    three, two = base + "at::detail::Array<char*, 3> >(int)", base + "at::detail::Array<char*, 2> >(int)"
    shown = shown_names([three, two, "void other<int>(float)"])
    assert shown == ["vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, Array<char*, 3>>",
                     "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, Array<char*, 2>>", "other<int>"]
    assert shown_names(["f(int)", "f(float)", "g(int)"]) == ["f(int)", "f(float)", "g"]  # overloads keep params
    assert shown_names(["k<int>(a)", "k<float>(a)"]) == ["k<int>", "k<float>"]


@pytest.mark.parametrize("width", [80, 100, 120, 160])
def test_the_h100_elementwise_kernels_can_be_told_apart(width: int) -> None:
    """Three kernels on the H100 Qwen trace all read ``void at::native::elementwise_kernel<128, 4,
    at::native::gpu_kernel_impl_nocast‹…`` when cut at the end."""
    result = kernels(read_trace(shared_trace(QWEN)))
    top = 8
    names = result.by_name.head(top).get_column(KernelCol.NAME).to_list()
    assert sum(n.startswith("void at::native::elementwise_kernel<128, 4,") for n in names) >= 3
    text = _text(render_kernels(result, top), width)
    shown = _kernel_cells(text)
    assert len(shown) == top and len(set(shown)) == top, shown
    assert max(len(line) for line in text.splitlines()) <= width
    assert "12.790 ms" in text  # numbers are never cut: columns leave a narrow terminal instead
    for full, cell in zip(names, shown, strict=True):
        if "…" in cell:  # the cut is in the middle: the end of the name's short form is shown
            assert any(form.endswith(cell.rsplit("…", 1)[1]) for form in short_forms(full)), (full, cell)


def test_wide_and_piped_output_print_names_whole(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(shared_trace(QWEN))
    names = kernels(read_trace(shared_trace(QWEN))).by_name.head(5).get_column(KernelCol.NAME).to_list()
    assert main(["kernels", trace, "--top", "5"]) == 0  # captured: stdout is not a terminal
    out = capsys.readouterr().out
    assert all(name in out for name in names)
    with whole_names():
        whole = _text(render_kernels(kernels(read_trace(shared_trace(QWEN))), 5), 5000)
    assert all(name in whole for name in names)


def test_wrapped_finding_lines_keep_their_indent() -> None:
    text = _text(render_diagnose(diagnose(read_trace(DEMO))), 60)
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if re.match(r"\d+\. \[", line)]
    assert heads, text
    # Where the step goes (after the trust findings) and the healthy line are no finding's text.
    ends = sorted({*heads, len(lines), *(i for i, line in enumerate(lines)
                                         if line.startswith(("Where the step goes", "Nothing here")))})
    for start in heads:
        end = next(e for e in ends if e > start)
        body = [line for line in lines[start + 1:end] if line.strip()]
        assert len(body) > 2  # the statement wrapped at 60 columns
        assert all(line.startswith("   ") for line in body), body


def test_info_says_why_a_device_is_not_described(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(shared_trace("nsys/nsysai_h100_2gpu_1s.sqlite.gz"))]) == 0
    out = capsys.readouterr().out
    assert "? -" not in out
    assert "not described: this export has no TARGET_INFO_GPU table" in out


def test_roofline_keeps_the_shapes_that_tell_ops_apart() -> None:
    from tracewhy.findings.roofline_ops import op_roofline
    from tracewhy.renderers.roofline_ops import render_op_roofline

    text = _text(render_op_roofline(op_roofline(read_trace(shared_trace(QWEN))), 6), 80)
    rows = [line for line in text.splitlines() if "ms " in line and "[" in line]
    assert rows and all(line.split("  ")[0].rstrip().endswith("]") for line in rows), rows
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80


# --- colour --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "no_color_env", "coloured"), [
    ("always", "", True), ("never", "", False), ("always", "1", True), ("auto", "1", False),
])
def test_color_follows_the_flag_and_no_color(flag: str, no_color_env: str, coloured: bool,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    if no_color_env:
        monkeypatch.setenv("NO_COLOR", no_color_env)
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["diagnose", str(DEMO), "--color", flag]) == 0
    assert ("\x1b[" in capsys.readouterr().out) is coloured


# --- errors --------------------------------------------------------------------------------------


def test_no_arguments_prints_the_tour(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out == TOUR
    for command in ("diagnose", "gaps", "overlap", "roofline", "diff", "report"):
        assert f"tracewhy {command} " in out


def test_a_misspelt_command_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnos", str(DEMO)]) == 2
    assert "unknown command 'diagnos'; did you mean 'diagnose'?" in capsys.readouterr().err
    assert main([str(DEMO)]) == 2  # a trace with no command: the command to run
    assert f"to diagnose it: tracewhy diagnose {DEMO}" in capsys.readouterr().err


def test_suggestions_come_from_the_command_registry() -> None:
    """Every registered command, new ones included, is suggested for a slip of one letter."""
    from tracewhy.cli import _did_you_mean
    from tracewhy.cli.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        assert f"'{name}'" in _did_you_mean(name[:-1] + "q", list(COMMAND_MODULES)), name


def test_a_bad_option_gets_the_subcommands_usage_and_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels", str(DEMO), "--jsn"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tracewhy kernels ")
    assert "tracewhy kernels: error: unrecognized arguments: --jsn; did you mean '--json'" in err


@pytest.mark.parametrize(("relative", "command"), [
    (NCU_REP, "roofline"),
    ("ncu/csv_b200_superbench/cublaslt_ncu.log", "roofline"),
])
def test_an_ncu_report_given_to_a_trace_command_names_roofline(relative: str, command: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_trace(relative)
    assert main(["diagnose", "--no-cache", str(path)]) == 3
    assert f"Nsight Compute report (kernel metrics), not a timeline trace: run tracewhy {command} {path}" \
        in capsys.readouterr().err


def test_memory_files_and_instrument_logs_name_their_command(tmp_path: Path) -> None:
    timeline = GENERATED / "memory_timeline" / "cpu_adam_memory_timeline.json.gz"
    log = next((GENERATED / "pipeline" / "d1").glob("*.jsonl"))
    snapshot = tmp_path / "snapshot.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=4))
    expected = {timeline: "run tracewhy memory", snapshot: "run tracewhy memory",
                log: f"run tracewhy pipeline {log} or tracewhy blocks {log}"}
    for path, hint in expected.items():
        with pytest.raises(TraceError, match=re.escape(hint)):
            read_trace(path, cache=CacheOptions(enabled=False))
    with pytest.raises(TraceError, match="not a recognized trace"):  # other files: as before
        read_trace(ROOT / "README.md", cache=CacheOptions(enabled=False))


def test_install_hints_work_from_pypi_and_from_a_clone() -> None:
    hint = install_hint("ncu")
    assert "pip install 'tracewhy[ncu]'" in hint and "pip install '.[ncu]'" in hint


# --- progress ------------------------------------------------------------------------------------


class _Probe(cli_base.Command):
    name = "probe"

    def run(self, args: argparse.Namespace) -> int:
        self.seen = cli_base.shows_progress()
        return 0


@pytest.mark.parametrize(("tty", "json", "shown"), [(True, False, True), (True, True, False), (False, False, False)])
def test_progress_only_on_a_terminal_and_never_with_json(tty: bool, json: bool, shown: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    probe = _Probe()
    assert cli_base.run_command(argparse.Namespace(command=probe, json=json)) == 0
    assert probe.seen is shown


def test_a_bar_for_reads_of_100_mb_or_more(tmp_path: Path) -> None:
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_bytes(b"{}")
    with open(large, "wb") as f:
        f.truncate(cli_base.PROGRESS_MIN_BYTES)  # sparse: the size is what counts
    token = cli_base._SHOW_PROGRESS.set(True)
    try:
        assert cli_base.progress_for(str(small)) is None
        bar = cli_base.progress_for(str(large))
        assert bar is not None and "large.json (95.4 MiB)" in bar.label
    finally:
        cli_base._SHOW_PROGRESS.reset(token)
    assert cli_base.progress_for(str(large)) is None  # not shown outside a command that shows it


def test_ranks_reports_each_rank_as_it_arrives() -> None:
    files = [str(GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz") for r in (0, 1)]
    done: list[str] = []
    summaries = load_rank_summaries(files, None, done=done.append)
    assert done == files
    assert [s.rank for s in summaries] == [0, 1]


def test_ranks_draws_a_line_per_rank_only_where_progress_shows() -> None:
    from tracewhy.cli.commands.ranks import rank_progress

    files = [str(GENERATED / f"ddp_gloo_rank{r}.pt.trace.json.gz") for r in (0, 1)]
    with rank_progress(files) as done:
        assert done is None  # not a terminal, or --json: nothing drawn
    token = cli_base._SHOW_PROGRESS.set(True)
    try:
        with rank_progress(files) as done:
            assert done is not None
            for f in files:
                done(f)
        with rank_progress(files[:1]) as done:
            assert done is None  # one file: nothing to compare progress across
    finally:
        cli_base._SHOW_PROGRESS.reset(token)


def test_a_spinner_follows_the_bar_until_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a read that drew a bar, a spinner says the command is analysing, and it stops before
    anything is printed (on a 5 GB trace 37 s of analyses followed the bar)."""
    path = str(GENERATED / "ddp_gloo_rank0.pt.trace.json.gz")
    monkeypatch.setattr(cli_base, "PROGRESS_MIN_BYTES", 0)
    token = cli_base._SHOW_PROGRESS.set(True)
    try:
        cli_base.load_trace(path)
        status = cli_base._ANALYSING.get()
        assert status is not None and "analysing ddp_gloo_rank0" in str(status.status)
        cli_base.flush_warnings()  # what emit does first
        assert cli_base._ANALYSING.get() is None
    finally:
        cli_base.stop_analysing()
        cli_base._SHOW_PROGRESS.reset(token)
