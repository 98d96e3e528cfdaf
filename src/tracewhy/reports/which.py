"""``which``: the playbook's answers to a symptom (``findings/playbook.py``: which tool to run
first, the exact capture command and what to look for), best match first; every entry for no
words. Imports nothing heavy: ``which`` reads no trace."""

from __future__ import annotations

from collections.abc import Sequence

from tracewhy.findings.playbook import Answer, answers


def which_report(words: Sequence[str]) -> list[Answer]:
    return answers(words)
