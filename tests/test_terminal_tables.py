"""Every command's terminal output, on real traces, at 80, 100, 120 and 160 columns: no line wider
than the terminal; no number or unit cut or split across lines (every one that the ``--wide``
rendering of the same table shows appears whole, or not at all when its column was left out); step
names never cut at their end; a caption that names the columns left out; and piped output with no
line ending in spaces.

Each command runs twice per input, through ``tracewhy.cli.main`` as a user runs it: once on a
terminal (the view it would print is kept, and printed here at each width) and once piped (names
and columns whole), which is also the ``--wide`` rendering the narrow ones are checked against."""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import pickle
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from builders import KinetoBuilder
from conftest import GENERATED, shared_trace
from test_memory import build_snapshot
from tracewhy.cli import base as cli_base
from tracewhy.cli import main
from tracewhy.units import whole_names

WIDTHS = (80, 100, 120, 160)
QWEN = "tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz"
DDP = "hta/a100_ddp2_rank0_nccl2.17.json.gz"
NSYS = "nsys/nsysai_h100_2gpu_1s.sqlite.gz"
NCU = "ncu/a100pcie_mistic_nodecalc_full.ncu-rep"
QUERY = "SELECT name, count(*) AS n, sum(dur_ns) AS total_ns FROM slices GROUP BY name ORDER BY total_ns DESC"

#: (case id, argv); ``S:`` a shared trace, ``G:`` a generated one, ``T:`` one built in a temporary folder.
CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("info-qwen", ("info", f"S:{QWEN}")),
    ("info-nsys", ("info", f"S:{NSYS}")),
    ("diagnose-qwen", ("diagnose", f"S:{QWEN}")),
    ("diagnose-cpu", ("diagnose", "G:cpu_slow_step_base.pt.trace.json.gz")),
    ("gaps-qwen", ("gaps", f"S:{QWEN}")),
    ("gaps-ddp", ("gaps", f"S:{DDP}")),
    ("gaps-nsys", ("gaps", f"S:{NSYS}")),
    ("ops-qwen", ("ops", f"S:{QWEN}")),
    ("ops-shapes-qwen", ("ops", f"S:{QWEN}", "--shapes")),
    ("ops-cpu", ("ops", "G:cpu_slow_step_base.pt.trace.json.gz")),
    ("lines-cpu", ("lines", "G:cpu_lines_loop.pt.trace.json.gz")),
    ("kernels-qwen", ("kernels", f"S:{QWEN}")),
    ("kernels-ddp", ("kernels", f"S:{DDP}")),
    ("kernels-nsys", ("kernels", f"S:{NSYS}")),
    ("nvtx-nsys", ("nvtx", f"S:{NSYS}")),
    ("nvtx-qwen", ("nvtx", f"S:{QWEN}")),
    ("steps-qwen", ("steps", f"S:{QWEN}")),
    ("steps-ddp", ("steps", f"S:{DDP}")),
    ("steps-cpu", ("steps", "G:cpu_slow_step_base.pt.trace.json.gz")),
    ("steps-custom-marker", ("steps", "T:custom_marker", "--step", "train_step")),
    ("overlap-ddp", ("overlap", f"S:{DDP}")),
    ("overlap-nsys", ("overlap", f"S:{NSYS}")),
    ("blocks-qwen", ("blocks", f"S:{QWEN}")),
    ("blocks-log", ("blocks", "G:pipeline/d1")),
    ("ranks-gloo", ("ranks", "G:ddp_gloo_rank0.pt.trace.json.gz", "G:ddp_gloo_rank1.pt.trace.json.gz",
                    "--workers", "0")),
    ("ranks-128", ("ranks", "S:hta/sampled_128rank_job_rank0.json.gz", "S:hta/sampled_128rank_job_rank1.json.gz",
                   "--workers", "0")),
    ("roofline-ncu", ("roofline", f"S:{NCU}")),
    ("roofline-ncu-launches", ("roofline", f"S:{NCU}", "--launches")),
    ("roofline-shapes", ("roofline", f"S:{QWEN}")),
    ("memory-trace", ("memory", "G:cpu_adam_memory.pt.trace.json.gz")),
    ("memory-timeline", ("memory", "G:memory_timeline/cpu_adam_memory_timeline.json.gz")),
    ("memory-snapshot", ("memory", "T:snapshot")),
    ("pipeline", ("pipeline", "G:pipeline/d1")),
    ("compile", ("compile", "G:cpu_compile_break_item.pt.trace.json.gz")),
    ("compile-logs", ("compile", "G:cpu_compile_break_item.pt.trace.json.gz",
                      "--logs", "G:cpu_compile_break_item.torch_logs.txt")),
    ("diff-resnet", ("diff", "S:kineto/resnet50_nw0_span1_worker0.1623143089861.pt.trace.json.gz",
                     "S:kineto/resnet50_nw4_span1_worker0.1623212756351.pt.trace.json.gz")),
    ("diff-cpu", ("diff", "G:cpu_slow_step_base.pt.trace.json.gz", "G:cpu_slow_step_planted.pt.trace.json.gz")),
    ("check-qwen", ("check", f"S:{QWEN}", "--max-gpu-idle", "50%")),
    ("sql-qwen", ("sql", f"S:{QWEN}", QUERY)),
    ("critical-path-qwen", ("critical-path", f"S:{QWEN}")),
    ("critical-path-ddp", ("critical-path", f"S:{DDP}")),
    ("which", ("which",)),
    ("which-gpu-idle", ("which", "gpu", "idle")),
    ("schema", ("schema",)),
)
IDS = [case for case, _ in CASES]
#: The commands the cases cover: every command that prints a table.
COMMANDS = ("diagnose", "gaps", "info", "ops", "lines", "kernels", "nvtx", "steps", "overlap", "blocks", "ranks",
            "roofline", "memory", "pipeline", "compile", "diff", "check", "sql", "critical-path", "which", "schema")

