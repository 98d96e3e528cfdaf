"""``--items-per-step N --unit frames|tokens|samples|images``: the options every command that
reports step times shares to say them as throughput."""

from __future__ import annotations

import argparse

from tracewhy.analyses import throughput
from tracewhy.analyses.throughput import DEFAULT_UNIT, UNITS, ThroughputOptions, requested


def add_throughput_options(parser: argparse.ArgumentParser, per: str = "step") -> None:
    parser.add_argument("--items-per-step", type=float, default=None, metavar="N",
                        help=f"items one {per} handles (batch size, frames, tokens): adds the throughput, "
                             f"items per second at the median and p90 {per} time")
    parser.add_argument("--tokens-per-step", type=float, default=None, metavar="N",
                        help=f"tokens one {per} handles: --items-per-step N --unit tokens (on an inference trace, "
                             "also the tokens of the classed steps whose tokens the trace does not record)")
    parser.add_argument("--unit", choices=UNITS, default=None,
                        help=f"what an item is (default {DEFAULT_UNIT}); frames/s reads as FPS")


def _size(text: str) -> int:
    from tracewhy.reports.check_metrics import parse_size

    try:
        value = parse_size(text, "--decode-bytes")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).partition(": ")[2]) from None
    if not 0 < value < 2**63:
        raise argparse.ArgumentTypeError(f"--decode-bytes: expected a positive size, got {text!r}")
    return int(value)


def add_decode_bytes_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--decode-bytes", type=_size, default=None, metavar="SIZE",
                        help="bytes one decode step reads (the model's weights plus its KV cache, e.g. 16GB): "
                             "the decode MBU uses them in place of the recorded shapes' estimate, which a "
                             "graph replay hides")


def throughput_options(args: argparse.Namespace) -> ThroughputOptions | None:
    return requested(args.items_per_step, args.unit, args.tokens_per_step)


def items_and_unit(args: argparse.Namespace) -> tuple[float | None, str | None]:
    """``--items-per-step`` and ``--unit`` apart (``check`` also reads them from its config), with
    ``--tokens-per-step N`` read as ``--items-per-step N --unit tokens``."""
    return throughput.items_and_unit(args.items_per_step, args.unit, args.tokens_per_step)
