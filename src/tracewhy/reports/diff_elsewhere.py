"""Run B of a diff read and diagnosed in the helper process (``tracewhy.diff_helper``): the job
it is given, what it answers, and the command's side of it.

The command writes one job on the helper's stdin: B's path, whether to use the parse cache and
the diagnosis's options. The helper answers on its stdout, one message at a time: B's read
warnings once B is read; then B's side of the diff (``analyses.diff.side``) with its diagnosis
before its fixes are replayed (what a diff shows when both runs have the same finding codes);
then, only if the command asks for it (a line ``priced``), the diagnosis with its fixes
replayed. Each message is a pickle that our own child made of our own objects, read back by an
unpickler that builds nothing else (``own_pickles``); no trace file is ever unpickled (the same
terms as the Kineto reader's helpers, ``readers/kineto/parallel``). The job is the command's
pickle of its own options, read the same way.

Whatever goes wrong in the helper (a bad file, an error, a helper killed or gone) it answers
``failed`` or nothing, and the command does B itself, the way a diff without a helper does: a
bad B then fails with the message and exit code it always had, after A's warnings."""

from __future__ import annotations

import contextlib
import pickle
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final

from tracewhy import own_pickles
from tracewhy.analyses.diff import DiffSide, side
from tracewhy.findings.context import Context, DiagnoseOptions
from tracewhy.reports.diagnose import Report, diagnose_in, rule_findings

if TYPE_CHECKING:
    import subprocess

#: The line that asks the helper for the diagnosis with its fixes replayed.
_PRICED: Final = b"priced\n"
_FAILED: Final = "failed"


@dataclass(frozen=True)
class Job:
    """What the helper does: read ``path`` (``cache``: the parse cache on, off or, None, the
    readers' default) and diagnose it with ``options``."""

    path: str
    cache: bool | None
    options: DiagnoseOptions


def answer(jobs: IO[bytes], out: IO[bytes]) -> None:
    """The helper's side: one job read from ``jobs``, its answers written to ``out``."""
    from tracewhy.readers import CacheOptions, read_trace

    try:
        job = own_pickles.load(jobs)  # the command's pickle of its own options
        if not isinstance(job, Job):
            return
        trace = read_trace(job.path, cache=None if job.cache is None else CacheOptions(enabled=job.cache))
        _send(out, "read", list(trace.meta.warnings))
        ctx = Context(trace, job.options)
        found = rule_findings(ctx)
        report = diagnose_in(ctx, found, replay=False)
        _send(out, "unpriced", side(trace, report.steps, report.memory), report)
        if jobs.readline() == _PRICED:
            _send(out, "priced", diagnose_in(ctx, found))
    except (EOFError, BrokenPipeError):  # the command is gone, or did not want more
        return
    except Exception:  # any other failure: the command does B itself, and says what it says
        with contextlib.suppress(OSError):
            _send(out, _FAILED)


def _send(out: IO[bytes], *message: Any) -> None:
    pickle.dump(message, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()


class Elsewhere:
    """The command's side: the helper given its job at once; each answer read when the command
    needs it, None when the helper failed (the command then does B itself)."""

    def __init__(self, process: subprocess.Popen[bytes], job: Job) -> None:
        self.process = process
        self.failed = False
        self._send(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))

    def warnings(self) -> list[str] | None:
        """B's read warnings, once B is read."""
        got = self._receive("read", list)
        return None if got is None else [str(line) for line in got[0]]

    def unpriced(self) -> tuple[DiffSide, Report] | None:
        """B's side of the diff, and its diagnosis without its fixes replayed."""
        got = self._receive("unpriced", DiffSide, Report)
        return None if got is None else (got[0], got[1])

    def priced(self) -> Report | None:
        """B's diagnosis with its fixes replayed (after ``ask_priced``: made while A's is)."""
        got = self._receive("priced", Report)
        return None if got is None else got[0]

    def ask_priced(self) -> None:
        self._send(_PRICED)

    def _send(self, data: bytes) -> None:
        stdin = self.process.stdin
        try:
            assert stdin is not None
            stdin.write(data)
            stdin.flush()
        except OSError:  # the helper is gone: the command does B itself
            self.failed = True

    def _receive(self, kind: str, *types: type) -> tuple[Any, ...] | None:
        """The next answer's parts, if it is a ``kind`` of those ``types``; else None, and the
        helper counts as failed."""
        if self.failed or self.process.stdout is None:
            return None
        try:
            message = own_pickles.load(self.process.stdout)  # our own child's pickle of our own objects
        except Exception:  # gone or cut off mid-message: the command does B itself
            message = None
        if not (isinstance(message, tuple) and message[:1] == (kind,) and len(message) == len(types) + 1
                and all(isinstance(part, t) for part, t in zip(message[1:], types, strict=True))):
            self.failed = True
            return None
        return message[1:]
