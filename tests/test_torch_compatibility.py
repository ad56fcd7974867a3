"""docs/torch-compatibility.md stays true: one row per name of torch 2.13's reference list
and per public function torch 2.14 adds, and every "same" row matches hpccomm's
signature (names, order, kinds, defaults).

The reference list is ``tests/torch_port/torch-distributed-signatures.txt`` (torch
2.13's signatures as ``inspect`` reads them), or the file ``HPCCOMM_TORCH_SIGNATURES``
names, plus the public functions of ``tests/torch_port/torch-2.14-distributed-additions.txt``
(what torch 2.14.1 adds).
"""
import inspect
import os
import re

import pytest

import hpccomm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "torch-compatibility.md")
CANDIDATES = [os.environ.get("HPCCOMM_TORCH_SIGNATURES", ""),
              os.path.join(ROOT, "tests", "torch_port", "torch-distributed-signatures.txt")]
ADDITIONS = os.path.join(ROOT, "tests", "torch_port", "torch-2.14-distributed-additions.txt")
STATUSES = ("same", "differs", "not provided")


def signatures_file():
    return next(path for path in CANDIDATES if path and os.path.exists(path))


def split_top(text, sep=","):
    """Split at ``sep`` outside brackets and quotes."""
    parts, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == sep and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current)
    return [part.strip() for part in parts]


def parse_params(text):
    """``[(name, kind, default text or None)]`` of a signature's parameter list, or
    ``None`` when it cannot be compared (``...``, ``*args, **kwargs``)."""
    if text.strip() == "...":
        return None
    params, keyword_only = [], False
    for part in split_top(text):
        if part == "*":
            keyword_only = True
            continue
        if part.startswith("*"):
            return None
        name = re.match(r"\w+", part).group(0)
        rest = part[len(name):].strip()
        # "name: annotation = default" or "name=default" (defaults may hold ':' and '=')
        default = rest.partition(" = ")[2] if rest.startswith(":") else rest[1:]
        if name == "self":
            continue
        params.append((name, "kw" if keyword_only else "pos", default.strip() or None))
    return params


def reference():
    """``{name: parameters or None}`` in file order, names as the table spells them."""
    entries, owner = {}, None
    with open(signatures_file()) as handle:
        for line in handle:
            line = line.rstrip("\n")
            top = re.match(r"^torch\.distributed\.((?:device_mesh\.)?\w+)\((.*)\)", line)
            member = re.match(r"^    \.(\w+)\((.*)\)", line)
            if top:
                name = top.group(1)
                owner = name.split(".")[-1]
                entries[name] = parse_params(top.group(2))
            elif member and owner:
                entries[f"{owner}.{member.group(1)}"] = parse_params(member.group(2))
            elif owner and line.startswith("    ") and "(self: " in line:
                # a C++ method's signature line: "name(self: T, arg0: str, ...) -> R"
                found = re.match(r"^    (\w+)\(self: [^,)]*(?:, )?(.*)\)", line)
                key = f"{owner}.{found.group(1)}" if found else None
                if key in entries and entries[key] is None:
                    entries[key] = [(name if not re.fullmatch(r"arg\d+", name) else None,
                                     kind, default)
                                    for name, kind, default in parse_params(found.group(2))]
    with open(ADDITIONS) as handle:  # torch 2.14's public functions
        for line in handle:
            top = re.match(r"^torch\.distributed\.([a-z]\w*)\((.*)\)", line.rstrip("\n"))
            if top:
                entries[top.group(1)] = parse_params(_without_annotations(top.group(2)))
    return entries


def _without_annotations(text):
    """``a: T | None = None, b: int = 0`` as ``a=None, b=0`` (2.14's list keeps the
    annotations and return type, which ``parse_params`` need not read)."""
    text = re.sub(r"\) -> .*$", "", text)
    return ", ".join(part.split(":")[0].strip() + (f"={part.split(' = ', 1)[1]}"
                                                   if " = " in part else "")
                     for part in split_top(text))


