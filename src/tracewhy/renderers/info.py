"""``info``: what a trace is (format, versions, devices, capture options, counts, steps, span), as
a terminal table and as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypedDict

from tracewhy.renderers.layout import Layout, label, text
from tracewhy.units import fmt_bytes, fmt_ns, printable

if TYPE_CHECKING:  # types only: the result comes from the analysis, which the report has loaded
    from rich.console import RenderableType

    from tracewhy.analyses.info import InfoDevice, InfoResult


class InfoPayload(TypedDict):
    """``info``: what the trace is."""

    info: InfoResult


def info_payload(r: InfoResult) -> InfoPayload:
    """The JSON of ``info``."""
    return {"info": r}


#: ``info``: one line per fact; the value wraps (a file path, the slice counts).
INFO_TABLE: Final = Layout((label("fact"), text("value")), look="plain")


def render_info(r: InfoResult) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    t = INFO_TABLE.table()
    t.add_row(Text("file", style="bold"), r.path)
    t.add_row(Text("format", style="bold"),
              f"{r.format} (schema {r.schema_version})" if r.schema_version else r.format)
    rows: list[tuple[str, str]] = []
    if r.accelerator:
        rows.append(("accelerator", r.accelerator))
    rows += sorted(r.versions.items())
    if r.devices:
        rows += [(f"device {d['device']}", _device_line(d, r.format)) for d in r.devices]
    else:
        rows.append(("devices", "none described"))
    if r.rank is not None or r.world_size is not None:
        rows.append(("rank", f"{r.rank} of {r.world_size} ({r.backend or 'backend unknown'})"))
    c = r.capture
    flags = [name for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
             if getattr(c, name)]
    rows += [("capture", (", ".join(flags) or "no extra options") + f"  ({c.source})"),
             ("slices", ", ".join(f"{k} {v}" for k, v in r.slices_by_kind.items()) or "none"),
             ("memory events", str(r.memory_events)), ("flow events", str(r.flow_events)),
             ("steps", f"{r.step_count} ({r.step_marker})"), ("time span", fmt_ns(r.span_ns))]
    for key, value in rows:
        t.add_row(Text(printable(key), style="bold"), value)
    parts: list[RenderableType] = [t]
    for w in r.warnings:
        parts.append(Text(f"warning: {printable(w)}", style="yellow"))
    return Group(*parts)


def _device_line(d: InfoDevice, fmt: str) -> str:
    """Name, compute capability and memory of a device, or why the file does not say them (an
    nsys export without a TARGET_INFO_GPU table printed ``? -``)."""
    cc = f"sm_{d['compute_major']}{d['compute_minor']}" if d["compute_major"] is not None else ""
    mem = d["total_global_mem_bytes"]
    described = [x for x in (d["name"] or "", cc, fmt_bytes(mem) if mem else "") if x]
    if described:
        return " ".join(described)
    from tracewhy.model.trace import NSYS_FORMAT  # (already loaded: a trace was read)

    where = ("this export has no TARGET_INFO_GPU table (its capture did not record GPU properties)"
             if fmt.startswith(NSYS_FORMAT) else "the trace has no deviceProperties entry for it")
    return f"used, but not described: {where}"
