from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from tracewhy.analyses.throughput import ThroughputOptions
from tracewhy.cli.base import Command, emit, flush_warnings, load_trace, positive_int
from tracewhy.cli.throughput import add_throughput_options, throughput_options
from tracewhy.errors import UsageError
from tracewhy.findings.check import METRICS, CheckOptions, Limit, check, parse_limit
from tracewhy.renderers.check import CheckPayload, check_lines, check_payload

#: Exit code when a threshold is violated (tracewhy.cli documents the codes).
EXIT_VIOLATION = 1
_SETTINGS = ("baseline", "step", "warmup", "allow-unmeasured", "allow-partial", "items-per-step", "unit")


class CheckCommand(Command):
    """CI gate: exit 1 when a threshold is violated, printing one line per violation.

    Thresholds come from options (--max-gpu-idle 20%, --max-step-p50 120ms, ...) or from
    [tool.tracewhy.check] in a pyproject.toml (--config FILE, else the nearest pyproject.toml
    above the current directory); options win. --baseline A also fails when the step time
    regressed significantly against trace A (the test of `tracewhy diff`).
    """

    name = "check"
    json_payloads = (CheckPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print versioned JSON instead of lines")
        parser.add_argument("--config", metavar="FILE", help="pyproject.toml holding [tool.tracewhy.check]")
        parser.add_argument("--baseline", metavar="TRACE", help="fail on a significant step-time regression vs TRACE")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")
        parser.add_argument("--allow-unmeasured", action="store_true", default=None,
                            help="pass a threshold the trace cannot measure (default: it fails)")
        parser.add_argument("--allow-partial", action="store_true", default=None,
                            help="check a trace that lacks events (cut file, events still open, tables skipped); "
                                 "by default it fails as partial-trace")
        add_throughput_options(parser)
        for metric in METRICS.values():
            for bound in metric.bounds:
                example = {"share": "PCT", "duration": "TIME", "count": "N", "bytes": "SIZE", "rate": "N/s"}[
                    metric.unit]
                parser.add_argument(f"--{bound}-{metric.name}", metavar=example, dest=f"limit:{bound}-{metric.name}",
                                    help=f"{bound} {metric.help}")

    def run(self, args: argparse.Namespace) -> int:
        config, base_dir = _load_config(args.config)
        settings = {k: config.pop(k) for k in _SETTINGS if k in config}
        given = {k.removeprefix("limit:"): v for k, v in vars(args).items() if k.startswith("limit:") and v is not None}
        limits: list[Limit] = []
        try:
            for key, text in {**config, **given}.items():
                limits.append(parse_limit(key, text))
        except ValueError as e:
            raise UsageError(str(e)) from None
        baseline_path = args.baseline or (str(base_dir / settings["baseline"]) if "baseline" in settings else None)
        if not limits and baseline_path is None:
            raise UsageError("nothing to check: give thresholds (e.g. --max-gpu-idle 20%), --baseline TRACE, "
                             "or [tool.tracewhy.check] in pyproject.toml")
        warmup = args.warmup if args.warmup is not None else settings.get("warmup")
        options = CheckOptions(
            limits=tuple(limits),
            step_marker=args.step or settings.get("step"),
            warmup=int(warmup) if warmup is not None else None,
            allow_unmeasured=bool(args.allow_unmeasured if args.allow_unmeasured is not None
                                  else settings.get("allow-unmeasured", False)),
        allow_partial=bool(args.allow_partial if args.allow_partial is not None
                           else settings.get("allow-partial", False)),
            throughput=_throughput(args, settings, limits),
        )
        report = check(load_trace(args.trace), options, load_trace(baseline_path) if baseline_path else None)
        if args.json:
            emit(args, self.name, check_payload(report), lambda: "")
        else:  # plain lines, never wrapped: CI logs are grepped line by line
            flush_warnings()
            sys.stdout.write("".join(line + "\n" for line in check_lines(report)))
        return 0 if report.passed else EXIT_VIOLATION


def _throughput(args: argparse.Namespace, settings: dict[str, Any], limits: list[Limit]) -> ThroughputOptions | None:
    """--items-per-step/--unit, else ``items-per-step``/``unit`` in the config; a throughput limit needs them."""
    if args.items_per_step is None and "items-per-step" in settings:
        try:
            items = float(settings["items-per-step"])
        except (TypeError, ValueError):
            raise UsageError(f"items-per-step in the config must be a number, got {settings['items-per-step']!r}") \
                from None
        args = argparse.Namespace(items_per_step=items, unit=args.unit or settings.get("unit"))
    rate = throughput_options(args)
    if rate is None and any(limit.metric == "throughput" for limit in limits):
        raise UsageError("--min-throughput needs --items-per-step N (and --unit frames|tokens|samples|images): "
                         "the items one step handles")
    return rate


def _load_config(explicit: str | None) -> tuple[dict[str, Any], Path]:
    """The [tool.tracewhy.check] table and the directory relative paths in it start from."""
    if explicit is not None:
        path = Path(explicit)
        table = _check_table(path)
        if table is None:
            raise UsageError(f"{path}: no [tool.tracewhy.check] table")
        return table, path.resolve().parent
    for folder in (Path.cwd(), *Path.cwd().parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return _check_table(candidate) or {}, folder  # the nearest pyproject.toml decides
    return {}, Path.cwd()


def _check_table(path: Path) -> dict[str, Any] | None:
    # tomllib from Python 3.11 on, the tomli backport before (imported by name so that mypy,
    # set to 3.10, does not need the backport installed on 3.11).
    toml = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    try:
        data = toml.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:  # TOMLDecodeError is a ValueError
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    table = data.get("tool", {}).get("tracewhy", {}).get("check")
    if table is not None and not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.tracewhy.check] must be a table")
    return dict(table) if table is not None else None
