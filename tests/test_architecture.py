"""The import graph of hpccomm follows the layers written in docs/architecture.md.

The rules are read from that page's tables (one source for the doc and this test); the
graph is read from the source with ``ast``: every ``import`` and ``from ... import``,
inside functions too. A failure names the importing module, the line and the rule.
The tests themselves share helper modules, never each other's test files.
"""
import ast
import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hpccomm"
DOC = ROOT / "docs" / "architecture.md"
DEFAULT_MARK = "every module not named in this table"
TOP = "__init__"


class Rules(NamedTuple):
    allowed: Dict[str, Set[str]]        # layer -> layers it may import
    modules: Dict[str, str]             # flat module name -> layer
    packages: Dict[str, str]            # subpackage name -> layer
    default: str                        # layer of modules the table does not name
    extra: Dict[str, Set[str]]          # module -> further layers it may import


def _rows(text: str, header: str) -> List[List[str]]:
    """The cells of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _layers(cell: str) -> Set[str]:
    return {word.strip() for word in cell.split(",") if word.strip()}


def read_rules(text: str) -> Rules:
    """The layer rules of docs/architecture.md's tables."""
    allowed, modules, packages, default = {}, {}, {}, None
    for layer, names, may in _rows(text, "| layer | modules | may import |"):
        allowed[layer] = _layers(may)
        for name in re.findall(r"`([^`]+)`", names):
            if name.endswith("/"):
                packages[name[:-1]] = layer
            else:
                modules[name] = layer
        if DEFAULT_MARK in names:
            default = layer
    extra = {}
    for module, may, _why in _rows(text, "| module | may also import | why |"):
        extra[module.strip("`")] = _layers(may)
    assert default is not None, f"no layer takes '{DEFAULT_MARK}'"
    return Rules(allowed, modules, packages, default, extra)


def layer_of(module: str, rules: Rules) -> str:
    """The layer of a module named relative to the package (``backends.mpi``)."""
    head = module.split(".")[0]
    if head in rules.packages:
        return rules.packages[head]
    return rules.modules.get(module, rules.default)


def placed(module: str, rules: Rules) -> bool:
    """Whether the table names the module or its subpackage (else: the default layer)."""
    return module.split(".")[0] in rules.packages or module in rules.modules


def _name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or TOP


