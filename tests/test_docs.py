"""The documentation stays true: its relative links point at files that exist, and every
recipe in README.md and docs/ runs as written (tests/doc_recipes.py says how blocks are
found, what each kind runs as and how a block is marked when it cannot run here), with
the output a page shows checked against the output it gives."""
import glob
import os
import re
import sys

import pytest

import doc_recipes
from doc_recipes import Block
from helpers import run_job

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


# -- the recipes ------------------------------------------------------------------------------
BLOCKS = doc_recipes.all_blocks()
RECIPES = [block for block in BLOCKS if block.kind != "text"]


def test_the_recipes_are_found():
    """The extractor sees the pages' blocks (a broken parser would pass every recipe by
    finding none), and every block it runs or skips is one of those."""
    kinds = {block.kind for block in RECIPES}
    assert kinds == {"python", "shell", "session"}, kinds
    assert any(block.page == "README.md" and block.kind == "python" for block in RECIPES)
    assert len(RECIPES) >= 40, [block.id for block in RECIPES]


def test_no_command_is_left_untagged():
    """A command in an untagged block would never run: tag it (```bash) so that it runs,
    or mark it with the reason it cannot run here."""
    untagged = [block.id for block in BLOCKS if block.looks_like_a_command()]
    assert untagged == [], f"untagged command blocks: {untagged}"


def test_shown_output_is_matched_loosely_but_not_blindly():
    """The matching of shown output: times, versions and round-off vary, padding widths
    vary; words, counts and order do not."""
    shown = ["collected 6 items", "...", "= 5 passed, 1 skipped in 13.46s =",
             "max |Y - X@A@B| over ranks = 5.68e-14", "MPICH Version:      5.0.2"]
    output = ("platform linux\ncollected 6 items\nfoo\n"
              "========== 5 passed, 1 skipped in 9.02s ==========\n"
              "max |Y - X@A@B| over ranks = 1.2e-13\nMPICH Version: 5.1\n")
    assert doc_recipes.output_matches(shown, output) is None
    assert doc_recipes.output_matches(["collected 7 items"], output) == "collected 7 items"
    assert doc_recipes.output_matches(["5 passed, 2 skipped in 1.0s"], output) is not None
    # in order: a line shown before another must come before it
    assert doc_recipes.output_matches(["foo", "collected 6 items"], output) == "collected 6 items"


def test_markers_parse():
    marker = doc_recipes.parse_marker(
        "ranks: 4\ngiven: |\n    x = 1\n\n    y = 2\ncreate a/b.py: |\n  print(1)\n"
        "skip-command: qsub: needs PBS\n", "here")
    assert marker == {"ranks": "4", "given": "x = 1\n\ny = 2\n",
                      "create": [("a/b.py", "print(1)\n")],
                      "skip-command": ["qsub: needs PBS"]}
    with pytest.raises(ValueError, match="unknown doc-test key 'rank'"):
        doc_recipes.parse_marker("rank: 4", "here")


@pytest.mark.parametrize("block", RECIPES, ids=[block.id for block in RECIPES])
def test_recipe_runs_as_written(block: Block, tmp_path):
    reason = doc_recipes.skip_reason(block)
    if reason:
        pytest.skip(reason)
    if "excerpt-of" in block.marker:
        missing = doc_recipes.excerpt_missing(block)
        assert missing is None, (f"{block.id} shows a line that {block.marker['excerpt-of']} "
                                 f"(which its tests run) does not have: {missing!r}")
        return
    if "tested-by" in block.marker:
        check_tested_by(block)
        return
    if "file" in block.marker:  # run by a later block: here only compiled
        compile(doc_recipes.program(block), block.id, "exec")
        return
    doc_recipes.workspace(block, str(tmp_path))
    run = {"python": run_python, "shell": run_shell, "session": run_session}[block.kind]
    run(block, str(tmp_path))


def _limit(block: Block) -> float:
    return float(block.marker.get("timeout", doc_recipes.DEFAULT_LIMIT))


def _job(argv, block: Block, folder: str, n=None):
    return run_job(argv, n, cwd=folder, env=doc_recipes.environment(),
                   clean=doc_recipes.CLEAN, limit=_limit(block))


def run_python(block: Block, folder: str) -> None:
    name = f"recipe_{os.path.basename(block.page).split('.')[0]}_{block.line}.py"
    doc_recipes.write(folder, name, doc_recipes.program(block))
    done = _job([sys.executable, name], block, folder, n=int(block.marker.get("ranks", 2)))
    assert done.code == 0, f"{block.id} failed:\n{done.output[-6000:]}"


def _runnable(block: Block, command: str) -> bool:
    return not any(command.startswith(prefix)
                   for prefix, _ in doc_recipes.skipped_commands(block))


def run_shell(block: Block, folder: str) -> None:
    commands = [command for command in doc_recipes.commands(block.text)
                if _runnable(block, command)]
    assert commands, f"{block.id}: every command is skipped: mark the block skip instead"
    for command in commands:
        done = _job(["bash", "-o", "pipefail", "-c", command], block, folder)
        assert done.code == 0, f"{block.id}: `{command}` failed:\n{done.output[-6000:]}"


def run_session(block: Block, folder: str) -> None:
    status = int(block.marker.get("status", 0))
    shown_cwd = block.marker.get("shown-cwd")
    for command, shown in doc_recipes.session(block.text):
        if not _runnable(block, command):
            continue
        done = _job(["bash", "-o", "pipefail", "-c", command], block, folder)
        output = done.output
        if shown_cwd:
            output = output.replace(os.path.realpath(folder), str(shown_cwd)).replace(
                folder, str(shown_cwd))
        assert done.code == status, (f"{block.id}: `{command}` exited {done.code}, the page "
                                     f"says {status}:\n{output[-6000:]}")
        missing = doc_recipes.output_matches(shown, output)
        assert missing is None, (f"{block.id}: `{command}` did not print the line the page "
                                 f"shows: {missing!r}\nIt printed:\n{output[-6000:]}")


def check_tested_by(block: Block) -> None:
    """A block whose commands another test runs: that test exists and reads them from
    this page (so the page cannot change them without that test seeing it)."""
    path = os.path.join(ROOT, str(block.marker["tested-by"]))
    assert os.path.exists(path), f"{block.id}: tested-by names a missing file {path}"
    with open(path) as f:
        text = f.read()
    assert "doc_recipes" in text and block.page in text, (
        f"{block.id}: {block.marker['tested-by']} does not read its commands from "
        f"{block.page} (doc_recipes.page_commands)")