_print_tables = cli_base.print_tables  # the real one: the cases replace it to keep what would be printed


class _Stdout(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def _built(name: str, folder: Path) -> Path:
    """Inputs built for the cases: steps under a custom marker, an allocator snapshot."""
    if name == "custom_marker":
        b = KinetoBuilder()
        for i in range(6):
            b.annotation(f"train_step#{i}", 1000.0 * i, 900.0)
            b.op("aten::mm", 1000.0 * i + 10, 500.0)
        return b.write(folder / "custom_marker.pt.trace.json")
    path = folder / "snapshot.pickle"
    path.write_bytes(pickle.dumps(build_snapshot(), protocol=4))
    return path


def _argv(template: tuple[str, ...], folder: Path) -> list[str]:
    out = []
    for arg in template:
        if arg.startswith("S:"):
            out.append(str(shared_trace(arg[2:])))
        elif arg.startswith("G:"):
            out.append(str(GENERATED / arg[2:]))
        elif arg.startswith("T:"):
            out.append(str(_built(arg[2:], folder)))
        else:
            out.append(arg)
    return out


class Run:
    """One case run on a terminal and piped: what each would print."""

    def __init__(self, argv: list[str]) -> None:
        self.terminal, self.terminal_text = self._run(argv, terminal=True)
        self.piped, self.piped_text = self._run(argv, terminal=False)

    @staticmethod
    def _run(argv: list[str], terminal: bool) -> tuple[RenderableType | None, str]:
        seen: list[RenderableType] = []
        stdout = _Stdout(terminal)
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(io.StringIO()):
            mp.setattr(cli_base, "print_tables", lambda console, renderable: seen.append(renderable))
            mp.setattr(sys, "stdout", stdout)
            code = main(argv)
        assert code in (0, 1), f"{argv}: exit {code}"  # 1: a check that failed, a symptom with no entry
        return (seen[-1] if seen else None), stdout.getvalue()

    def narrow(self, width: int) -> str:
        """The terminal output at ``width`` columns (empty for a command that prints no view)."""
        return _printed(self.terminal, width) if self.terminal is not None else self.terminal_text

    def piped_output(self) -> str:
        return _printed(self.piped, None) if self.piped is not None else self.piped_text


def _printed(renderable: RenderableType, width: int | None) -> str:
    """What ``print_tables`` writes: on a terminal of ``width`` columns, or piped (None)."""
    buffer = io.StringIO()
    if width is None:
        console = Console(file=buffer, width=cli_base.PIPED_WIDTH, soft_wrap=False, color_system=None)
    else:
        console = Console(file=buffer, width=width, force_terminal=True, soft_wrap=False, color_system=None)
    with whole_names(width is None):
        _print_tables(console, renderable)
    return buffer.getvalue()


def _parts(renderable: RenderableType | None) -> list[RenderableType]:
    if renderable is None:
        return []
    if isinstance(renderable, Group):
        return [p for part in renderable.renderables for p in _parts(part)]
    return [renderable]


def _is_table(part: RenderableType) -> bool:
    return not isinstance(part, (Text, Padding, str))


@functools.cache
def _run(case: str, folder: Path) -> Run:
    return Run(_argv(dict(CASES)[case], folder))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inputs")


def test_the_cases_cover_every_command_that_prints_a_table() -> None:
    assert {argv[0] for _, argv in CASES} == set(COMMANDS)


# --- widths ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", IDS)
def test_no_line_is_wider_than_the_terminal(case: str, built: Path) -> None:
    run = _run(case, built)
    for width in WIDTHS:
        text = run.narrow(width)
        too_wide = [line for line in text.splitlines() if len(line) > width]
        if dict(CASES)[case][0] == "check":  # plain lines, never wrapped: CI logs are grepped by line
            too_wide = [line for line in too_wide if len(line) > 160]
        assert not too_wide, f"{width} columns:\n" + "\n".join(too_wide)


# --- numbers --------------------------------------------------------------------------------------

#: A number with its unit, as the tables print them (``12.790 ms``, ``31.2%``, ``4.0 GiB``, ``1465``:
#: no thousands separators, so ``16,559`` in a shape is two numbers).
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?: ?(?:[nµm]?s|[KMGT]iB|B|%)(?![\w/]))?")
#: A number or unit cut by an ellipsis: ``4.4…``, ``…12``, ``12.3 m…``.
_CUT = re.compile(r"\d…|…\d|\d(?:[.,]\d+)? ?(?:[nµmKMGT]|[KMGT]i|[kMGTP]?FLOP|G?B/?)…")


