from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracewhy.cli.base import Command, add_output_options, emit, loader, positive_int
from tracewhy.errors import UsageError
from tracewhy.output_files import STDOUT, refuse_overwrite, refuse_same_output, refuse_special_output, write_output
from tracewhy.renderers.lines import WEIGHTS, LinesPayload, folded_stacks, lines_payload, render_lines, speedscope_bytes
from tracewhy.reports.lines import LINES_SORT_KEYS, LinesReportOptions, lines_report


class LinesCommand(Command):
    """Which Python line is slow: per source frame, calls, host self and total time, the GPU time
    of the work launched under it, sync points, ops and its share of the steady steps.

    Needs a trace captured with with_stack=True (python_function frames; older traces' per-op
    Call stack is read too). User code only unless --all: then library, torch and standard-library
    frames are rows of their own, and self times are split among them. A builtin call (.item(),
    time.sleep) is never a row: its time is the calling line's.
    --logs PATH (a TORCH_TRACE directory, best with INDUCTOR_PROVENANCE=1, or a TORCH_LOGS=output_code
    capture) puts each compiled kernel's time on the source lines it fuses ("compiled" rows).
    --flame FILE writes the stacks in the folded format (flamegraph.pl, inferno, speedscope);
    --speedscope FILE a speedscope profile; --weight says whether widths are host or GPU time.
    """

    name = "lines"
    json_payloads = (LinesPayload,)

    def configure(self, parser: argparse.ArgumentParser) -> None:
        add_output_options(parser)
        parser.add_argument("--all", action="store_true", dest="include_library",
                            help="list library, torch and standard-library frames too")
        parser.add_argument("--sort", choices=LINES_SORT_KEYS, default=None,
                            help="sort key (default: gpu_self_ns, or host_self_ns on CPU-only traces)")
        parser.add_argument("--flame", metavar="FILE", help="write collapsed stacks (folded format; - for stdout)")
        parser.add_argument("--speedscope", metavar="FILE", help="write a speedscope profile (JSON)")
        parser.add_argument("--weight", choices=WEIGHTS, default="host",
                            help="what the flame graph and speedscope widths are (default host)")
        parser.add_argument("--logs", type=Path, metavar="PATH",
                            help="TORCH_TRACE directory or TORCH_LOGS=output_code capture of the same run: "
                                 "compiled kernels' time goes to the source lines they fuse")
        parser.add_argument("--step", metavar="NAME", help="annotation that marks a step (default ProfilerStep)")
        parser.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                            help="steps to exclude as warm-up (default: a first step #0 or outlier)")

    def run(self, args: argparse.Namespace) -> int:
        if args.json and STDOUT in (args.flame, args.speedscope):
            raise UsageError("a profile on standard output (-) and --json: choose one")
        refuse_same_output({"--flame": args.flame, "--speedscope": args.speedscope})
        for out in [Path(p) for p in (args.flame, args.speedscope) if p is not None]:  # before the work
            refuse_overwrite(out, Path(args.trace))
            refuse_special_output(out)
        r = lines_report(args.trace, LinesReportOptions(include_library=args.include_library, sort_by=args.sort,
                                                        step_marker=args.step, warmup=args.warmup,
                                                        logs=args.logs), loader())
        if args.flame is not None:
            write_output(Path(args.flame), folded_stacks(r, args.weight).encode())
            if args.flame != STDOUT:
                sys.stderr.write(f"wrote {args.flame}: {r.stacks.height} stacks weighted by {args.weight} time\n")
        if args.speedscope is not None:
            write_output(Path(args.speedscope), speedscope_bytes(r, args.weight, name=Path(args.trace).name))
            if args.speedscope != STDOUT:
                sys.stderr.write(f"wrote {args.speedscope}: open it at https://www.speedscope.app\n")
        if STDOUT not in (args.flame, args.speedscope):  # a profile on stdout is the whole output
            emit(args, self.name, lines_payload(r), lambda: render_lines(r, args.top))
        return 0
