"""Nsight Systems reports (``.nsys-rep``, ``.qdrep``) through NVIDIA's own ``nsys export``.

The report format is private to NVIDIA; only ``nsys`` reads it. When an ``nsys`` binary is
available (argument, ``TRACEWHY_NSYS``, or ``PATH``) the report is exported once into the cache
directory the parsed-Trace cache uses (``$TRACEWHY_CACHE_DIR`` or the user cache directory,
under ``nsys/``), never beside the user's file, and the SQLite export is read instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

from tracewhy.cache_place import default_cache_dir
from tracewhy.errors import TraceError
from tracewhy.readers.nsys.sniff import SQLITE_MAGIC

NSYS_ENV: Final = "TRACEWHY_NSYS"
#: A multi-GB report takes minutes to export; an hour means nsys is stuck.
EXPORT_TIMEOUT_S: Final = 3600


def find_nsys(explicit: str | os.PathLike[str] | None = None) -> str | None:
    """The nsys binary to use: the argument, then $TRACEWHY_NSYS, then ``nsys`` on PATH."""
    for candidate in (explicit, os.environ.get(NSYS_ENV)):
        if candidate:
            found = shutil.which(str(candidate))
            if found:
                return found
    return shutil.which("nsys")


def export_command(report: Path, output: Path, nsys: str = "nsys") -> list[str]:
    return [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--quiet", "true",
            "--output", str(output), str(report)]


def export_report(
    report: Path,
    *,
    nsys: str | os.PathLike[str] | None = None,
    cache_dir: Path | None = None,
    timeout_s: float = EXPORT_TIMEOUT_S,
) -> Path:
    """Return a SQLite export of ``report``, exporting it into the cache on first use."""
    binary = find_nsys(nsys)
    if binary is None:
        suggestion = " ".join(export_command(report, report.with_suffix(".sqlite")))
        raise TraceError(
            report,
            "an Nsight Systems report can only be read through nsys, which was not found "
            f"(put it on PATH or set {NSYS_ENV}); or run `{suggestion}` and pass the .sqlite file",
        )
    try:
        st = report.stat()
    except OSError as e:
        raise TraceError(report, f"cannot read: {e.strerror or e}") from None
    key = hashlib.sha256(f"{report.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]
    try:
        folder = (cache_dir or default_cache_dir()) / "nsys"
    except RuntimeError as e:  # no home directory, or an unknown ~user in TRACEWHY_CACHE_DIR
        raise TraceError(report, f"no directory to export the report into ({e}); set TRACEWHY_CACHE_DIR "
                                 "to a writable directory") from None
    out = folder / f"{report.stem}-{key}.sqlite"
    if _is_sqlite(out):
        return out
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceError(report, f"cannot create the export cache {folder}: {e.strerror or e}") from None
    partial = folder / f"{report.stem}-{key}.partial-{os.getpid()}.sqlite"
    command = export_command(report, partial, binary)
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        raise TraceError(report, f"`nsys export` did not finish within {timeout_s:.0f} s") from None
    except OSError as e:
        raise TraceError(report, f"cannot run {binary}: {e.strerror or e}") from None
    by_hand = " ".join(export_command(report, report.with_suffix(".sqlite")))
    if done.returncode == 0 and not _is_sqlite(partial):
        # An exit status of 0 does not promise a usable file; kept, an empty or foreign
        # file would be taken for the export on every later read.
        partial.unlink(missing_ok=True)
        raise TraceError(report, "`nsys export` exited 0 but wrote no SQLite database; "
                         f"export it by hand to see why: {by_hand}")
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        lines = [ln for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
        detail = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise TraceError(
            report,
            f"`nsys export` failed ({detail[:200]}); a report newer than this nsys cannot be "
            f"exported by it (run: {by_hand})",
        )
    os.replace(partial, out)
    return out


def _is_sqlite(path: Path) -> bool:
    """Whether ``path`` is a file that starts as an SQLite database does (cheap; the reader
    finds out the rest, and ``read_nsys`` drops a cached export it cannot read)."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False
