"""The self-contained HTML report: the JSON report (``renderers.report``, in the envelope every
``--json`` output has) inside a template with tracewhy's script and the vendored, pinned uPlot
inlined. No network: a Content-Security-Policy allows nothing to load and only the page's own
scripts (by hash) to run.

The report of several traces (``RunsReportPayload``) is one page with a part per trace, each the
single trace's page body: ``report.js`` runs once per part, unchanged, after ``runs_next.js`` has
given that part the element ids and the data it reads (``runs.js`` draws the comparison first).

Trace strings reach the page only as JSON data in a ``<script type="application/json">`` block,
with ``<``, ``>``, ``&`` and the line separators escaped, and are put into the page with
``textContent``; the CSP would block an injected script or handler even if one got through.
Control and bidi characters in them are shown as escapes (``visible_strings``).
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from typing import Any, Final

import msgspec

from tracewhy import __version__
from tracewhy.renderers.jsonout import encode_json

UPLOT_VERSION: Final = "1.6.32"
_ESCAPES: Final = ((b"&", b"\\u0026"), (b"<", b"\\u003c"), (b">", b"\\u003e"),
                   ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"))


def script_safe(json_bytes: bytes) -> str:
    """JSON that can sit inside a <script> element: no <, >, & or line separators in it. These
    only occur inside JSON strings, where the \\u escapes mean the same characters."""
    for raw, escaped in _ESCAPES:
        json_bytes = json_bytes.replace(raw, escaped)
    return json_bytes.decode()


#: Characters a page would act on instead of showing: C0 and C1 controls (ESC among them; tab
#: and newline are layout) and the bidi controls that reorder the text around them (U+200E-F,
#: U+202A-E, U+2066-9), as ``units.printable`` takes them for a terminal.
_INVISIBLE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(text: str) -> str:
    return _INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def visible_strings(value: Any) -> Any:
    """``value`` (a JSON document) with every string in it, keys too, showing its control and
    bidi characters as escapes (``\\x1b``, ``\\u202e``): the one escape every page's strings go
    through, so a trace string cannot reorder or hide the text around it in the page."""
    if isinstance(value, str):
        return _visible(value)
    if isinstance(value, dict):
        return {_visible(k) if isinstance(k, str) else k: visible_strings(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [visible_strings(v) for v in value]
    return value


def _page_json(doc: dict[str, Any]) -> str:
    """The document as the page embeds it: plain JSON values (structs and dataclasses encoded
    first, so no string escapes the walk), strings made visible, safe inside a script element."""
    plain = msgspec.json.decode(encode_json(doc, indent=False))
    return script_safe(encode_json(visible_strings(plain), indent=False))


def _asset(name: str) -> str:
    return resources.files("tracewhy.renderers").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def _csp_hash(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def render_html(doc: dict[str, Any]) -> str:
    """The page for an envelope (``jsonout.envelope``) around a payload of ``renderers.report``:
    the same document ``report --json`` prints."""
    if "inputs" in doc:
        return _render_runs(doc)
    uplot_js, report_js = _asset("uPlot.iife.min.js"), _asset("report.js")
    values = {
        "SCRIPT_HASHES": f"{_csp_hash(uplot_js)} {_csp_hash(report_js)}",
        "TOOL_VERSION": __version__,
        "UPLOT_CSS": _asset("uPlot.min.css"),
        "REPORT_CSS": _asset("report.css"),
        "REPORT_JSON": _page_json(doc),
        "UPLOT_JS": uplot_js,
        "REPORT_JS": report_js,
    }
    # One pass over the template: inserted text (which holds trace strings) is never re-scanned.
    return re.sub(r"__([A-Z_]+)__", lambda m: values[m.group(1)], _asset("report.html"))


#: What a part of the page of several traces holds: the single page's trace line and body.
_PART: Final = re.compile(r'<div id="trace-info"></div>.*?</header>\s*(<main>.*</main>)', re.DOTALL)


def _render_runs(doc: dict[str, Any]) -> str:
    """The page of several traces: the comparison, then one part per trace."""
    uplot_js, report_js = _asset("uPlot.iife.min.js"), _asset("report.js")
    runs_js, next_js = _asset("runs.js"), _asset("runs_next.js")
    found = _PART.search(_asset("report.html"))
    assert found is not None, "report.html lost its trace line or its body"
    body = '<div data-id="trace-info"></div>' + found.group(1).replace(' id="', ' data-id="')
    parts = "\n".join(f'<article class="run" id="run-{k}"><h2 class="run-path"></h2>{body}</article>'
                      for k in range(len(doc["inputs"])))
    values = {
        "SCRIPT_HASHES": " ".join(_csp_hash(s) for s in (uplot_js, runs_js, next_js, report_js)),
        "TOOL_VERSION": __version__,
        "UPLOT_CSS": _asset("uPlot.min.css"),
        "REPORT_CSS": _asset("report.css"),
        "REPORT_JSON": _page_json(doc),
        "UPLOT_JS": uplot_js,
        "RUNS_JS": runs_js,
        "RUN_PARTS": parts,
        "RUN_SCRIPTS": "\n".join(f"<script>{next_js}</script>\n<script>{report_js}</script>" for _ in doc["inputs"]),
    }
    return re.sub(r"__([A-Z_]+)__", lambda m: values[m.group(1)], _asset("report_runs.html"))
