"""The roofline analyses measure and the roofline findings judge (DESIGN: "Analyses measure;
findings/ judges"): no verdict words or sentences in analyses/roofline*.py, no verdict columns
in what they return, and judging leaves every measured number as it was."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import polars as pl
import pytest

import tracewhy.analyses
from conftest import shared_trace
from tracewhy.analyses.roofline import measure_roofline
from tracewhy.findings.roofline import VerdictCol, judge_roofline
from tracewhy.model.ncu import NcuCol
from tracewhy.readers.ncu.reader import read_ncu

ANALYSES = Path(tracewhy.analyses.__file__).parent
ROOFLINE_ANALYSES = sorted(ANALYSES.glob("roofline*.py"))

#: Words a verdict is made of: the bound, what limits it, and the advice.
VERDICT_WORDS = re.compile(
    r"\b(bound|limited|limits?|consider|should|try|idle|slow|stalls?|spills?|waiting|throttled|"
    r"locked|uncoalesced|below|near|too few|close behind)\b", re.IGNORECASE)
#: Literal text of an f-string that holds two words in a row builds a sentence.
TWO_WORDS = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}")


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes: they explain the module to its reader and are not output."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def prose(source: str) -> list[str]:
    """Verdict words in string literals (docstrings aside) and sentence-building f-strings."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if VERDICT_WORDS.search(node.value):
                found.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if TWO_WORDS.search(text):
                found.append(text)
    return found


def test_the_check_finds_the_prose_analyses_used_to_write() -> None:
    # Lines the ncu roofline analysis wrote before the split, and one plain label it may keep.
    assert prose('reason = f"SM at {sm:.0f}% of peak (memory {mem})"')
    assert prose('bound = "memory-bound"')
    assert prose('detail = "too few blocks to fill the GPU"')
    assert prose('x = f"{local:,.0f} local-memory instructions: register spills go to memory"')
    assert not prose('"""Docstrings may say memory-bound."""\nLIMITER = "shared memory"')


@pytest.mark.parametrize("path", ROOFLINE_ANALYSES, ids=lambda p: p.name)
def test_roofline_analyses_write_no_verdict_prose(path: Path) -> None:
    assert prose(path.read_text()) == []


def test_roofline_thresholds_live_with_the_findings() -> None:
    assert len(ROOFLINE_ANALYSES) >= 3 and not (ANALYSES / "roofline_thresholds.py").exists()


def test_measures_carry_no_verdict_and_judging_keeps_every_number() -> None:
    measures = measure_roofline(read_ncu(shared_trace("ncu/a100pcie_mistic_multikernel_basic.ncu-rep")))
    verdicts = {v for k, v in vars(VerdictCol).items() if k.isupper()}
    assert not verdicts & set(measures.launches.columns)
    judged = judge_roofline(measures)
    shared = [c for c in judged.launches.columns if c in measures.launches.columns]
    assert len(shared) > 30
    by_launch = NcuCol.LAUNCH
    assert judged.launches.select(shared).sort(by_launch).equals(measures.launches.select(shared).sort(by_launch))
    assert judged.launches.get_column(VerdictCol.BOUND).null_count() == 0
    assert judged.kernels.height == measures.launches.select(pl.col(NcuCol.NAME).n_unique()).item()