def read_graph(package: Path = PACKAGE) -> Dict[str, Set[Tuple[str, int]]]:
    """``{module: {(imported hpccomm module, line)}}`` for every module of the package;
    names are relative to the package, the package itself is ``__init__``."""
    files = {_name(path, package): path for path in package.rglob("*.py")}
    known = set(files)
    graph: Dict[str, Set[Tuple[str, int]]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        here = [] if module == TOP else module.split(".")
        if not is_package:
            here = here[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
                targets = [t[len("hpccomm."):] if t.startswith("hpccomm.") else
                           (TOP if t == "hpccomm" else None) for t in targets]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    if node.level - 1 > len(here):  # beyond the package: not ours
                        continue
                    base = here[:len(here) - (node.level - 1)]
                    where = ".".join(base + (node.module.split(".") if node.module else []))
                    where = where or TOP
                elif node.module == "hpccomm" or (node.module or "").startswith("hpccomm."):
                    where = TOP if node.module == "hpccomm" else node.module[len("hpccomm."):]
                else:
                    continue
                for alias in node.names:  # ``from . import x``: x may be a module
                    prefix = "" if where == TOP else where + "."
                    sub = prefix + alias.name
                    targets.append(sub if sub in known else where)
            for target in targets:
                if target is None:
                    continue
                while target not in known and "." in target:  # an attribute's module
                    target = target.rsplit(".", 1)[0]
                if target in known and target != module:
                    found.add((target, node.lineno))
        graph[module] = found
    return graph


def circles(graph: Dict[str, Set[Tuple[str, int]]]) -> List[List[str]]:
    """Sets of modules that import each other, directly or through others (Tarjan)."""
    edges = {m: {t for t, _ in targets} for m, targets in graph.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def problems(graph: Dict[str, Set[Tuple[str, int]]], rules: Rules) -> List[str]:
    """Every import against the layers, and every circle, in words."""
    found = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module, rules)
        may = rules.allowed[layer] | rules.extra.get(module, set())
        for target, line in sorted(targets):
            other = layer_of(target, rules)
            if other not in may:
                hint = "" if placed(target, rules) else (
                    f" ({target} is not named in docs/architecture.md's table, so it counts "
                    f"as {other}: name it in the row of its layer)")
                found.append(f"{module} (line {line}, layer {layer}) imports {target} "
                             f"(layer {other}); {layer} may import only "
                             f"{', '.join(sorted(may))}{hint}")
    for component in circles(graph):
        found.append("circle of imports: " + " <-> ".join(component))
    return found


RULES = read_rules(DOC.read_text())


def test_hpccomm_imports_follow_the_layers_and_make_no_circle():
    graph = read_graph()
    assert any(target == "_call" for target, _ in graph["collectives"])  # the reader works
    assert problems(graph, RULES) == []


def test_the_table_names_real_modules_and_known_layers():
    layers = set(RULES.allowed)
    assert {"core", "backends", "dispatch", "public", "diagnostics", "tools", "top"} <= layers
    for may in list(RULES.allowed.values()) + list(RULES.extra.values()):
        assert may <= layers, may
    graph = read_graph()
    for name in RULES.modules:  # a renamed module must not slip into the default layer
        assert name in graph, f"docs/architecture.md names {name}, which does not exist"
    assert layer_of("backends.shm_ring", RULES) == "backends"
    assert layer_of("torch.backend", RULES) == "tools"
    assert layer_of("diagnostics.desync", RULES) == "diagnostics"
    assert layer_of("observe", RULES) == "core" and layer_of(TOP, RULES) == "top"


def test_the_top_level_holds_the_named_modules_and_the_layer_folders():
    """A flat module or a folder at the top of hpccomm/ must be named in the table: the
    top shows the public modules and the layers, and a tool lives in a tools folder."""
    flat = {path.stem for path in PACKAGE.glob("*.py")} - {TOP}
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert not flat - set(RULES.modules), (
        f"flat modules at the top of hpccomm/ that docs/architecture.md does not name: "
        f"{sorted(flat - set(RULES.modules))}; a tool goes into a tools folder "
        f"({', '.join(sorted(p for p, layer in RULES.packages.items() if layer == 'tools'))})")
    assert not folders - set(RULES.packages), sorted(folders - set(RULES.packages))
    # DeviceMesh and the command line are rooms of their own, public paths kept
    assert {"device_mesh", "cli"} <= folders
    tools_flat = {m for m, layer in RULES.modules.items() if layer == "tools"}
    assert tools_flat == {"pytest_plugin", "trace", "__main__"}, tools_flat


def test_the_dispatch_path_imports_no_diagnostic():
    graph = read_graph()
    for module in ("_call", "work", "init", "group", "observe"):
        assert not [t for t, _ in graph[module] if t.startswith("diagnostics")], module


def module_level_imports(path: Path) -> Set[str]:
    """Top-level names of the packages a file imports when it is imported (not inside
    functions, where an import waits until the function runs)."""
    found: Set[str] = set()
    pending = list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        pending.extend(ast.iter_child_nodes(node))
    return found


def test_only_the_torch_adapter_imports_torch_when_imported():
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "torch":
            continue
        assert "torch" not in module_level_imports(path), path


def test_a_bad_graph_is_rejected():
    """The same checks fail on a graph that breaks each rule."""
    bad = {
        "work": {("diagnostics.desync", 10)},          # core reaching up to diagnostics
        "diagnostics.desync": {("work", 3)},           # ... which imports it back: circle
        "checkpoint.writer": {(TOP, 5)},               # a tool importing the package root
        "backends.mpi": {("group", 7)},                # a backend reaching the dispatch path
        "pytest_plugin": {(TOP, 9)},                   # allowed: the stated exception
        "collectives": {("_call", 1)},                 # allowed: public -> dispatch
        "objects": {("new_helper", 4)},                # a module the table does not name
    }
    found = problems(bad, RULES)
    assert len(found) == 5, found
    assert any(p.startswith("work (line 10, layer core) imports diagnostics.desync")
               for p in found)
    assert any(p.startswith("checkpoint.writer (line 5, layer tools) imports __init__")
               for p in found)
    assert any(p.startswith("backends.mpi (line 7, layer backends) imports group")
               for p in found)
    assert "circle of imports: diagnostics.desync <-> work" in found
    assert ("objects (line 4, layer public) imports new_helper (layer tools); public may "
            "import only core, dispatch, public (new_helper is not named in "
            "docs/architecture.md's table, so it counts as tools: name it in the row of its "
            "layer)") in found


def test_the_graph_reader_sees_every_form_of_import(tmp_path):
    package = tmp_path / "hpccomm"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import x\n")
    (package / "a.py").write_text("import hpccomm.b\nfrom hpccomm.sub.c import y\nx = 1\n")
    (package / "b.py").write_text("def later():\n    from . import a\n    from .. import z\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from .. import x\nfrom ..b import later\ny = 2\n")
    graph = read_graph(package)
    assert {t for t, _ in graph["a"]} == {"b", "sub.c"}
    assert {t for t, _ in graph["b"]} == {"a"}  # inside a function; `..` leaves the package
    assert {t for t, _ in graph["sub.c"]} == {TOP, "b"}
    assert {t for t, _ in graph[TOP]} == {"a"}
    # a -> b -> a (in a function), and a -> sub.c -> the package -> a
    assert circles(graph) == [[TOP, "a", "b", "sub.c"]]
    assert module_level_imports(package / "a.py") == {"hpccomm"}
    assert module_level_imports(package / "b.py") == set()  # only inside a function


# -- settings: every HPCCOMM_* variable is declared in hpccomm/settings.py and read there ------
SETTINGS_MODULE = "settings"
VARIABLE = re.compile(r"HPCCOMM_[A-Z0-9_]*[A-Z0-9]")


def _docstrings(tree: ast.AST) -> Set[int]:
    """``id`` of every docstring constant in ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and \
                    isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                found.add(id(body[0].value))
    return found


def _environ_key(node: ast.AST) -> "ast.AST | None":
    """The key ``node`` reads from the environment (``os.environ.get(K)``,
    ``os.environ[K]``, ``os.getenv(K)``, ``K in os.environ``), or ``None``."""
    def is_environ(expr: ast.AST) -> bool:
        text = ast.unparse(expr)
        return text in ("os.environ", "environ", "env", "environment")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        if node.func.attr in ("get", "pop", "setdefault") and is_environ(node.func.value):
            return node.args[0]
        if node.func.attr == "getenv" and ast.unparse(node.func.value) == "os":
            return node.args[0]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
            is_environ(node.value):
        return node.slice
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and \
            isinstance(node.ops[0], (ast.In, ast.NotIn)) and is_environ(node.comparators[0]):
        return node.left
    return None


def setting_problems(package: Path = PACKAGE) -> List[str]:
    """Every ``HPCCOMM_*`` name the package mentions that settings.py does not declare,
    and every place outside settings.py that spells such a name as a string in code or
    reads one from the environment, in words."""
    from hpccomm import settings

    found = []
    for path in sorted(package.rglob("*.py")):
        module = _name(path, package)
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), start=1):
            for name in VARIABLE.findall(line):
                if name not in settings.SETTINGS:
                    found.append(f"{module} (line {number}) names {name}, which "
                                 f"hpccomm/settings.py does not declare: declare it there")
        if module == SETTINGS_MODULE:
            continue
        tree = ast.parse(text, str(path))
        docstrings = _docstrings(tree)
        aliases = set()  # names bound to ``settings.X.name``
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and re.fullmatch(
                    r"(settings\.)?[A-Z0-9_]+\.name", ast.unparse(node.value)):
                aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
        lines = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    VARIABLE.fullmatch(node.value) and id(node) not in docstrings:
                lines.append(f"{module} (line {node.lineno}) spells {node.value!r}: read it "
                             f"with settings.{node.value[len('HPCCOMM_'):]}.get() (its "
                             f"name: .name)")
            key = _environ_key(node)
            if key is not None and (ast.unparse(key) in aliases or re.fullmatch(
                    r"(settings\.)?[A-Z0-9_]+\.name", ast.unparse(key))):
                lines.append(f"{module} (line {node.lineno}) reads {ast.unparse(key)} from "
                             f"the environment itself: use the setting's .get(), which "
                             f"parses it as every other reader does")
        found.extend(sorted(lines, key=lambda p: int(p.split("(line ")[1].split(")")[0])))
    return found


def test_every_hpccomm_variable_is_declared_and_read_through_settings():
    assert setting_problems() == []


def test_the_settings_check_sees_every_form_of_read(tmp_path):
    package = tmp_path / "hpccomm"
    package.mkdir()
    (package / "settings.py").write_text("X = 'HPCCOMM_SHM'\n")  # settings.py may spell it
    (package / "a.py").write_text(
        '"""Mentions ``HPCCOMM_SHM`` in a docstring."""\n'
        "import os\n"
        "from . import settings\n"
        "ENV = settings.SHM.name\n"
        "a = os.environ.get('HPCCOMM_SHM')\n"           # line 5: spelled and read
        "b = os.getenv(settings.SHM.name)\n"            # line 6: read around .get()
        "c = ENV in os.environ\n"                       # line 7: through an alias
        "d = settings.SHM.get()\n"                      # fine
        "e = 'HPCCOMM_NO_SUCH_THING'\n")                # line 9: undeclared, and spelled
    found = setting_problems(package)
    assert [p.split(" ", 3)[:3] for p in found] == [
        ["a", "(line", "9)"], ["a", "(line", "5)"], ["a", "(line", "6)"], ["a", "(line", "7)"],
        ["a", "(line", "9)"]], found
    assert not any("settings (line" in p for p in found)
    assert "does not declare" in found[0] and "spells 'HPCCOMM_SHM'" in found[1]


# -- launcher variables: read by hpccomm/launcher_env.py only --------------------------------
READER_MODULE = "launcher_env"
#: What the launchers, torchrun, batch systems and MPI libraries set for a process.
LAUNCHER_VARIABLE = re.compile(
    r"(OMPI_|PMI_|PMIX_|PRTE_|PALS_|SLURM_|MV2_|I_MPI_|MPI_LOCAL|MPICH_|MPIR_CVAR_|HYDRA_|"
    r"TORCHELASTIC_|PBS_|LSB_|FLUX_)[A-Za-z0-9_]*|(GROUP_|ROLE_|LOCAL_)?RANK|"
    r"(GROUP_|ROLE_|LOCAL_)?WORLD_SIZE|MASTER_ADDR|MASTER_PORT|JOB_ID")


def launcher_variable_problems(package: Path = PACKAGE) -> List[str]:
    """Every place outside settings.py and launcher_env.py that reads a launcher's
    variable from the environment (or reads it with a key computed at run time, which
    may be one), in words. Writing them (``hpccomm run`` sets ``RANK``) is fine."""
    found = []
    for path in sorted(package.rglob("*.py")):
        module = _name(path, package)
        if module in (SETTINGS_MODULE, READER_MODULE):
            continue
        tree = ast.parse(path.read_text(), str(path))
        lines = []
        for node in ast.walk(tree):
            key = _environ_key(node)
            if key is None:
                continue
            if isinstance(key, ast.Constant):
                if isinstance(key.value, str) and LAUNCHER_VARIABLE.fullmatch(key.value):
                    lines.append((node.lineno, f"{module} (line {node.lineno}) reads "
                                  f"{key.value} from the environment itself: ask "
                                  f"hpccomm.launcher_env, which parses it as every other "
                                  f"reader does"))
            elif not re.fullmatch(r"(settings\.)?[A-Z0-9_]+\.name", ast.unparse(key)):
                lines.append((node.lineno, f"{module} (line {node.lineno}) reads the "
                              f"environment at a computed key ({ast.unparse(key)}): read "
                              f"HPCCOMM_* through settings, the launchers' variables "
                              f"through launcher_env"))
        found.extend(text for _, text in sorted(lines))
    return found


def test_launcher_variables_are_read_by_launcher_env_only():
    assert launcher_variable_problems() == []


def test_every_variable_launcher_env_reads_is_a_launcher_variable():
    """The check knows every variable the reader reads (else a module reading one of
    them itself would go unnoticed)."""
    from hpccomm import launcher_env

    names = [name for pair in launcher_env.RANK_VARS + launcher_env.LOCAL_VARS
             for name in pair if name]
    names += [*launcher_env.TORCHRUN_RANK, *launcher_env.TORCHRUN_LOCAL,
              *launcher_env.JOB_ID_VARS, *launcher_env.NODE_ID_VARS]
    assert [name for name in names if not LAUNCHER_VARIABLE.fullmatch(name)] == []


def test_the_launcher_variable_check_sees_every_form_of_read(tmp_path):
    package = tmp_path / "hpccomm"
    package.mkdir()
    (package / "launcher_env.py").write_text("import os\nr = os.environ.get('PMI_RANK')\n")
    (package / "a.py").write_text(
        "import os\n"
        "from . import settings\n"
        "a = os.environ.get('SLURM_PROCID')\n"          # line 3
        "b = os.getenv('LOCAL_RANK', '0')\n"            # line 4
        "c = 'MASTER_PORT' in os.environ\n"             # line 5
        "def f(env):\n"
        "    return env['OMPI_COMM_WORLD_RANK']\n"      # line 7
        "for name in ('RANK', 'PMI_RANK'):\n"
        "    d = os.environ.get(name)\n"                # line 9: computed
        "os.environ['RANK'] = '0'\n"                    # fine: a write
        "e = os.environ.get('PATH')\n"                  # fine: not a launcher's
        "g = os.environ.get(settings.SHM.name)\n")      # the settings check's business
    found = launcher_variable_problems(package)
    assert [p.split(" ", 3)[:3] for p in found] == [
        ["a", "(line", "3)"], ["a", "(line", "4)"], ["a", "(line", "5)"], ["a", "(line", "7)"],
        ["a", "(line", "9)"]], found
    assert "reads SLURM_PROCID from the environment itself" in found[0]
    assert "computed key (name)" in found[4]


# -- private names stay in their module ------------------------------------------------------
#: Private names a module may take from another, and why (keep this short).
PRIVATE_ALLOWED = {
    "__init__": {"_get_default_store", "_make_nccl_premul_sum"},  # torch.distributed's
    # own names, underscore included: code written for torch calls them as hpccomm.<name>
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules_of(package: Path) -> Dict[str, Path]:
    """Every module of the package by dotted name, compiled helpers (``.so``) included."""
    found = {_name(path, package): path for path in package.rglob("*.py")}
    for path in package.rglob("*.so"):
        found[_name(path.with_name(path.name.split(".")[0] + ".py"), package)] = path
    return found


def private_name_problems(package: Path = PACKAGE) -> List[str]:
    """Every ``from x import _y`` and ``x._y`` in which ``x`` is another hpccomm module and
    ``_y`` one of its private names (not a module of its own, not a dunder), in words."""
    modules = _modules_of(package)
    found = []
    for module, path in sorted(modules.items()):
        if path.suffix != ".py":
            continue
        here = [] if module == TOP else module.split(".")
        if path.name != "__init__.py":
            here = here[:-1]
        tree = ast.parse(path.read_text(), str(path))
        bound: Dict[str, str] = {}  # local name -> hpccomm module it names
        lines = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("hpccomm.") and alias.asname:
                        bound[alias.asname] = alias.name[len("hpccomm."):]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    if node.level - 1 > len(here):
                        continue
                    base = here[:len(here) - (node.level - 1)]
                    where = ".".join(base + (node.module.split(".") if node.module else []))
                elif node.module == "hpccomm" or (node.module or "").startswith("hpccomm."):
                    where = node.module[len("hpccomm."):] if "." in node.module else ""
                else:
                    continue
                for alias in node.names:
                    full = f"{where}.{alias.name}" if where else alias.name
                    if full in modules:
                        bound[alias.asname or alias.name] = full
                    elif _private(alias.name) and (where or TOP) != module and \
                            alias.name not in PRIVATE_ALLOWED.get(module, ()):
                        lines.append((node.lineno, f"{module} (line {node.lineno}) imports "
                                      f"{alias.name} from {where or TOP}, a private name of "
                                      f"that module: give it a public name there"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and \
                    isinstance(node.value, ast.Name) and node.value.id in bound:
                target = bound[node.value.id]
                if f"{target}.{node.attr}" not in modules and target != module:
                    lines.append((node.lineno, f"{module} (line {node.lineno}) uses "
                                  f"{node.value.id}.{node.attr}, a private name of {target}: "
                                  f"give it a public name there"))
        found.extend(text for _, text in sorted(lines))
    return found


def _root(expr: ast.AST) -> "ast.AST":
    """The leftmost part of an expression like ``a.b(c)[d].e``."""
    while isinstance(expr, (ast.Attribute, ast.Call, ast.Subscript)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr


def _own_private_names(tree: ast.AST) -> Set[str]:
    """Private names a module defines: functions, classes, variables, arguments,
    attributes it assigns or lists in ``__slots__``."""
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            found.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {name for name in found if _private(name)}


def _attribute_uses(tree: ast.AST):
    """``(node, object expression, attribute name)`` of every ``obj.name``. (A name
    given to ``getattr`` as a string is not followed: objects handed in by the user,
    such as torch's options, make that guess wrong too often.)"""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node, node.value, node.attr


def foreign_attribute_problems(package: Path = PACKAGE) -> List[str]:
    """Every ``obj._y`` where ``_y`` is a private attribute that only other hpccomm
    modules define (``work._state`` outside work.py), in words. ``self``/``cls``/
    ``super()`` and objects of other libraries (the root of the expression imported from
    outside hpccomm: torch's ``dist.distributed_c10d._world``) are not checked. A module
    that defines a private name of the same spelling itself is not checked for it: the
    check finds reaching into another module's objects, not every case of it."""
    trees = {_name(path, package): ast.parse(path.read_text(), str(path))
             for path in package.rglob("*.py")}
    own = {module: _own_private_names(tree) for module, tree in trees.items()}
    found = []
    for module, tree in sorted(trees.items()):
        foreign: Set[str] = set()  # names bound to other libraries' modules and objects
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                foreign.update((alias.asname or alias.name).split(".")[0]
                               for alias in node.names if not alias.name.startswith("hpccomm"))
            elif isinstance(node, ast.ImportFrom) and not node.level and \
                    not (node.module or "").startswith("hpccomm"):
                foreign.update(alias.asname or alias.name for alias in node.names)
        lines = []
        for node, obj, attr in _attribute_uses(tree):
            if not _private(attr) or attr in own[module]:
                continue
            root = _root(obj)
            if isinstance(root, ast.Name) and root.id in foreign | {"self", "cls", "super"}:
                continue
            owners = sorted(m for m, names in own.items() if attr in names)
            if owners:
                lines.append((node.lineno, f"{module} (line {node.lineno}) uses "
                              f"{ast.unparse(node)}, a private attribute that only "
                              f"{', '.join(owners)} define: give it a public name there"))
        found.extend(text for _, text in sorted(lines))
    return found


def test_no_module_uses_another_modules_private_names():
    assert private_name_problems() == []
    assert foreign_attribute_problems() == []


def test_the_private_name_check_sees_imports_and_attributes(tmp_path):
    package = tmp_path / "hpccomm"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_helper.py").write_text("_x = 1\n")         # a private module: importable
    (package / "a.py").write_text("_y = 2\ndef f(self):\n    return self._z\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from .. import _helper, a\n"                       # fine: modules
        "from ..a import _y\n"                               # line 2: a private name
        "import hpccomm.a as alias\n"
        "v = a._y + alias._y + _helper._x\n"                 # line 4: three uses
        "w = a.__name__ + a.f.__doc__\n"                     # fine: dunders
        "import numpy\nu = numpy._core\n")                   # fine: not hpccomm's
    found = private_name_problems(package)
    assert [p.split(" (line ")[1].split(")")[0] for p in found] == ["2", "4", "4", "4"], found
    assert found[0] == ("sub.b (line 2) imports _y from a, a private name of that module: "
                        "give it a public name there")
    assert any("uses _helper._x, a private name of _helper:" in p for p in found), found
    assert any("uses alias._y, a private name of a:" in p for p in found), found


def test_the_attribute_check_sees_other_modules_private_attributes(tmp_path):
    package = tmp_path / "hpccomm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "work.py").write_text(
        "class Work:\n    __slots__ = ('_state',)\n    def __init__(self):\n"
        "        self._state = 0\n        self._error = None\n")
    (package / "recorder.py").write_text(
        "import torch.distributed as dist\n"
        "from .work import Work\n"
        "class Ring:\n    def __init__(self):\n        self._size = 1\n"
        "def entry(work, ring, other):\n"
        "    return (work._state,\n"                      # line 7: work.py's
        "            ring._size, other._size,\n"            # fine: this module's own name
        "            dist.distributed_c10d._world,\n"       # fine: torch's
        "            Work()._error)\n")                     # line 10: work.py's
    found = foreign_attribute_problems(package)
    assert found == [
        "recorder (line 7) uses work._state, a private attribute that only work define: "
        "give it a public name there",
        "recorder (line 10) uses Work()._error, a private attribute that only work define: "
        "give it a public name there"], found


# -- tests share helpers, not each other -----------------------------------------------------
def imports_of_test_modules(tests: Path = ROOT / "tests") -> List[str]:
    """Each import of a test module by a file under ``tests``, as a problem to report."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(tests)} (line {node.lineno}) imports {name}: move "
                      f"what it takes into a helper module" for name in names
                      if name.split(".")[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another():
    """What several test files share (fixtures, cases, constants) lives in a helper
    module (``helpers``, ``gpu_cases``, ``torch_cases``, ``slurm_cluster``, ...), so each
    test file is read, run and changed alone."""
    assert imports_of_test_modules() == []


def test_the_test_import_check_sees_every_form(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "helpers.py").write_text("import numpy\n")
    (tmp_path / "test_a.py").write_text(
        "import helpers\n"                                 # fine: a helper
        "from test_b import x\n"                           # line 2
        "def f():\n"
        "    import test_c as c\n")                        # line 4: inside a function
    (tmp_path / "sub" / "test_d.py").write_text("from tests.test_a import f\n")
    assert imports_of_test_modules(tmp_path) == [
        "sub/test_d.py (line 1) imports tests.test_a: move what it takes into a helper module",
        "test_a.py (line 2) imports test_b: move what it takes into a helper module",
        "test_a.py (line 4) imports test_c: move what it takes into a helper module"]
