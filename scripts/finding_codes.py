"""Print the table of finding codes (docs/finding-codes.md) as Markdown: each code, the severities its rule
gives it, and what it means.

    python scripts/finding_codes.py

Codes and meanings come from ``tracewhy.findings.codes``. Severities are read from the rules'
source, so the table cannot drift from them: the ``Severity`` members in each
``Finding(code=Code.X, severity=...)``, plus those of any function returning ``Severity`` that
the expression calls (``_severity``, ``severity_for_share``). ``diagnose`` re-grades a high,
medium or low finding that recovers time by the share of the step it recovers
(``findings.consolidate``), so such a finding of a diagnose rule can take all three (one that
``explain`` prices with its own fix, ``anti_patterns.OWN_FIX_CODES`` less ``UNPRICED_CODES``,
recovers time too); medium and high need recoverable time and a capture that supports them,
else they are low (``_capped``).
A severity the source does not name shows as "?".
"""

from __future__ import annotations

import ast
from pathlib import Path

from tracewhy.findings.anti_patterns import OWN_FIX_CODES, UNPRICED_CODES
from tracewhy.findings.codes import STRUCTURAL, Code
from tracewhy.findings.consolidate import SEVERITY_FLOOR
from tracewhy.findings.explain import EXPLAINS
from tracewhy.findings.model import Severity
from tracewhy.reports.diagnose import RULES

FINDINGS = Path(__file__).resolve().parent.parent / "src" / "tracewhy" / "findings"
#: What consolidate re-grades by share: a finding of one of these severities with recoverable time.
BY_SHARE = {Severity.HIGH, Severity.MEDIUM, Severity.LOW}


def _members(node: ast.AST, enum: str) -> set[str]:
    """The names of the ``enum.X`` members written anywhere under ``node``."""
    return {n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == enum}


def _named_severities(node: ast.AST) -> set[Severity]:
    return {Severity[name] for name in _members(node, "Severity")}


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _severity_functions(trees: list[ast.Module]) -> dict[str, set[Severity]]:
    """Each function annotated ``-> Severity``, with the members its body can return."""
    return {fn.name: _named_severities(fn) for tree in trees for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef) and isinstance(fn.returns, ast.Name) and fn.returns.id == "Severity"}


def _recovers_time(kw: dict[str | None, ast.expr]) -> bool:
    recoverable = kw.get("recoverable_ns_per_step")
    return recoverable is not None and not (isinstance(recoverable, ast.Constant) and recoverable.value == 0)


def severities_by_code() -> dict[Code, set[Severity]]:
    """The severities each ``Finding(code=Code.X, severity=...)`` in findings/ can give X."""
    trees = {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(FINDINGS.glob("*.py"))}
    functions = _severity_functions(list(trees.values()))
    diagnosed = {rule.__module__.rsplit(".", 1)[-1] for rule in RULES}
    out: dict[Code, set[Severity]] = {}
    for module, tree in trees.items():
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and _callee(n) == "Finding"):
            kw = {k.arg: k.value for k in call.keywords}
            code, severity = kw.get("code"), kw.get("severity")
            if code is None or severity is None:
                continue
            found = _named_severities(severity)
            for inner in (n for n in ast.walk(severity) if isinstance(n, ast.Call)):
                found |= functions.get(_callee(inner) or "", set())
            priced = any(Code[name] in OWN_FIX_CODES - UNPRICED_CODES for name in _members(code, "Code"))
            if module in diagnosed and found & BY_SHARE and (_recovers_time(kw) or priced):
                found |= BY_SHARE
            for name in _members(code, "Code"):  # code=Code.A if ... else Code.B names both
                graded = _above_floor(Code[name], found)
                out.setdefault(Code[name], set()).update(_capped(graded, kw, Code[name]) if module in diagnosed
                                                         else graded)
    return out


def _capped(found: set[Severity], kw: dict[str | None, ast.expr], code: Code) -> set[Severity]:
    """What ``consolidate`` caps a diagnose finding to: medium and high need recoverable time, from
    the rule or from the part of the step it explains (``explain.EXPLAINS``); without either, a
    summary (with ``parts``) is info and any other low. A small capture, or no time after all,
    makes a medium or high one low."""
    serious = found & {Severity.HIGH, Severity.MEDIUM}
    if not serious:
        return found
    if not _recovers_time(kw) and code not in EXPLAINS and code not in STRUCTURAL:
        return (found - serious) | {Severity.INFO if "parts" in kw else Severity.LOW}
    return found | {Severity.LOW}


def _above_floor(code: Code, found: set[Severity]) -> set[Severity]:
    """Without the grades under the code's floor in ``consolidate.SEVERITY_FLOOR`` (the re-grading
    by share never takes such a finding below it)."""
    floor = SEVERITY_FLOOR.get(code)
    if floor is None:
        return found
    order = [Severity.HIGH, Severity.MEDIUM, Severity.LOW]
    return {s for s in found if s not in order or order.index(s) <= order.index(floor)}


def table() -> str:
    """The Markdown table, one row per code in declaration order (trust first)."""
    found = severities_by_code()
    rows = ["| code | severity | meaning |", "|---|---|---|"]
    for code in Code:
        severities = ", ".join(s.value for s in Severity if s in found.get(code, set())) or "?"
        rows.append(f"| `{code}` | {severities} | {code.meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
