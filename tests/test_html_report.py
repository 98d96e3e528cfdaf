"""``tracewhy report``: a self-contained HTML file that a real browser renders without errors,
whose charts draw, and in which trace strings stay text.

The browser tests drive Debian's ``chromium`` through Playwright (``pip install playwright``;
never ``playwright install``: the system binary is used). Without them the tests skip locally
and fail under CI. The screenshot goes to ``ci-artifacts/report.png`` (git-ignored).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builders import KinetoBuilder
from conftest import GENERATED, ROOT, shared_trace
from tracewhy.cli import main
from tracewhy.renderers.html import script_safe

CHROMIUM = os.environ.get("TRACEWHY_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "ci-artifacts"
PAYLOADS = (
    '<img src=x onerror="window.__pwned=1">',
    "<script>window.__pwned=2</script>",
    "</script><script>window.__pwned=3</script>",
    '"><svg onload="window.__pwned=4">',
    "\u2028</script>&lt;b&gt;",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must have playwright (pip install playwright) for the HTML report tests")
        pytest.skip("playwright is not installed")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
        pytest.skip(f"no chromium at {CHROMIUM}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync",
        ])
        yield b
        b.close()


class Page:
    """One report opened in the browser, with everything it logged."""

    def __init__(self, browser: Any, html: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.messages: list[tuple[str, str]] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.messages.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.messages.append(("pageerror", str(e))))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(html.as_uri())
        self.page.wait_for_load_state("load")

    @property
    def errors(self) -> list[tuple[str, str]]:
        return [m for m in self.messages if m[0] in ("error", "pageerror")]

    def shown_sections(self) -> set[str]:
        ids: list[str] = self.page.evaluate(
            "() => Array.from(document.querySelectorAll('section')).filter(s => !s.hidden).map(s => s.id)")
        return set(ids)

    def painted_pixels(self) -> list[int]:
        """Per canvas, how many pixels are not fully transparent."""
        counts: list[int] = self.page.evaluate("""() => Array.from(document.querySelectorAll('canvas')).map(c => {
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) { if (d[i]) { n++; } } return n; })""")
        return counts


def _report(trace: Path, out: Path) -> Path:
    assert main(["report", "--no-cache", str(trace), "-o", str(out)]) == 0
    return out


def test_gpu_report_renders_without_errors(browser: Any, tmp_path: Path) -> None:
    html = _report(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz"), tmp_path / "report.html")
    page = Page(browser, html)
    assert page.errors == []
    assert {"findings", "steps", "utilization", "gaps", "overlap", "blocks", "ops", "kernels"} <= page.shown_sections()
    assert "ranks" not in page.shown_sections()  # one trace: no rank heatmap
    pixels = page.painted_pixels()
    assert len(pixels) == 2 and all(n > 1000 for n in pixels)  # step-time and utilization charts drew
    assert all(url.startswith("file://") for url in page.requests)  # nothing from the network
    first = page.page.text_content("#findings-list li")
    assert first and first.strip()
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000


def test_tables_sort_on_click(browser: Any, tmp_path: Path) -> None:
    page = Page(browser, _report(GENERATED / "cpu_slow_step_planted.pt.trace.json.gz", tmp_path / "r.html"))
    assert page.errors == []
    calls = "#ops-table th:nth-child(2)"
    page.page.click(calls)  # numeric columns sort largest first
    values = [int(v) for v in page.page.eval_on_selector_all("#ops-table tbody td:nth-child(2)",
                                                            "tds => tds.map(t => t.textContent)")]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]
    page.page.click(calls)
    values = [int(v) for v in page.page.eval_on_selector_all("#ops-table tbody td:nth-child(2)",
                                                            "tds => tds.map(t => t.textContent)")]
    assert values == sorted(values)
    # A CPU-only trace has steps but no GPU: those sections stay out, the step chart draws.
    shown = page.shown_sections()
    assert {"steps", "ops", "findings"} <= shown and not {"utilization", "gaps", "overlap"} & shown
    assert len(page.painted_pixels()) == 1


def test_ranks_input_gives_a_heatmap(browser: Any, tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in (0, 1):  # two ranks of one 128-rank job (MANIFEST.md)
        src = shared_trace(f"hta/sampled_128rank_job_rank{r}.json.gz")
        (ranks / src.name).write_bytes(src.read_bytes())
    page = Page(browser, _report(ranks, tmp_path / "ranks.html"))
    assert page.errors == []
    assert "ranks" in page.shown_sections()
    cells = page.page.eval_on_selector_all("#ranks-heatmap tr", "rows => rows.map(r => r.children.length)")
    assert len(cells) == 3 and len(set(cells)) == 1 and cells[0] > 4  # header + ranks 0 and 1
    first_col = page.page.eval_on_selector_all("#ranks-heatmap td.text", "tds => tds.map(t => t.textContent)")
    assert first_col == ["0", "1"]


def test_ncu_input_gives_roofline_and_verdicts(browser: Any, tmp_path: Path) -> None:
    # miniWeather on a V100: 5 kernels with roofline metrics (MANIFEST.md of ../shared/traces/ncu).
    page = Page(browser, _report(shared_trace("ncu/v100_ncar_miniweather_baseline.ncu-rep"), tmp_path / "ncu.html"))
    assert page.errors == []
    assert {"roofline", "verdicts"} <= page.shown_sections()
    assert [n > 1000 for n in page.painted_pixels()] == [True]
    rows = page.page.eval_on_selector_all("#verdicts-table tbody tr", "rows => rows.length")
    assert rows == 5


def _hostile_trace(tmp_path: Path) -> Path:
    b = KinetoBuilder()
    for i in range(4):
        t0 = i * 1000.0
        b.annotation(f"ProfilerStep#{i}", t0, 900)
        for j, payload in enumerate(PAYLOADS):
            b.annotation(payload, t0 + 10 + j * 100, 80)
            b.op(payload, t0 + 12 + j * 100, 60)
            b.launch(payload, t0 + 14 + j * 100, 5, t0 + 300 + j * 100, 30)
    return b.write(tmp_path / "hostile.json")


def test_trace_strings_run_nothing(browser: Any, tmp_path: Path) -> None:
    html = _report(_hostile_trace(tmp_path), tmp_path / "hostile.html")
    text = html.read_text()
    for payload in PAYLOADS:
        assert payload not in text  # only in escaped form, inside the JSON block
    page = Page(browser, html)
    assert page.page.evaluate("() => typeof window.__pwned") == "undefined"
    assert page.errors == []  # not even a blocked script: nothing was injected
    body = page.page.inner_text("body")
    for payload in PAYLOADS[:4]:
        assert payload in body  # shown as text, in the tables
    assert page.page.evaluate("() => document.querySelectorAll('img, svg').length") == 0


def test_json_block_and_csp_by_construction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The escaping keeps every string out of HTML and decodes back to the same text.
    raw = json.dumps({"k": "</script><!-- & \u2028 \u2029 >"}).encode()
    safe = script_safe(raw)
    assert not set("<>&\u2028\u2029") & set(safe)
    assert json.loads(safe) == json.loads(raw)
    html = _report(GENERATED / "cpu_slow_step_base.pt.trace.json.gz", tmp_path / "r.html").read_text()
    csp = re.search(r'script-src ([^;"]+)', html)
    assert csp is not None
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    assert len(scripts) == 2  # uPlot and the report's code; the data block is not a script
    hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'" for s in scripts}
    assert set(csp.group(1).split()) == hashes
    assert "http://" not in html.split("<script")[0] and "https://" not in html.split("<script")[0]
    # The page is the JSON report plus a template: `report --json` prints the same document.
    assert main(["report", "--json", str(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")]) == 0
    doc = json.loads(capsys.readouterr().out)
    block = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, flags=re.S)
    assert block is not None and json.loads(block.group(1)) == doc


def test_vendored_assets_are_the_pinned_release() -> None:
    assets = ROOT / "src" / "tracewhy" / "renderers" / "assets"
    readme = (assets / "README.md").read_text()
    for name in ("uPlot.iife.min.js", "uPlot.min.css"):
        digest = hashlib.sha256((assets / name).read_bytes()).hexdigest()
        assert f"`{name}` | npm package `uplot`" in readme and digest in readme, name
    assert (assets / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert "MIT" in (assets / "LICENSE-uPlot").read_text() or "Permission is hereby granted" in (
        assets / "LICENSE-uPlot").read_text()


def test_report_needs_an_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(GENERATED / "cpu_slow_step_base.pt.trace.json.gz")]) == 2
    assert "-o FILE" in capsys.readouterr().err


# --- readable charts and tables -----------------------------------------------------------------

#: Five steps on a V100, the first (35 ms among 96 ms) excluded as warm-up (MANIFEST.md).
WARMUP_TRACE = "hta/v100_rank0_displayTimeUnit_ns_fractional_us.json.gz"
#: The README's and docs' screenshot, made from the same trace by this test run (TRACEWHY_UPDATE_DOCS=1 rewrites it).
DOCS_SCREENSHOT = ROOT / "docs" / "report.png"


def _chart(page: Page, chart_id: str) -> dict[str, str]:
    """What a chart's axes say: its aria-label (the axis titles) and the tick labels it drew."""
    found: dict[str, str] = page.page.evaluate("""id => { const e = document.getElementById(id);
        return { label: e.getAttribute('aria-label') || '', x: e.dataset.xTicks || '', y: e.dataset.yTicks || '',
                 points: e.dataset.pointLabels || '' }; }""", chart_id)
    return found


