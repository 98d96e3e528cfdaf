"""Regenerate the JSON Schemas shipped in the package (src/tracewhy/schemas/COMMAND.json) from the
payload declarations, after a declaration changed:

    python scripts/json_schemas.py

tests/test_json_schemas.py fails while a shipped file differs from what the declarations give.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from tracewhy.cli.schemas import FOLDER, write_all

    folder = ROOT / "src" / "tracewhy" / FOLDER
    written = write_all(folder)
    stale = sorted(p for p in folder.glob("*.json") if p not in written)
    for path in stale:  # a command that went away
        path.unlink()
    print(f"{len(written)} schemas written to {folder.relative_to(ROOT)}" +
          (f"; removed {', '.join(p.name for p in stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
