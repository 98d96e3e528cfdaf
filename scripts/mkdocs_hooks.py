"""MkDocs hooks (``hooks:`` in mkdocs.yml): the benchmark results in ``bench/`` are pages of the
site, so the documentation links them instead of copying their tables.

A page links a result as it lies in the repository (``docs/speed/scale.md`` writes
``../../bench/results_scale.md``), which also works when the Markdown is read on a code host; the
site serves ``bench/`` beside the pages, one directory up less, and the links are rewritten to it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
#: What of bench/ the site serves: the result pages and the figures they show.
SERVED = ("*.md", "*.png")
#: A relative link into the repository's bench/ folder: one or more "../" before "bench/".
_BENCH_LINK = re.compile(r"(\]\()((?:\.\./)+)(bench/)")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File, InclusionLevel

    for pattern in SERVED:
        for path in sorted(BENCH.glob(pattern)):
            files.append(File.generated(config, f"bench/{path.name}", abs_src_path=str(path),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Links written from the repository (docs/ is one level below it) point at the site's bench/."""
    if page.file.src_uri.startswith("bench/"):
        return markdown
    return _BENCH_LINK.sub(lambda m: m.group(1) + m.group(2)[3:] + m.group(3), markdown)
