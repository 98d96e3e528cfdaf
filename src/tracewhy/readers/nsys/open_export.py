"""Opening an export without writing beside it: read-only and immutable, or, when a writer
left a write-ahead log or a hot rollback journal beside the file, a private copy of both.

``immutable=1`` tells SQLite the file cannot change, so it takes no locks and never creates
``-wal``/``-shm``/``-journal`` files (a read-only directory works). It also makes SQLite ignore
a ``-wal`` (transactions committed there are missing) and a hot ``-journal`` (an unfinished
transaction's pages are read as if committed). Such a database is copied with its log into a
private temporary directory, where SQLite may recover it: it replays the committed frames of
the WAL and rolls the journal back, as it would for the writer. The user's files are only read.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from tracewhy.errors import TraceError

#: The first bytes of a rollback journal that still holds a transaction; SQLite zeroes them (or
#: deletes or truncates the file) when the transaction ends, and then the journal is not hot.
JOURNAL_MAGIC: Final = bytes.fromhex("d9d505f920a163d7")


def _log_beside(file: Path) -> tuple[Path | None, Path | None]:
    """The non-empty ``-wal`` and the hot ``-journal`` beside ``file``, where there are any."""
    wal = file.with_name(file.name + "-wal")
    journal = file.with_name(file.name + "-journal")
    # is_file first: opening a FIFO named like a journal would block for ever.
    try:
        has_wal = wal.is_file() and wal.stat().st_size > 0
    except OSError:  # removed meanwhile: the writer checkpointed and closed
        has_wal = False
    hot = False
    if journal.is_file():
        try:
            with open(journal, "rb") as f:
                hot = f.read(len(JOURNAL_MAGIC)) == JOURNAL_MAGIC
        except OSError:
            hot = True  # unreadable: copying it fails and says so
    return (wal if has_wal else None), (journal if hot else None)


@contextmanager
def open_export(file: Path, shown: Path) -> Iterator[tuple[sqlite3.Connection, list[str]]]:
    """A connection to the committed state of ``file`` and notes on how it was reached.

    ``shown`` is the path error messages name (the user's file when ``file`` is an inflated copy).
    """
    wal, journal = _log_beside(file)
    if wal is None and journal is None:
        conn = _connect(f"{file.resolve().as_uri()}?mode=ro&immutable=1", shown)
        try:
            yield conn, []
        finally:
            conn.close()
        return
    with tempfile.TemporaryDirectory(prefix="tracewhy-nsys-") as tmp:
        copy = Path(tmp) / "export.sqlite"
        try:
            shutil.copyfile(file, copy)
            for log, suffix in ((wal, "-wal"), (journal, "-journal")):
                if log is not None:
                    shutil.copyfile(log, copy.with_name(copy.name + suffix))
        except OSError as e:
            raise TraceError(shown, f"cannot copy the database and its {'-wal' if wal else '-journal'} "
                             f"file into a private temporary directory: {e.strerror or e}") from None
        # Read-write on the private copy only: recovery writes the result into it.
        conn = _connect(copy.as_uri(), shown)
        note = (f"a write-ahead log ({wal.name}) lay beside the file, so a program may still be "
                "writing it: read a private copy with the transactions the log committed"
                if wal is not None else
                f"a hot rollback journal ({journal.name if journal else ''}) lay beside the file "
                "(a writer stopped mid-transaction): read a private copy with that transaction "
                "rolled back")
        try:
            yield conn, [note]
        finally:
            conn.close()


def _connect(uri: str, shown: Path) -> sqlite3.Connection:
    try:
        return sqlite3.connect(uri, uri=True)
    except sqlite3.Error as e:
        raise TraceError(shown, f"cannot open as SQLite ({e})") from None
