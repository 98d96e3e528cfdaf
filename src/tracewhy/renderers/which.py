"""``which``: the playbook's answers to a symptom, as a terminal table and as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypedDict

from tracewhy.findings.playbook import Answer
from tracewhy.renderers.layout import Layout, text

if TYPE_CHECKING:
    from rich.console import RenderableType


class WhichAnswer(TypedDict):
    symptom: str
    #: The tool to run first.
    tool: str
    #: The exact capture command (or code) to run.
    capture: str
    look_for: str


class WhichPayload(TypedDict):
    """``which``: the first tool to run for a symptom, with the capture command and what to look for."""

    #: The symptom's words, as given ("" for the whole table).
    asked: str
    answers: list[WhichAnswer]


def which_payload(words: list[str], found: list[Answer]) -> WhichPayload:
    return {
        "asked": " ".join(words),
        "answers": [{"symptom": a.symptom, "tool": a.tool, "capture": a.capture, "look_for": a.look_for}
                    for a in found],
    }


#: ``which``: four columns of free text, each wrapped to fit; nothing is left out.
WHICH_TABLE: Final = Layout((text("symptom"), text("tool"), text("capture"), text("look for")), show_lines=True)


def render_which(words: list[str], found: list[Answer]) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    if not found:
        return Text(f"no entry matches {' '.join(words)!r}; `tracewhy which` lists them all")
    t = WHICH_TABLE.table("symptom -> first tool, the capture command, what to look for")
    for a in found:
        t.add_row(a.symptom, a.tool, a.capture, a.look_for)
    return Group(t)
