"""The documentation's example outputs are real: each file under docs/commands/examples/ is what a
command prints on a named trace, and this test runs the command again (``tracewhy.cli.main`` in
process, output piped) and fails when the file is stale.

``TRACEWHY_UPDATE_DOCS=1 python -m pytest tests/test_docs_examples.py`` rewrites the files (the
same convention as docs/report.png in tests/test_html_report.py). Commands run as typed from the
repository root, with ``../shared/traces`` beside it, so the files show those relative paths and no
path of the machine that made them. Each trace is read once per run of this module.

A file holds the command line, then what it wrote on stderr (reader warnings) and on stdout, with
trailing spaces cut; a non-zero exit status follows as ``$ echo $?``. A ``.json`` file beside it
is an excerpt of the same command's ``--json`` document (the keys the page discusses).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shlex
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, SHARED, shared_trace

DOCS = ROOT / "docs"
EXAMPLES_DIR = DOCS / "commands" / "examples"
UPDATE = bool(os.environ.get("TRACEWHY_UPDATE_DOCS"))

A100_DDP = "../shared/traces/hta/a100_ddp2_rank0_nccl2.17.json.gz"  # 2 ranks of 8 A100s, NCCL, 3 steps
V100 = "../shared/traces/hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz"  # 5 steps, the first warm-up
V100_MEMORY = "../shared/traces/hta/v100_ddp2_rank1_memprofile.json.gz"  # DDP rank 1 with profile_memory
PIPIT = "../shared/traces/nsys/pipit_saxpy_mpi_cuda_a100_2022.2.sqlite.gz"  # nsys export with NVTX ranges
MINIWEATHER = "../shared/traces/ncu/v100_ncar_miniweather_baseline.ncu-rep"  # ncu: all three verdicts
DEMO = "examples/demo_cpu_training.pt.trace.json.gz"
GEN = "tests/data/generated"
GENERATE_LOOP = f"{GEN}/cpu_generate_kv_cache.pt.trace.json.gz"  # one prefill, then 6 decode steps
VLLM_DECODE = "../shared/traces/tracelens/mi300x_vllm_decode_fullgraph_replay.json.gz"  # one decode iteration


def _keys(*names: str, findings: tuple[str, ...] = ()) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An excerpt: these top-level keys, and the findings with these codes."""
    def excerpt(doc: dict[str, Any]) -> dict[str, Any]:
        out = {name: doc[name] for name in names}
        if findings:
            out["findings"] = [f for f in doc["findings"] if f["code"] in findings]
        return out
    return excerpt


