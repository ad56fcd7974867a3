"""The documentation's relative links point at files that exist (pages, results,
examples), so that moving a page or a generated result cannot leave a dead link."""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted({os.path.relpath(p, ROOT) for pattern in ("README.md", "docs/**/*.md",
                                                         "benchmarks/**/*.md")
                for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)})
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_pages_are_found():
    assert "README.md" in PAGES and "docs/frameworks.md" in PAGES, PAGES


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    dead = [target for target in LINK.findall(text)
            if not target.startswith(("http://", "https://", "mailto:"))
            and not os.path.exists(os.path.join(ROOT, os.path.dirname(page), target))]
    assert dead == [], f"{page}: links to missing files {dead}"
