"""How a name (kernel, op, annotation, file) is shown in a table column narrower than the name:
its structural short forms, picked per table so that rows stay apart, and cuts in the middle.

C++ names are read by their structure, never matched against known kernels: a demangled
signature is a return type, a qualified name, template arguments and a parameter list, and the
short forms drop, in turn, what tells the least (``void``, namespaces, parameter lists, trailing
template arguments). Names without that structure (Triton, cuBLAS, ops) are only ever cut."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tracewhy.units import names_whole, printable

# --- cuts ---------------------------------------------------------------------------------------

#: Characters after the point where names differ that a cut keeps, so the difference is readable.
_CONTEXT: Final = 12
_TOKEN_BREAKS: Final = frozenset("<>(), :")
#: Where a cut may fall: after (at the head) or before (at the tail) one of these, so that a cut
#: keeps whole words, numbers and step names (``ProfilerStep#6 >…``, not ``ProfilerSte…``).
_CUT_AFTER: Final = frozenset(" <>(),:/_.-[]{}=;|")
#: How far a cut moves to reach such a place: further, it cuts the word.
_SNAP: Final = 8


def cut_middle(text: str, width: int, keep_from: int = 0) -> str:
    """``text`` in at most ``width`` characters: its head, ``…``, and its tail, never its end cut
    off. ``keep_from``: the index where it starts to differ from its neighbours in a table; when
    the head cannot reach it, a window around it is kept between two ellipses. Cuts fall between
    words where one is near, and no ``…`` touches a digit: a number in a name is shown whole or
    not at all."""
    if len(text) <= width:
        return text
    if width < 12:
        return text[:_head_end(text, max(width - 1, 0))] + "…"
    tail = width // 4
    head = width - tail - 1
    if keep_from + _CONTEXT <= head:
        head = _head_end(text, head)
        return text[:head] + "…" + text[_tail_start(text, len(text) - (width - head - 1)):]
    # A short head that cannot end between words is left out: "…" then opens the name.
    head = _snapped_head(text, width // 4) or 0
    tail_start = _tail_start(text, len(text) - tail)
    window = width - head - (len(text) - tail_start) - 2
    start = _tail_start(text, max(_token_start(text, keep_from, keep_from - window // 2), head))
    if start + window >= tail_start:  # the window runs into the tail: one cut is enough
        return text[:head] + "…" + text[_tail_start(text, len(text) - (width - head - 1)):]
    end = max(_head_end(text, start + window), start)
    return text[:head] + "…" + text[start:end] + "…" + text[tail_start:]


def _snapped_head(text: str, end: int) -> int | None:
    """The end of a head near ``end`` (up to ``_SNAP`` back, half that on) right after a
    separator; None when there is none."""
    back = range(end, max(end - _SNAP, 0), -1)
    on = range(end + 1, min(end + _SNAP // 2, len(text) - 1) + 1)
    return next((p for p in (*back, *on) if text[p - 1] in _CUT_AFTER), None)


def _head_end(text: str, end: int) -> int:
    """Where a head that should end at ``end`` ends: after a separator within ``_SNAP``
    characters back, else at ``end`` moved back off any digit (never after ``end``)."""
    for p in range(end, max(end - _SNAP, 0), -1):
        if text[p - 1] in _CUT_AFTER:
            return p
    while end > 0 and _splits_number(text, end):
        end -= 1
    return end


def _tail_start(text: str, start: int) -> int:
    """Where a tail that should start near ``start`` starts: at a separator within ``_SNAP``
    characters on, else at ``start`` moved on off any digit (never before ``start``: the tail
    only shrinks)."""
    for p in range(start, min(start + _SNAP, len(text))):
        if text[p] in _CUT_AFTER:
            return p
    while start < len(text) and _splits_number(text, start):
        start += 1
    return start


def _splits_number(text: str, at: int) -> bool:
    return 0 < at < len(text) and (text[at - 1].isdigit() or text[at].isdigit())


def _token_start(text: str, at: int, floor: int) -> int:
    """The start of the identifier holding ``text[at]``, not before ``floor``: a window opens on
    a whole word (``MulFunctor<float>``), not mid-name."""
    i = min(at, len(text) - 1)
    while i > max(floor, 0) and text[i - 1] not in _TOKEN_BREAKS:
        i -= 1
    return i


# --- structure ----------------------------------------------------------------------------------


@dataclass
class _Group:
    """A bracketed part of a name: ``open`` is one of ``<([{``; ``args`` are split at its own
    commas for ``<`` and ``(``."""

    open: str
    args: list[list[_Part]]


_Part = str | _Group
_CLOSE: Final = {"<": ">", "(": ")", "[": "]", "{": "}"}
#: ``operator<``, ``operator()`` and the like: their brackets are part of the name, not groups.
_OPERATOR: Final = re.compile(r"operator\s*(?:\(\)|\[\]|<<=?|>>=?|<=>|<=|>=|->\*?|[-+*/%^&|~!=<>,]=?|"
                              r"&&|\|\||\+\+|--|new\b|delete\b)")


def _parse(name: str) -> list[_Part] | None:
    """The name as atoms and bracket groups; None when its brackets do not balance."""
    stack: list[tuple[_Group, list[_Part]]] = []
    root: list[_Part] = []
    current = root
    atom: list[str] = []
    i = 0

    def flush() -> None:
        if atom:
            current.append("".join(atom))
            atom.clear()

    while i < len(name):
        ch = name[i]
        m = _OPERATOR.match(name, i) if ch == "o" and (i == 0 or not name[i - 1].isalnum()) else None
        if m:
            atom.append(m.group())
            i = m.end()
            continue
        if name.startswith("<unnamed>", i):  # nvcc's anonymous namespace, as nsys writes it
            atom.append("<unnamed>")
            i += len("<unnamed>")
            continue
        if ch in _CLOSE:
            flush()
            group = _Group(ch, [[]])
            current.append(group)
            stack.append((group, current))
            current = group.args[0]
        elif ch == "-" and name.startswith("->", i):
            atom.append("->")
            i += 1
        elif ch in ">)]}":
            if not stack or _CLOSE[stack[-1][0].open] != ch:
                return None
            flush()
            current = stack.pop()[1]
        elif ch == "," and stack and stack[-1][0].open in "<(":
            flush()
            stack[-1][0].args.append([])
            current = stack[-1][0].args[-1]
            while i + 1 < len(name) and name[i + 1] == " ":
                i += 1
        else:
            atom.append(ch)
        i += 1
    flush()
    return root if not stack else None


@dataclass(frozen=True)
class _Form:
    """What a short form drops: ``strip``: return types, namespaces, casts (``(int)4``) and
    ``::operator()() const``; ``params``: the name's own parameter list; ``nested_params``: the
    parameter lists of functions inside it; ``keep_after``: template arguments kept after the
    first structured one (None: all); ``last_lambda``: of a chain of lambdas, the last only."""

    strip: bool = False
    params: bool = False
    nested_params: bool = False
    keep_after: int | None = None
    last_lambda: bool = False


#: The forms, longest first; each table shows every name in the shortest that keeps it apart.
_FORMS: Final = (
    _Form(),
    _Form(strip=True),
    _Form(strip=True, params=True),
    _Form(strip=True, params=True, nested_params=True),
    _Form(strip=True, params=True, nested_params=True, keep_after=1, last_lambda=True),
    _Form(strip=True, params=True, nested_params=True, keep_after=0, last_lambda=True),
)
#: Qualifiers before a name (not the function a lambda is defined in: that tells which lambda).
_NAMESPACES: Final = re.compile(r"(?<![\w>)\]])(?:(?:[A-Za-z_]\w*|<unnamed>)::)+(?=[A-Za-z_~])")
_RETURN_TYPE: Final = re.compile(r"^(?:[\w:]+(?:\s*[*&]+)?\s+)+")
_CALL_OPERATOR: Final = re.compile(r"::operator ?\(\)(?:\(\))?(?: const)?")


def _is_cast(seq: list[_Part], i: int) -> bool:
    """A ``(type)`` right before a number: nsys writes template values as ``(int)4``."""
    group, nxt = seq[i], seq[i + 1] if i + 1 < len(seq) else None
    return (isinstance(group, _Group) and group.open == "(" and isinstance(nxt, str)
            and re.match(r"-?\d", nxt) is not None)


def _is_anonymous(group: _Group) -> bool:
    return group.open == "(" and group.args == [["anonymous namespace"]]


def _is_params(seq: list[_Part], i: int) -> bool:
    """A ``(`` group right after a name or its template arguments: a parameter list."""
    group = seq[i]
    if not isinstance(group, _Group) or group.open != "(" or _is_cast(seq, i) or _is_anonymous(group) or i == 0:
        return False
    before = seq[i - 1]
    return (isinstance(before, _Group) and before.open == "<") or (isinstance(before, str) and \
        (before[-1:].isalnum() or before[-1:] in "_)" or before.endswith("operator ()")))


def _structured(seq: list[_Part]) -> bool:
    """Whether a template argument is more than a word or number: a template, a function, a lambda."""
    return any(isinstance(p, _Group) and not (p.open == "(" and (_is_cast(seq, i) or _is_anonymous(p)))
               for i, p in enumerate(seq))


def _render(seq: list[_Part], form: _Form, root: bool, in_lambda: bool = False) -> str:
    """The text of ``seq`` with what ``form`` drops left out of it (namespaces, ``(anonymous
    namespace)`` and lambda chains are left to ``_tidy``, on the whole text)."""
    is_function = any(_is_params(seq, i) for i in range(len(seq)))
    out: list[str] = []
    dropped_params = form.params if root else form.nested_params
    for i, part in enumerate(seq):
        if isinstance(part, str):
            strip_return = form.strip and i == 0 and is_function and not in_lambda
            out.append(_RETURN_TYPE.sub("", part) if strip_return else part)
        elif not ((form.strip and _is_cast(seq, i)) or (dropped_params and not in_lambda and _is_params(seq, i))):
            out.append(_render_group(part, form, in_lambda or part.open in "[{"))
    return "".join(out)


_LAMBDAS: Final = re.compile(r"(?:::(?:\{lambda[^{}]*\}|\[lambda[^\[\]]*\]))+")
_ONE_LAMBDA: Final = re.compile(r"::(?:\{lambda[^{}]*\}|\[lambda[^\[\]]*\])")


def _tidy(text: str, form: _Form) -> str:
    if not form.strip:
        return text
    text = text.replace("(anonymous namespace)::", "").replace(" >", ">")
    text = _NAMESPACES.sub("", _CALL_OPERATOR.sub("", text))
    if form.last_lambda:
        # Lambdas inside a function template: its template arguments tell it apart. Inside a
        # plain function, a chain of lambdas: the innermost's parameters tell its types.
        text = _LAMBDAS.sub(lambda m: "" if text[m.start() - 1] == ">" else _ONE_LAMBDA.findall(m.group())[-1],
                            text)
    return text.strip()


def _render_group(group: _Group, form: _Form, in_lambda: bool) -> str:
    args = [_render(arg, form, False, in_lambda) for arg in group.args]
    if group.open == "<" and form.keep_after is not None:
        first = next((i for i, arg in enumerate(group.args) if _structured(arg)), None)
        if first is not None and first + 1 + form.keep_after < len(args):
            return "<" + ", ".join(args[:first + 1 + form.keep_after]) + "…>"
    sep = ", " if group.open in "<(" else ""
    return group.open + sep.join(args) + _CLOSE[group.open]


def _signature(tree: list[_Part]) -> bool:
    """Whether a name reads as a C++ signature: template arguments, or a parameter list at its end
    (``f(int)``; ``file.py(12): fn``, a Python frame, is not one)."""
    ends = [p for p in tree if not (isinstance(p, str) and p.strip() in ("", "const"))]
    last = len(tree) - 1 - tree[::-1].index(ends[-1]) if ends else -1
    return any(isinstance(p, _Group) and p.open == "<" for p in tree) or (last >= 0 and _is_params(tree, last))


def short_forms(name: str) -> list[str]:
    """``name``'s forms, the whole (printable) name first and the shortest last; a name without
    brackets, or whose brackets do not balance, has only its whole form."""
    whole = printable(name)
    tree = _parse(whole) if any(c in whole for c in "<([{") else None
    if tree is None or not _signature(tree):
        return [whole]
    forms = [whole]
    for form in _FORMS[1:]:
        forms.append(_tidy(_render(tree, form, True), form) or whole)
    return forms


def shown_names(names: Sequence[str]) -> list[str]:
    """Per name, the shortest of its ``short_forms`` that no other, different, name of the table
    shares (two rows of one name, on two devices, may read alike)."""
    forms = [short_forms(n) for n in names]
    level = [len(f) - 1 for f in forms]
    while True:
        owners: dict[str, set[str]] = {}
        for name, f, lv in zip(names, forms, level, strict=True):
            owners.setdefault(f[lv], set()).add(name)
        clash = [i for i, (f, lv) in enumerate(zip(forms, level, strict=True))
                 if len(owners[f[lv]]) > 1 and lv > 0]
        if not clash:
            return [f[lv] for f, lv in zip(forms, level, strict=True)]
        for i in clash:
            level[i] -= 1


# --- table cells --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShownName:
    """A name as a table shows it: ``text`` where there is room, cut in the middle where there is
    not, keeping from ``differs_at`` on (where it starts to differ from its neighbours)."""

    text: str
    differs_at: int

    def cut(self, width: int) -> str:
        return cut_middle(self.text, max(width, 1), self.differs_at)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _differs_at(names: Sequence[str]) -> list[int]:
    """Per name, where it first differs from the most similar other name (0 when alone)."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    at = [0] * len(names)
    for a, b in itertools.pairwise(order):
        if names[a] == names[b]:
            continue
        p = _common_prefix(names[a], names[b])
        at[a], at[b] = max(at[a], p), max(at[b], p)
    return at


def name_cells(names: Sequence[str | None]) -> list[ShownName]:
    """One table's column of names (the rows shown): each in the shortest structural form that
    still tells it apart from the other rows (whole under ``whole_names``), and where it differs
    from its neighbours, for a cut to keep."""
    given = [n or "-" for n in names]
    shown = [printable(n) for n in given] if names_whole() else shown_names(given)
    return [ShownName(text, at) for text, at in zip(shown, _differs_at(shown), strict=True)]
