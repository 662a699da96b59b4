"""The README stays a front door and its links land; the docs site's own links are checked by its
strict build (`make docs`, part of `make test`), which cannot see the README (outside docs/).

* the README is at most 200 lines and gives the two commands, each alone on a line of a code block
  (`.ci/run` runs `make test`);
* every relative link in the README, and in every docs page to a file outside docs/, names a file
  that exists (mkdocs checks the links between pages, not links out of its docs_dir);
* no page names an issue number: the docs say what holds, not where it was asked for.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
#: A markdown link's target: [text](target), without a scheme (http:, mailto:) and before any #anchor.
LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "README.md is over 200 lines: move the depth to docs/"
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    lines = {line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()}
    assert {"make demo", "make test"} <= lines


def test_the_readme_links_land() -> None:
    targets = LINK.findall(README.read_text())
    assert "docs/glossary.md" in targets
    # ../shared/ is the workspace's Sume contract beside the repository, not part of it.
    missing = [t for t in targets if not t.startswith("../shared/") and not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_out_of_the_docs_land(page: Path) -> None:
    targets = [page.parent / t for t in LINK.findall(page.read_text())]
    missing = [t for t in targets if not t.resolve().is_relative_to(ROOT / "docs") and not t.exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_an_issue_number(page: Path) -> None:
    assert not re.search(r"\bissues?\s*#?\d+", page.read_text(), flags=re.I), page
