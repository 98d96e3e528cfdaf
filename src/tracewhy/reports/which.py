"""``which``: the playbook's answers to a symptom (``findings/playbook.py``: which tool to run
first, the exact capture command and what to look for), best match first; every entry for no
words. Imports nothing heavy: ``which`` reads no trace."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracewhy.findings.playbook import Answer, answers
from tracewhy.rows import Rows


@dataclass(frozen=True)
class WhichReport(Rows, rows="answers", key="symptom"):
    """The symptom's words and the playbook's answers to them, best match first."""

    words: tuple[str, ...]
    answers: list[Answer]


def which_report(words: Sequence[str]) -> WhichReport:
    return WhichReport(tuple(words), answers(words))