def _numbers(text: str) -> set[str]:
    return {m.group() for line in text.splitlines() for m in _NUMBER.finditer(line)}


@pytest.mark.parametrize("case", IDS)
def test_numbers_and_units_are_never_cut(case: str, built: Path) -> None:
    """Table by table: every number the narrow rendering shows is one the wide rendering shows
    (a number wrapped across lines, or cut, would read as another number or as a bare one)."""
    run = _run(case, built)
    narrow, wide = _parts(run.terminal), _parts(run.piped)
    assert len(narrow) == len(wide)
    for part, whole in zip(narrow, wide, strict=True):
        if not _is_table(part):
            continue
        expected = _numbers(_printed(whole, None))
        for width in WIDTHS:
            text = _printed(part, width)
            cut = [line for line in text.splitlines() if _CUT.search(line)]
            assert not cut, f"{width} columns:\n" + "\n".join(cut)
            assert _numbers(text) <= expected, (f"{width} columns: {sorted(_numbers(text) - expected)} are not "
                                                f"numbers of the whole table:\n{text}")


# --- step names -----------------------------------------------------------------------------------

_STEP_NAME = re.compile(r"[^\s│┃|]+#\d+")
_BEFORE_ELLIPSIS = re.compile(r"([^\s│┃|]+)…")


@pytest.mark.parametrize("case", IDS)
def test_step_names_are_never_cut_at_their_end(case: str, built: Path) -> None:
    run = _run(case, built)
    markers = {m.group().rsplit("#", 1)[0] for m in _STEP_NAME.finditer(run.piped_output())}
    for width in WIDTHS:
        for m in _BEFORE_ELLIPSIS.finditer(run.narrow(width)):
            cut = m.group(1)
            assert not re.fullmatch(r".*#\d*", cut), f"{width} columns: a step cut at its end: {cut}…"
            assert not any(marker.startswith(cut) for marker in markers), f"{width} columns: {cut}…"


def test_step_names_shorten_to_their_number_and_the_caption_says_so(built: Path) -> None:
    """At 80 columns the steps table of the H100 trace has no room for ``ProfilerStep#N``."""
    text = _run("steps-qwen", built).narrow(80)
    rows = [line for line in text.splitlines() if re.match(r"│ #\d+ ", line)]
    assert rows and "ProfilerStep#" not in "".join(rows), text
    assert "#N: ProfilerStep#N" in text
    custom = _run("steps-custom-marker", built)
    assert "train_step#3" in custom.narrow(160) or "#N: train_step#N" in custom.narrow(160)