def _legend_values(page: Page) -> list[str]:
    values: list[str] = page.page.eval_on_selector_all(".u-legend .u-value", "cells => cells.map(c => c.textContent)")
    return values


def _pixels_near(page: Page, chart_id: str, rgba: tuple[int, int, int, int], tolerance: int = 12) -> int:
    """Pixels of a chart's canvas within ``tolerance`` of a colour and opacity."""
    count: int = page.page.evaluate("""([id, rgb, tol]) => {
        const c = document.querySelector('#' + id + ' canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) {
          const near = [0, 1, 2, 3].every(k => Math.abs(d[i + k] - rgb[k]) <= tol);
          if (near) { n++; }
        }
        return n; }""", [chart_id, list(rgba), tolerance])
    return count


def test_step_chart_names_steps_starts_at_zero_and_sets_warmup_apart(browser: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tracewhy.analyses.steps import StepCol, steps
    from tracewhy.readers import read_trace

    trace = shared_trace(WARMUP_TRACE)
    result = steps(read_trace(trace))
    names = result.table.get_column(StepCol.NAME).to_list()
    assert result.warmup == 1 and len(names) == 5
    # Read by its bare name, so the page (and the docs' screenshot) shows no path of this machine.
    (tmp_path / trace.name).write_bytes(trace.read_bytes())
    monkeypatch.chdir(tmp_path)
    page = Page(browser, _report(Path(trace.name), tmp_path / "r.html"))
    assert page.errors == []
    chart = _chart(page, "steps-chart")
    assert chart["label"] == "x: step (ProfilerStep#N); y: step time (ms)"
    assert ["ProfilerStep#" + tick for tick in chart["x"].split("|")] == names  # by name, not 1..5
    assert chart["y"].split("|")[0] == "0"  # from zero: a 2% spread is not zoomed to fill the axis
    warm, steady = (255, 127, 14, 115), (31, 119, 180, 153)  # the bars' fills (RGBA on the canvas)
    assert _pixels_near(page, "steps-chart", warm) > 500 and _pixels_near(page, "steps-chart", steady) > 2000
    ARTIFACTS.mkdir(exist_ok=True)
    shot = {"clip": {"x": 0, "y": 0, "width": 1280, "height": 1500}, "full_page": True}
    page.page.screenshot(path=str(ARTIFACTS / "report-top.png"), **shot)
    if os.environ.get("TRACEWHY_UPDATE_DOCS"):
        DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
        page.page.screenshot(path=str(DOCS_SCREENSHOT), **shot)


def test_the_readme_screenshot_is_committed() -> None:
    head = DOCS_SCREENSHOT.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(head[16:20], "big") == 1280  # the width the test above shoots


def test_legends_show_values_only_on_hover(browser: Any, tmp_path: Path) -> None:
    page = Page(browser, _report(shared_trace(WARMUP_TRACE), tmp_path / "r.html"))
    values = _legend_values(page)
    assert values and all(v == "" for v in values)  # no "--" for every series in a static view
    over = page.page.locator("#steps-chart .u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    assert box is not None
    page.page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)  # over the last step
    hovered = [v for v in _legend_values(page) if v]
    assert "105" in hovered[0] and any(v.endswith(" ms") for v in hovered)
    page.page.mouse.move(0, 0)
    assert all(v == "" for v in _legend_values(page))


def test_times_run_from_the_stated_origin_and_numbers_keep_their_units(browser: Any, tmp_path: Path) -> None:
    page = Page(browser, _report(shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz"), tmp_path / "r.html"))
    chart = _chart(page, "utilization-chart")
    assert "x: ms since the trace start" in chart["label"]
    assert not [t for t in chart["x"].split("|") if t.startswith("-")]  # no axis before the origin
    header = page.page.text_content("#gaps-table th:nth-child(2)")
    assert header is not None and "from trace start" in header
    starts = page.page.eval_on_selector_all("#gaps-table tbody td:nth-child(2)", "tds => tds.map(t => t.textContent)")
    assert starts and all(float(s) >= 0 for s in starts)
    # Every number with a unit sits on one line ("15.719 / ms" wrapped in a narrow column).
    page.page.set_viewport_size({"width": 700, "height": 900})
    lines = page.page.evaluate("""() => Array.from(document.querySelectorAll('td:not(.text)'))
        .filter(td => / (ms|µs|ns|s|%)$/.test(td.textContent)).map(td => {
          const r = document.createRange(); r.selectNodeContents(td); return r.getClientRects().length; })""")
    assert lines and set(lines) == {1}


def test_roofline_axes_read_in_si_units_and_the_top_ops_are_labelled(browser: Any, tmp_path: Path) -> None:
    page = Page(browser, _report(shared_trace("tracelens/h100_qwen1.5-0.5b_bs16_seq2048.json.gz"), tmp_path / "q.html"))
    assert page.errors == []
    chart = _chart(page, "roofline-chart")
    y = [t for t in chart["y"].split("|") if t]
    x = [t for t in chart["x"].split("|") if t]
    assert y and all(re.fullmatch(r"[\d.]+ [kMGTP]?FLOP/s", t) for t in y), y  # 1 PFLOP/s, not 1.00e+15
    assert "1 PFLOP/s" in y and "100 TFLOP/s" in y
    assert x and all(re.fullmatch(r"[\d.]+ k?FLOP/B", t) for t in x), x
    labels = chart["points"].split("|")
    assert labels[0] == "mm [8944,1024][1024,2816]"  # the op with most GPU time, with its shapes
    assert len(labels) >= 3


def test_where_the_step_goes_is_one_stacked_bar_per_step(browser: Any, tmp_path: Path) -> None:
    """The account section: one bar per analysed step whose segments are that step's parts (they
    add up to its window, as the page's own JSON gives them), a colour per kind with a legend, the
    values in a table; the busy chart draws kernels and copies apart; the block table is a table."""
    trace = shared_trace("hta/a100_ddp2_rank0_nccl2.17.json.gz")
    html = _report(trace, tmp_path / "report.html")
    page = Page(browser, html)
    assert page.errors == [] and "account" in page.shown_sections()
    bars = page.page.evaluate("""() => Array.from(document.querySelectorAll('#account-bars .cp-row')).map(r =>
        Array.from(r.querySelectorAll('[data-part]')).map(s => [s.getAttribute('data-part'),
                                                               Number(s.getAttribute('data-ns')),
                                                               s.style.background]))""")
    data = json.loads(page.page.text_content("#report-data") or "{}")["account"]
    assert len(bars) == len(data["steps"]) == 3
    for bar, step in zip(bars, data["steps"], strict=True):
        assert sum(ns for _, ns, _ in bar) == step["window_ns"]
        assert {p for p, _, _ in bar} == set(step["parts"])
    colour = {}
    kinds = {p["part"]: p["kind"] for p in data["parts"]}
    for part, _, background in (seg for bar in bars for seg in bar):
        assert colour.setdefault(kinds[part], background) == background  # one colour per kind
    legend = page.page.inner_text("#account-legend")
    assert all(k.replace("_", " ") in legend for k in set(kinds.values()))
    assert "forward" in page.page.inner_text("#account-table")
    labels = page.page.evaluate("() => Array.from(document.querySelectorAll('#utilization .u-legend th'))"
                                ".map(t => t.textContent)")
    assert any("kernels %" in t for t in labels)
    assert page.page.evaluate("() => document.querySelectorAll('#findings-list li table').length") == 1


def test_account_part_names_stay_text(browser: Any, tmp_path: Path) -> None:
    html = _report(_hostile_trace(tmp_path), tmp_path / "hostile.html")
    page = Page(browser, html)
    assert page.page.evaluate("() => typeof window.__pwned") == "undefined" and page.errors == []
    shown = page.page.inner_text("#account") if "account" in page.shown_sections() else ""
    assert any(p in shown for p in PAYLOADS[:4])


def test_mfu_section_shows_each_step_and_region(browser: Any, tmp_path: Path) -> None:
    # TraceLens' H100 BERT run (bf16, with_modules): the section shows the step's MFU as the
    # page's own JSON has it, and a row per nn.Module region; a CPU trace shows FLOP/s, no MFU.
    html = _report(shared_trace("tracelens/h100_bert-small_bs1_seq512.json.gz"), tmp_path / "bert.html")
    page = Page(browser, html)
    assert page.errors == [] and "mfu" in page.shown_sections()
    data = json.loads(page.page.text_content("#report-data") or "{}")["mfu"]
    step = data["steps"][0]
    note = page.page.inner_text("#mfu-note")
    assert note.startswith(f"MFU {100 * data['steady_mfu']:.1f}% of the H100 SXM peak")
    cells = page.page.evaluate("() => Array.from(document.querySelectorAll('#mfu-tables table')).map(t =>"
                               " Array.from(t.querySelectorAll('tbody tr')).map(r => r.innerText))")
    assert len(cells) == 2 and len(cells[0]) == 1 and f"{100 * step['mfu']:.1f}%" in cells[0][0]
    assert len(cells[1]) == min(len(data["regions"]), 50) and "nn.Module: BertLMHeadModel_0" in cells[1][0]
    cpu = Page(browser, _report(GENERATED / "cpu_flops_attention.pt.trace.json.gz", tmp_path / "cpu.html"))
    assert cpu.errors == [] and "mfu" in cpu.shown_sections()
    assert cpu.page.inner_text("#mfu-note").startswith("MFU: none, no GPU work")


def test_a_findings_step_names_the_replayed_steps_where_they_differ(browser: Any, tmp_path: Path) -> None:
    """HTA's V100 DDP rank: 5 analysed steps, of which the fixes replay 4 (a graph of over 100 k
    edges); each finding's "step X → Y" starts from their mean, and the page says so, as the
    terminal's header does (the page's own JSON gives the steps). The demo replays all 16: no note."""
    html = _report(shared_trace("hta/v100_ddp2_rank1_memprofile.json.gz"), tmp_path / "v100.html")
    page = Page(browser, html)
    assert page.errors == []
    replayed = json.loads(page.page.text_content("#report-data") or "{}")["replayed"]
    assert (replayed["steps"], replayed["of_steps"]) == (4, 5)
    spans = page.page.evaluate("() => Array.from(document.querySelectorAll('#findings-list .recover'))"
                               ".map(s => s.textContent)")
    stepped = [s for s in spans if "with the fix" in s]
    assert stepped and all("the 4 of 5 analysed steps the fixes were replayed on" in s for s in stepped)
    demo = Path(__file__).resolve().parents[1] / "examples" / "demo_cpu_training.pt.trace.json.gz"
    page = Page(browser, _report(demo, tmp_path / "demo.html"))
    spans = page.page.evaluate("() => Array.from(document.querySelectorAll('#findings-list .recover'))"
                               ".map(s => s.textContent)")
    assert any("with the fix" in s for s in spans) and not any("replayed on" in s for s in spans)
