"""The recipes of the documentation, read from the Markdown itself: every fenced code
block of README.md and docs/ (pages added later included, with no edit here), what
kind of recipe it is, and how to run it as written.

**Kinds**, by the block's opening fence:

* ```` ```python ````: a program, run as ``mpiexec -n 2 python BLOCK.py`` (another rank
  count with ``ranks: N``), or, with ``file: NAME``, written to ``NAME`` for the blocks
  after it on the same page (a test file a session then runs, a ``train.py``);
* ```` ```bash ```` (``sh``, ``shell``): commands, run by ``bash -e`` one after another;
* ```` ```console ````, or any block whose first line starts with ``$ ``: a session:
  each ``$ `` line is run, and the lines shown after it (up to the next ``$ ``) must
  appear in its output, in order (:func:`output_matches` says how loosely);
* anything else is text (an error message, a diagram, a table) and is not run. A text
  block that starts like a command (``python``, ``mpiexec``, a ``.sh`` script...) is
  an error: tag it, so that it runs or says why not.

**Where and how.** A recipe runs in a folder of its own that stands for the repository
root: links to the repository's top-level folders and files (``examples/``,
``benchmarks/``, ``tests/``, ``jobscripts/``...; not the packaging files, and ``docs/``
is a fresh empty folder, so nothing writes into the committed results), ``.venv``
linked to the running Python's environment, and the files of the page's ``file:``
blocks above it. ``python``,
``mpiexec`` and ``hpccomm`` are that environment's (its ``bin/`` first on ``PATH``), and
the environment is a user's: no ``HPCCOMM_*``, ``MPI4PY_*``, Slurm or torchrun
variables from the test run.

**Markers.** An HTML comment right before the fence (invisible on the rendered page)
says what the block needs, one ``key: value`` a line (``key: |`` takes the indented
lines after it)::

    <!-- doc-test: skip: needs a Slurm cluster (sbatch) -->

    <!-- doc-test
    ranks: 4
    given: |
        model = torch.nn.Linear(4, 4)
    -->

``skip: REASON`` (not run: it needs a GPU, Slurm, a second node, or runs for minutes;
the reason is the test's skip reason), ``ranks: N``, ``file: NAME``, ``given: CODE``
(what a fragment assumes, run before it: the names the page leaves to the reader),
``create PATH: TEXT`` (a file the commands name, such as the reader's ``train.py``),
``skip-command: PREFIX: REASON`` (the block's commands that start with ``PREFIX`` are
not run), ``status: N`` (a session's command exits with ``N``), ``shown-cwd: PATH``
(the folder the session's output shows for the one it ran in), ``needs: MODULE`` (skip
unless it imports), ``mpi: NAME`` (skip unless the MPI library's vendor starts with it),
``timeout: SECONDS``, ``tested-by: TEST_FILE`` (another test runs these commands, reading
them from this page), ``excerpt-of: PATH`` (the fragment's lines are lines of that
tested file, in order; ``differs: SHOWN => IN THE FILE`` for a piece that the file
varies, such as the backend a comparison run changes), ``produced-by: CASE`` (a text
block showing an error: the case of tests/test_troubleshooting.py that makes it happen).
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import shlex
import sys
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The pages whose recipes are tests: the README and everything under docs/.
PATTERNS = ("README.md", "docs/**/*.md")
#: Keys a marker may use; those that may repeat collect a list.
KEYS = {"skip", "ranks", "file", "given", "create", "skip-command", "status", "shown-cwd",
        "needs", "mpi", "timeout", "tested-by", "excerpt-of", "differs", "produced-by"}
REPEATED = {"create", "skip-command", "differs"}
#: A text block that starts with one of these is a command left untagged.
PROGRAMS = {"python", "python3", "mpiexec", "mpirun", "srun", "sbatch", "salloc", "qsub",
            "hpccomm", "pip", "bash", "sh", "cmake", "ctest", "module", "torchrun",
            "deepspeed", "accelerate", "pytest"}
#: Variables a recipe must not inherit from the test run (a user's plain environment).
CLEAN = ("HPCCOMM_*", "MPI4PY_*", "SLURM_*", "RANK", "WORLD_SIZE", "LOCAL_RANK",
         "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_DISTRIBUTED_DEBUG",
         "PYTEST_*", "BENCH_RESULTS")
DEFAULT_LIMIT = 180
#: What the workspace leaves out of the repository root: git's, the committed results
#: (docs/ is made empty), and the packaging files, which would make the root a project
#: pytest and pip read (a user's folder is none).
SETUP = {".git", "docs", "setup.cfg", "setup.py", "pyproject.toml", "MANIFEST.in",
         "CMakeLists.txt"}


@dataclasses.dataclass
class Block:
    """One fenced code block: where it is, its tag, its text (without the fences, the
    list indentation removed) and its marker's keys."""

    page: str
    line: int
    lang: str
    text: str
    marker: Dict[str, object]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        if self.lang == "python":
            return "python"
        if self.lang in ("bash", "sh", "shell"):
            return "shell"
        first = self.text.lstrip().split("\n", 1)[0]
        if self.lang == "console" or first.startswith("$ "):
            return "session"
        return "text"

    def looks_like_a_command(self) -> bool:
        """An untagged block that starts like a command line."""
        line = self.text.strip().split("\n", 1)[0]
        words = [word for word in line.split() if "=" not in word]  # VAR=value prefixes
        if self.kind != "text" or not words or ": " in line:  # an error message
            return False
        return os.path.basename(words[0]) in PROGRAMS or words[0].endswith(".sh")


