"""Print the README's two set-up commands, one per line: the ```bash blocks of its "Set up"
section, in order. ``.ci/run`` runs what this prints, so CI runs exactly what a new user is told
to run (standard library only: it runs before anything is installed)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def setup_commands(markdown: str) -> list[str]:
    """The ```bash blocks between the "## Set up" heading and the next "## " heading."""
    start = re.search(r"^## Set up.*$", markdown, re.MULTILINE)
    if start is None:
        raise SystemExit("README.md has no '## Set up' section")
    body = markdown[start.end():]
    end = re.search(r"^## ", body, re.MULTILINE)
    blocks = re.findall(r"^```bash\n(.*?)^```$", body[: end.start()] if end else body, re.DOTALL | re.MULTILINE)
    commands = [" ".join(block.split()) for block in blocks]
    if len(commands) != 2:
        raise SystemExit(f"README.md's set-up section has {len(commands)} bash blocks, not the two commands")
    return commands


if __name__ == "__main__":
    sys.stdout.write("\n".join(setup_commands(README.read_text(encoding="utf-8"))) + "\n")