def _first(key: str, *names: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An excerpt: these top-level keys and the first row of the list under ``key``."""
    def excerpt(doc: dict[str, Any]) -> dict[str, Any]:
        return {**{name: doc[name] for name in names}, key: doc[key][:1]}
    return excerpt


@dataclass(frozen=True)
class Example:
    """One example file: ``docs/commands/examples/<name>.txt`` (and ``.json`` with ``excerpt``)."""

    name: str
    argv: tuple[str, ...]
    exit_code: int = 0
    excerpt: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    needs: str | None = None  # a module of an optional extra (ncu_report, duckdb)


EXAMPLES = (
    Example("diagnose", ("diagnose", A100_DDP),
            excerpt=_keys("command", "json_schema", "tool", "trace", "warnings", "recoverable_unit", "step_stats",
                          findings=("comm-exposed",))),
    Example("diagnose-demo", ("diagnose", DEMO)),
    Example("diagnose-ranks", ("diagnose", f"{GEN}/ddp_gloo_rank0.pt.trace.json.gz",
                               f"{GEN}/ddp_gloo_rank1.pt.trace.json.gz")),
    Example("steps-runs", ("steps", f"{GEN}/cpu_slow_step_base.pt.trace.json.gz",
                           f"{GEN}/cpu_slow_step_planted.pt.trace.json.gz", "--top", "3"),
            excerpt=_keys("command", "grouping", "comparison")),
    Example("diagnose-recompile", ("diagnose", f"{GEN}/cpu_compile_recompile.pt.trace.json.gz",
                                   "--logs", f"{GEN}/cpu_compile_recompile.torch_logs.txt")),
    Example("gaps", ("gaps", A100_DDP, "--top", "5"),
            excerpt=_first("gaps", "command", "min_gap_ns", "time_origin", "time_origin_ns")),
    Example("info", ("info", A100_DDP)),
    Example("ops", ("ops", A100_DDP, "--top", "8")),
    Example("lines", ("lines", f"{GEN}/cpu_lines_sleep.pt.trace.json.gz", "--top", "5")),
    Example("lines-diagnose-sleep", ("diagnose", f"{GEN}/cpu_lines_sleep.pt.trace.json.gz")),
    Example("lines-diagnose-item", ("diagnose", f"{GEN}/cpu_lines_item.pt.trace.json.gz")),
    Example("kernels", ("kernels", A100_DDP, "--top", "5"),
            excerpt=_first("kernels", "command", "total_count", "total_time_ns", "families")),
    Example("nvtx", ("nvtx", PIPIT)),
    Example("steps", ("steps", V100), excerpt=_first("steps", "command", "marker", "warmup", "stats")),
    Example("steps-throughput", ("steps", DEMO, "--warmup", "1", "--items-per-step", "32", "--unit", "images",
                                 "--top", "3")),
    Example("steps-inference", ("steps", GENERATE_LOOP, "--top", "3")),
    Example("steps-mbu", ("steps", VLLM_DECODE)),
    Example("overlap", ("overlap", A100_DDP)),
    Example("blocks", ("blocks", A100_DDP)),
    Example("blocks-log", ("blocks", f"{GEN}/pipeline/d2")),
    Example("ranks", ("ranks", f"{GEN}/ddp_gloo_rank0.pt.trace.json.gz", f"{GEN}/ddp_gloo_rank1.pt.trace.json.gz")),
    Example("roofline", ("roofline", MINIWEATHER), needs="ncu_report"),
    Example("memory", ("memory", f"{GEN}/cpu_adam_memory.pt.trace.json.gz", "--top", "5")),
    Example("memory-diagnose", ("diagnose", V100_MEMORY)),
    Example("memory-check", ("check", V100_MEMORY, "--max-peak-memory", "6GiB"), exit_code=1),
    Example("memory-timeline", ("memory", f"{GEN}/memory_timeline/cpu_adam_memory_timeline.raw.json.gz")),
    Example("memory-ranks", ("memory", f"{GEN}/cpu_memory_ranks_rank0.pt.trace.json.gz",
                             f"{GEN}/cpu_memory_ranks_rank1.pt.trace.json.gz", "--top", "5")),
    Example("memory-vs", ("memory", f"{GEN}/cpu_memory_vs_a.pt.trace.json.gz", "--vs",
                          f"{GEN}/cpu_memory_vs_b.pt.trace.json.gz", "--top", "5")),
    Example("pipeline", ("pipeline", f"{GEN}/pipeline/d1", "--vs", f"{GEN}/pipeline/d2", "--top", "5"),
            exit_code=1),
    Example("compile", ("compile", f"{GEN}/cpu_compile_break_loop.pt.trace.json.gz",
                        "--logs", f"{GEN}/cpu_compile_break_loop.torch_logs.txt")),
    Example("compile-ttrace", ("compile", f"{GEN}/cpu_ttrace_ranks_rank1.pt.trace.json.gz",
                               "--logs", f"{GEN}/cpu_ttrace_ranks.torch_trace", "--top", "4")),
    Example("compile-check", ("check", f"{GEN}/cpu_compile_break_loop.pt.trace.json.gz", "--max-graph-breaks", "0",
                              "--max-recompiles", "0"), exit_code=1),
    Example("critical-path", ("critical-path", A100_DDP, "--top", "8")),
    Example("account", ("account", A100_DDP, "--top", "8")),
    Example("diff", ("diff", f"{GEN}/cpu_slow_step_base.pt.trace.json.gz",
                     f"{GEN}/cpu_slow_step_planted.pt.trace.json.gz", "--top", "5")),
    Example("check", ("check", f"{GEN}/cpu_slow_step_planted.pt.trace.json.gz", "--max-step-p50", "5ms",
                      "--max-syncs-per-step", "0", "--baseline", f"{GEN}/cpu_slow_step_base.pt.trace.json.gz"),
            exit_code=1),
    Example("check-throughput", ("check", DEMO, "--warmup", "1", "--items-per-step", "32", "--unit", "images",
                                 "--min-throughput", "3500/s"), exit_code=1),
    Example("diff-throughput", ("diff", f"{GEN}/cpu_slow_step_base.pt.trace.json.gz",
                                f"{GEN}/cpu_slow_step_planted.pt.trace.json.gz", "--items-per-step", "8", "--unit",
                                "frames", "--top", "1")),
    Example("sql", ("sql", A100_DDP, "SELECT family, count(*) AS kernels, sum(dur_ns) AS total_ns FROM kernels "
                                     "GROUP BY family ORDER BY total_ns DESC LIMIT 5"), needs="duckdb"),
    Example("export", ("export", A100_DDP, "-o", "annotated.json.gz")),
    Example("report", ("report", V100, "-o", "report.html")),
    Example("which", ("which", "gaps")),
    Example("capture-nsys", ("capture", "nsys", "--dry-run", "--", "python", "train.py")),
    Example("capture-ncu", ("capture", "ncu", "--kernel", "gemm", "--dry-run", "--", "python", "train.py")),
    Example("schema", ("schema",)),
)

_SHARED = re.compile(r"^\.\./shared/traces/(.+)$")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A stand-in for the repository root, with ../shared beside it, where commands run as typed.

    Its tests/ and examples/ are the repository's; ../shared is the shared folder wherever it is
    (TRACEWHY_SHARED). Outputs (export, report) are written in it. The reader is memoized for the
    module: each trace is read once, whichever commands read it."""
    import tracewhy.readers as readers

    base = tmp_path_factory.mktemp("docs")
    repo = base / "repo"
    repo.mkdir()
    for name in ("tests", "examples"):
        (repo / name).symlink_to(ROOT / name)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED)
    read = readers.read_trace
    memo: dict[tuple[str, frozenset[Any] | None], Any] = {}

    def read_once(path: str | Path, **options: Any) -> Any:
        kinds = options.get("kinds")
        key = str(Path(path).resolve()), (frozenset(kinds) if kinds else None)
        whole = memo.get((key[0], None))
        if whole is not None:  # a whole Trace answers a read of some kinds, as the parse cache's does
            return whole
        if key not in memo:
            memo[key] = read(path, **options)
        return memo[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(readers, "read_trace", read_once)
        mp.setenv("TRACEWHY_NO_CACHE", "1")
        for name in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
            mp.delenv(name, raising=False)
        mp.chdir(repo)
        yield repo


def run(argv: tuple[str, ...], workdir: Path) -> tuple[int, str, str]:
    """``tracewhy ARGV`` in process, stdout and stderr piped: (exit status, stdout, stderr)."""
    from tracewhy.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, _portable(out.getvalue(), workdir), _portable(err.getvalue(), workdir)


def _portable(text: str, workdir: Path) -> str:
    """Without this machine's paths (a reader may print a path resolved), trailing spaces cut."""
    for path, shown in ((workdir, "."), (SHARED.resolve(), "../shared"), (ROOT, ".")):
        text = text.replace(f"{path}/", f"{shown}/").replace(str(path), shown)
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def transcript(example: Example, code: int, out: str, err: str) -> str:
    lines = f"$ tracewhy {shlex.join(example.argv)}\n{err}{out}"
    if code != 0:
        lines += f"$ echo $?\n{code}\n"
    return lines


def _needs(example: Example) -> None:
    if example.needs is not None and importlib.util.find_spec(example.needs) is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs the extra that brings {example.needs}")
        pytest.skip(f"the {example.name} example needs {example.needs} (an optional extra)")
    for arg in example.argv:
        match = _SHARED.match(arg)
        if match:
            shared_trace(match.group(1))  # skips where ../shared is absent (fails in CI)


def _compare(path: Path, text: str) -> None:
    if UPDATE:
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: TRACEWHY_UPDATE_DOCS=1 writes it"
    assert path.read_text(encoding="utf-8") == text, (
        f"{path.relative_to(ROOT)} is stale: TRACEWHY_UPDATE_DOCS=1 python -m pytest tests/test_docs_examples.py "
        "rewrites it (and check the page's prose still matches)")


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_output_is_current(example: Example, workdir: Path) -> None:
    _needs(example)
    code, out, err = run(example.argv, workdir)
    assert code == example.exit_code, err
    text = transcript(example, code, out, err)
    for machine_path in (str(ROOT), str(workdir), str(SHARED.resolve())):
        assert machine_path not in text
    _compare(EXAMPLES_DIR / f"{example.name}.txt", text)
    if example.excerpt is not None:
        code, out, err = run((*example.argv, "--json"), workdir)
        assert code == example.exit_code, err
        doc = example.excerpt(json.loads(out))
        _compare(EXAMPLES_DIR / f"{example.name}.json",
                 json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _page_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md")))


def test_every_example_file_is_made_here_and_shown_on_a_page() -> None:
    """No orphan: each file in the examples folder is one this test makes, and a page includes it."""
    made = {f"{e.name}.txt" for e in EXAMPLES} | {f"{e.name}.json" for e in EXAMPLES if e.excerpt}
    present = {p.name for p in EXAMPLES_DIR.iterdir()} if EXAMPLES_DIR.is_dir() else set()
    if UPDATE:
        for stale in present - made:
            (EXAMPLES_DIR / stale).unlink()
        present &= made
    assert sorted(present - made) == [], "example files no test makes"
    pages = _page_text()
    assert sorted(name for name in made if f'--8<-- "commands/examples/{name}"' not in pages) == []


def test_every_command_has_a_page_with_an_example() -> None:
    from tracewhy.cli.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        page = DOCS / "commands" / f"{name}.md"
        assert page.exists(), f"no page for tracewhy {name}"
        assert "--8<-- \"commands/examples/" in page.read_text(encoding="utf-8"), f"{page.name} shows no example"


#: Options every command takes, documented once on commands/index.md.
COMMON_OPTIONS = {"-h", "--help", "--json", "--top", "--no-cache", "--wide", "--color"}


def test_every_option_is_documented_on_its_command_page() -> None:
    """A command page names each option its parser has (a new option needs a word on its page)."""
    from tracewhy.cli import build_parser
    from tracewhy.cli.commands import COMMAND_MODULES

    commands = build_parser().commands  # type: ignore[attr-defined]  # (the top parser keeps its subparsers)
    missing = []
    for name in COMMAND_MODULES:
        page = (DOCS / "commands" / f"{name}.md").read_text(encoding="utf-8")
        for action in commands[name]._actions:
            long = [s for s in action.option_strings if s.startswith("--")]
            if long and not set(long) & COMMON_OPTIONS and not any(f"`{s}" in page for s in long):
                missing.append(f"{name} {long[0]}")
    index = (DOCS / "commands" / "index.md").read_text(encoding="utf-8")
    missing += [f"index {o}" for o in sorted(COMMON_OPTIONS - {"-h", "--help"}) if f"`{o}" not in index]
    assert missing == []