def pages() -> List[str]:
    """The pages, relative to the repository root."""
    found = {os.path.relpath(path, ROOT) for pattern in PATTERNS
             for path in glob.glob(os.path.join(ROOT, pattern), recursive=True)}
    return sorted(found)


FENCE = re.compile(r"^( *)```(\S*)\s*$")


def blocks(page: str) -> List[Block]:
    """Every fenced block of ``page``, in order."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = len(opening.group(1)), opening.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        body = [line[indent:] if line[:indent].strip() == "" else line
                for line in lines[i + 1:end]]
        found.append(Block(page, i + 1, lang, "\n".join(body) + "\n",
                           marker_before(lines, i, page)))
        i = end + 1
    return found


def all_blocks() -> List[Block]:
    return [block for page in pages() for block in blocks(page)]


def marker_before(lines: Sequence[str], fence: int, page: str) -> Dict[str, object]:
    """The ``<!-- doc-test ... -->`` comment right before line ``fence`` (blank lines
    between allowed), parsed; ``{}`` without one."""
    end = fence - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return {}
    start = end
    while start >= 0 and "<!--" not in lines[start]:
        start -= 1
    comment = "\n".join(lines[start:end + 1]).strip()
    body = comment[len("<!--"):-len("-->")].strip()
    if not body.startswith("doc-test"):
        return {}
    return parse_marker(body[len("doc-test"):].lstrip(":").strip("\n"), f"{page}:{fence + 1}")


def parse_marker(body: str, where: str) -> Dict[str, object]:
    """``key: value`` lines; ``key: |`` takes the following lines indented deeper than
    the key (dedented). ``create PATH`` keys collect ``(PATH, text)``."""
    marker: Dict[str, object] = {}
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        key, _, value = line.strip().partition(":")
        key, value = key.strip(), value.strip()
        if value == "|":
            depth = len(line) - len(line.lstrip())
            taken = []
            i += 1
            while i < len(lines) and (not lines[i].strip() or
                                      len(lines[i]) - len(lines[i].lstrip()) > depth):
                taken.append(lines[i])
                i += 1
            value = _dedent("\n".join(taken)).strip("\n") + "\n"
        else:
            i += 1
        name, _, argument = key.partition(" ")
        if name not in KEYS:
            raise ValueError(f"{where}: unknown doc-test key {name!r} (known: "
                             f"{', '.join(sorted(KEYS))})")
        if name == "create":
            marker.setdefault("create", []).append((argument, value))
        elif name in REPEATED:
            marker.setdefault(name, []).append(value)
        else:
            marker[name] = value
    return marker


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)


# -- commands of shell blocks ------------------------------------------------------------------
def commands(text: str) -> List[str]:
    """The logical command lines of a shell block (continuations joined, comments and
    blank lines dropped)."""
    found, current = [], ""
    for line in text.split("\n"):
        if current:
            current += " " + line.strip()
        else:
            current = line.strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        code = _without_comment(current)
        if code:
            found.append(code)
        current = ""
    return found


def _without_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, after a space)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def page_commands(page: str) -> List[str]:
    """Every command line of ``page``'s shell blocks and sessions, as written."""
    found = []
    for block in blocks(page):
        if block.kind == "shell":
            found += commands(block.text)
        elif block.kind == "session":
            found += [_without_comment(cmd) for cmd, _ in session(block.text)]
    return found


def session(text: str) -> List[Tuple[str, List[str]]]:
    """A session's ``(command, lines shown after it)`` pairs."""
    steps: List[Tuple[str, List[str]]] = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:].strip(), []))
        elif steps:
            steps[-1][1].append(line)
    return steps


# -- matching shown output --------------------------------------------------------------------
NUMBER = r"\d+(?:\.\d+)+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+"