def table():
    """``{name: (status, notes)}`` from the document's table."""
    rows = {}
    with open(DOC) as handle:
        for line in handle:
            found = re.match(r"^\| `([\w.]+)` \| ([a-z ]+) \| (.*)\|$", line)
            if found:
                name, status, notes = found.groups()
                assert name not in rows, f"{name} has two rows"
                rows[name] = (status.strip(), notes.strip())
    return rows


def hpccomm_object(name):
    """The hpccomm object a table name stands for, or ``None`` if hpccomm lacks it."""
    parts = name.split(".")
    if parts[0] == "DeviceMesh":
        parts = ["device_mesh"] + parts
    obj = hpccomm
    for part in parts:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return None
    return obj


def hpccomm_params(obj):
    """``[(name, kind, default repr or None)]`` of hpccomm's callable, without ``self``."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = []
    for param in signature.parameters.values():
        if param.name == "self":
            continue
        kind = "kw" if param.kind is param.KEYWORD_ONLY else (
            "var" if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) else "pos")
        default = None if param.default is param.empty else repr(param.default)
        params.append((param.name, kind, default))
    return params


def mismatch(torch_params, ours):
    """Why the signatures differ, or ``None``. A ``None`` name (torch's ``argN``) matches
    any name."""
    if ours is None:
        return "hpccomm's signature cannot be read"
    if len(torch_params) != len(ours):
        return f"torch has {len(torch_params)} parameters, hpccomm {len(ours)}: {ours}"
    for (name, kind, default), (our_name, our_kind, our_default) in zip(torch_params, ours):
        if name is not None and name != our_name:
            return f"parameter {our_name!r} is {name!r} in torch"
        if kind != our_kind:
            return f"parameter {our_name!r} is {our_kind}, torch's is {kind}"
        if default != our_default:
            return f"parameter {our_name!r} defaults to {our_default}, torch's to {default}"
    return None


def test_every_reference_name_has_one_row():
    names, rows = list(reference()), table()
    assert len(names) > 100, f"the reference list looks truncated: {len(names)} names"
    missing = [name for name in names if name not in rows]
    extra = [name for name in rows if name not in names]
    assert not missing, f"no row in {DOC} for {missing}"
    assert not extra, f"rows for names outside the reference list: {extra}"
    bad = {name: status for name, (status, _) in rows.items() if status not in STATUSES}
    assert not bad, f"status must be one of {STATUSES}: {bad}"


def test_rows_without_notes_are_only_same():
    unexplained = [name for name, (status, notes) in table().items()
                   if status != "same" and not notes]
    assert not unexplained, f"a 'differs' or 'not provided' row must say why: {unexplained}"


@pytest.mark.parametrize("name", list(reference()))
def test_row_is_true(name):
    status, _ = table()[name]
    obj = hpccomm_object(name)
    if status == "not provided":
        assert obj is None, f"{name} is listed as not provided, but hpccomm has it"
        return
    assert obj is not None, f"{name} is listed as {status!r}, but hpccomm lacks it"
    torch_params = reference()[name]
    if status == "same" and torch_params is not None and callable(obj):
        problem = mismatch(torch_params, hpccomm_params(obj))
        assert problem is None, f"{name} is listed as 'same' but its signature differs: " \
                                f"{problem}"


def test_mismatches_are_detected():
    params = parse_params("tensor, op=<RedOpType.SUM: 0>, group=None, *, flag: bool = False")
    assert params == [("tensor", "pos", None), ("op", "pos", "<RedOpType.SUM: 0>"),
                      ("group", "pos", "None"), ("flag", "kw", "False")]

    def same(tensor, op=hpccomm.ReduceOp.SUM, group=None, *, flag=False):
        pass

    def other_default(tensor, op=hpccomm.ReduceOp.MAX, group=None, *, flag=False):
        pass

    def extra(tensor, op=hpccomm.ReduceOp.SUM, group=None, *, flag=False, more=1):
        pass

    assert mismatch(params, hpccomm_params(same)) is None
    assert "defaults to" in mismatch(params, hpccomm_params(other_default))
    assert "parameters" in mismatch(params, hpccomm_params(extra))


def test_user_guide_links_here():
    with open(os.path.join(ROOT, "docs", "user-guide.md")) as handle:
        assert "torch-compatibility.md" in handle.read()
