"""Copy the pages the MCP server hands agents as resources (docs/finding-codes.md and
docs/decisions.md) into the package (src/tracewhy/agent_docs/), after either page changed:

    python scripts/agent_docs.py

They ship in the wheel, where docs/ is not; tests/test_mcp_server.py fails while a copy differs.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("finding-codes.md", "decisions.md")


def main() -> int:
    target = ROOT / "src" / "tracewhy" / "agent_docs"
    for page in PAGES:
        shutil.copyfile(ROOT / "docs" / page, target / page)
    print(f"{len(PAGES)} pages copied to {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