def line_pattern(shown: str) -> "re.Pattern[str]":
    """The pattern an output line must match for a line the page shows: the same text,
    except that ``...`` stands for anything, a number with a decimal point or exponent
    (a time, a version, a round-off) for any such number, a run of spaces for any
    amount of white space, and a rule of ``=`` or ``-`` (pytest's, padded to the
    terminal's width) for any length of it."""
    shown = shown.strip()
    ruled = shown.startswith("=") and shown.endswith("=") and len(shown) > 1
    if ruled:  # pytest's centred line: the rule's length follows the text's
        shown = shown.strip("=").strip()
    parts = re.split(r"(\.\.\.|" + NUMBER + r"|\s+|={3,}|-{5,})", shown)
    regex = [r"=+\s*"] if ruled else []
    for part in parts:
        if not part:
            continue
        if part == "...":
            regex.append(".*")
        elif re.fullmatch(NUMBER, part):
            regex.append(r"[-+]?(?:" + NUMBER + ")")
        elif part.isspace():
            regex.append(r"\s+")
        elif re.fullmatch(r"={3,}", part):
            regex.append("=+")
        elif re.fullmatch(r"-{5,}", part):
            regex.append("-+")
        else:
            regex.append(re.escape(part))
    if ruled:
        regex.append(r"\s*=+")
    return re.compile("".join(regex))


def output_matches(shown: Sequence[str], output: str) -> Optional[str]:
    """``None`` if every shown line (but a line of ``...`` alone, which says "more
    output here") matches a line of ``output``, in order; else the first shown line that
    does not."""
    actual = [line.strip() for line in output.splitlines()]
    at = 0
    for line in shown:
        if not line.strip() or line.strip() == "...":
            continue
        # the whole line, or its end after a space or punctuation: what a program prints
        # may follow other text on its line (pytest's "collecting ... ", another rank's
        # line the launcher spliced in)
        pattern = re.compile(r"(?:.*[^\w.])?(?:" + line_pattern(line).pattern + ")")
        while at < len(actual) and not pattern.fullmatch(actual[at]):
            at += 1
        if at == len(actual):
            return line
        at += 1
    return None


# -- excerpts ---------------------------------------------------------------------------------
def excerpt_missing(block: Block) -> Optional[str]:
    """``None`` if each line of ``block`` (after its ``differs`` replacements) is a line
    of the ``excerpt-of`` file (a tested program, or a page whose block runs), in order,
    white space at the ends and trailing comments aside; else the first line that is
    not."""
    with open(os.path.join(ROOT, str(block.marker["excerpt-of"]))) as f:
        source = [_without_comment(line).strip() for line in f.read().split("\n")]
    text = block.text
    for change in block.marker.get("differs", []):
        shown, _, actual = str(change).partition("=>")
        if shown.strip() not in text:
            return f"(differs: {shown.strip()!r} is not in the block)"
        text = text.replace(shown.strip(), actual.strip())
    at = 0
    for line in text.split("\n"):
        line = _without_comment(line).strip()
        if not line:
            continue
        while at < len(source) and source[at] != line:
            at += 1
        if at == len(source):
            return line
        at += 1
    return None


# -- the workspace ------------------------------------------------------------------------------
def workspace(block: Block, folder: str) -> None:
    """Make ``folder`` the stand-in for the repository root that ``block`` runs in."""
    for name in os.listdir(ROOT):
        if name in SETUP or name.startswith((".venv", ".test-reports")):
            continue
        os.symlink(os.path.join(ROOT, name), os.path.join(folder, name))
    os.makedirs(os.path.join(folder, "docs", "results"))
    os.symlink(sys.prefix, os.path.join(folder, ".venv"))
    for earlier in blocks(block.page):
        if earlier.line >= block.line:
            break
        if "file" in earlier.marker:
            write(folder, str(earlier.marker["file"]), program(earlier))
    for path, text in block.marker.get("create", []):
        write(folder, path, text)


def write(folder: str, path: str, text: str) -> None:
    target = os.path.join(folder, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as f:
        f.write(text)


def program(block: Block) -> str:
    """A Python block's program: what it is ``given``, then the block as written."""
    given = str(block.marker.get("given", ""))
    return given + ("\n" if given and not given.endswith("\n") else "") + block.text


def environment() -> Dict[str, str]:
    """What a recipe adds to the user's environment: this Python's ``bin/`` first on
    ``PATH``, and pytest's terminal as wide as the pages show it."""
    return {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "COLUMNS": "80"}


def skip_reason(block: Block) -> Optional[str]:
    """Why ``block`` cannot run here, or ``None``."""
    marker = block.marker
    if "skip" in marker:
        return str(marker["skip"])
    need = marker.get("needs")
    if need and importlib.util.find_spec(str(need)) is None:
        return f"needs {need}, which is not installed"
    vendor = marker.get("mpi")
    if vendor:
        from mpi4py import MPI

        if not MPI.get_vendor()[0].startswith(str(vendor)):
            return f"shows {vendor}'s output; this MPI is {MPI.get_vendor()[0]}"
    return None


def skipped_commands(block: Block) -> List[Tuple[str, str]]:
    """``(prefix, reason)`` of the block's ``skip-command`` entries."""
    found = []
    for entry in block.marker.get("skip-command", []):
        prefix, _, reason = str(entry).partition(":")
        found.append((prefix.strip(), reason.strip()))
    return found


def shell_words(command: str) -> List[str]:
    return shlex.split(command)