# --- columns left out -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", IDS)
def test_a_caption_names_the_columns_left_out(case: str, built: Path) -> None:
    from tracewhy.renderers.layout import DROPPED_NOTE, FitTable

    run = _run(case, built)
    for part in _parts(run.terminal):
        if not isinstance(part, FitTable):
            continue
        with whole_names(False):
            whole = [c.header.plain for c in part.build(None).columns]
        for width in WIDTHS:
            with whole_names(False):
                table = part.build(width)
            shown = [c.header.plain for c in table.columns]
            left_out = [h for h in whole if h not in shown]
            caption = table.caption.plain if isinstance(table.caption, Text) else ""
            flat = " ".join(caption.split())
            if left_out:
                assert DROPPED_NOTE.split(":")[0] in flat and all(h in flat for h in left_out), (width, caption)
            else:
                assert DROPPED_NOTE.split(":")[0] not in flat


# --- piped ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", IDS)
def test_piped_output_has_no_trailing_spaces(case: str, built: Path) -> None:
    padded = [line for line in _run(case, built).piped_output().splitlines() if line != line.rstrip()]
    assert not padded, "\n".join(repr(line) for line in padded[:5])


# --- the mechanism, on tables built inline ------------------------------------------------------


def _table_text(table: RenderableType, width: int) -> str:
    buffer = io.StringIO()
    with whole_names(False):
        _print_tables(Console(file=buffer, width=width, force_terminal=True, color_system=None), table)
    return buffer.getvalue()


def test_columns_leave_in_the_declared_order_before_a_name_is_cut() -> None:
    from tracewhy.renderers.layout import Layout, name, number

    layout = Layout((name("kernel"), number("count"), number("total"), number("mean"), number("max")),
                    drop=("mean", "max"))
    t = layout.table("kernels")
    kernel = "ncclKernel_AllReduce_RING_LL_Sum_float"  # 38 characters
    t.add_row(kernel, "15", "46.762 ms", "3.117 ms", "5.993 ms")
    # kernel 38 + count 5 + total 9 + mean 8 + max 8, and 16 cells of borders and padding: 84.
    assert "mean" in _table_text(t, 84) and kernel in _table_text(t, 84)
    at_80 = _table_text(t, 80)
    assert "mean" not in at_80.split("not shown")[0] and "max" in at_80 and kernel in at_80
    assert "not shown at this width: mean" in at_80
    at_62 = _table_text(t, 62)  # 52 of content and 10 of borders
    assert kernel in at_62 and "max" not in at_62.split("not shown")[0]  # both gone, the name whole
    at_50 = _table_text(t, 50)
    assert kernel not in at_50 and "46.762 ms" in at_50  # only now is the name cut
    assert all(len(line) <= 50 for line in at_50.splitlines())


def test_a_column_of_step_names_shortens_to_numbers_before_anything_leaves() -> None:
    from tracewhy.renderers.layout import Layout, number, step

    t = Layout((step(), number("duration"), number("window")), drop=("window",)).table("steps")
    for i in range(3):
        t.add_row(f"ProfilerStep#{i}", "12.345 ms", "12.500 ms")
    assert "ProfilerStep#2" in _table_text(t, 60)
    narrow = _table_text(t, 33)
    assert "│ #2 " in narrow and "12.500 ms" in narrow and "#N: ProfilerStep#N" in narrow


def test_a_wrap_never_separates_a_number_from_its_unit() -> None:
    from tracewhy.renderers.wrap import wrap_text

    text = "comm is on the critical path for 13.19 ms/step on GPU 0 (5.9% of the 222.41 ms window)"
    for width in range(14, len(text)):  # (narrower, "13.19 ms/step" itself is folded: at its "/")
        lines = wrap_text(text, width)
        assert all(len(line) <= width for line in lines), (width, lines)
        assert " ".join(lines) == text
        for line, after in itertools.pairwise(lines):
            assert not (re.search(r"\d$", line) and re.match(r"(ms|%)", after)), (width, lines)


def test_trailing_spaces_go_in_one_pass_over_a_long_line() -> None:
    """Piped output loses its trailing spaces (before the style codes that close a line) without a
    scan per space: a row of many thousand cells (a kernels table of a trace with long names)
    took seconds with a regex anchored at the line's end."""
    from tracewhy.cli.base import _without_trailing_space

    assert _without_trailing_space("a \x1b[1m \x1b[0m  \n") == "a\x1b[1m\x1b[0m\n"
    assert _without_trailing_space("a b") == "a b"
    row = "cell   " * 200_000 + "\n"  # (1.4 MB: ~1 ms in one pass; the regex took minutes)
    assert _without_trailing_space(row) == row[:-4] + "\n"
