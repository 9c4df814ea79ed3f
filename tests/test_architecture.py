"""The package's shape: every module one job (at most 400 lines), and no import cycle among
specli's modules, counting the imports made inside functions (a cycle hidden there is still a
cycle: two modules that each need the other)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specli"
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The specli modules ``name`` imports, anywhere in it (``from pkg import mod`` names the
    module ``pkg.mod`` where there is one, else the package)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [_one_cycle(g, set(grp)) for grp in groups]


def _one_cycle(g: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path that leaves the group's first module and comes back to it."""
    start = min(group)
    prev = {start: None}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(g[v] & group):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if w not in prev:
                prev[w] = v
                todo.append(w)
    return sorted(group)


def test_no_module_over_400_lines():
    long = {name: n for name, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_no_import_cycle_not_even_inside_functions():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("g, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c", "a"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_the_cycle_finder_finds_cycles(g, expected):
    assert cycles(g) == expected


def test_the_graph_sees_imports_inside_functions(tmp_path):
    known = {"specli.x": tmp_path / "x.py", "specli.y": tmp_path / "y.py"}
    known["specli.x"].write_text("def f():\n    from specli.y import thing\n    return thing\n")
    assert imports("specli.x", known["specli.x"], known) == {"specli.y"}


# -- the tests' own shape -------------------------------------------------------------------

TESTS = ROOT / "tests"


def imported_names(path: Path) -> set[str]:
    """Every dotted name ``path`` imports, anywhere in it: the modules of ``import`` and ``from``
    statements and, for ``from``, each name imported with its module (``from . import test_x``
    is ``.test_x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            out.add(mod)
            out.update(f"{mod}.{a.name}" if node.module else f"{mod}{a.name}" for a in node.names)
    return out


def imported_test_modules(path: Path, test_modules: set[str]) -> set[str]:
    """The test modules (``test_*.py`` under tests/) that ``path`` imports."""
    return {part for name in imported_names(path) for part in name.split(".") if part in test_modules}


def test_no_test_module_imports_another():
    """Shared test helpers live in tests/conftest.py or a helper module (tests/<topic>help.py),
    never in a test module: importing one runs its tests' module code under a second name and
    ties two test files together."""
    test_modules = {p.stem for p in TESTS.rglob("test_*.py")}
    found = {str(p.relative_to(ROOT)): sorted(got) for p in sorted(TESTS.rglob("*.py"))
             if (got := imported_test_modules(p, test_modules - {p.stem}))}
    assert not found, f"modules under tests/ that import a test module (move the helper to a *help.py): {found}"


@pytest.mark.parametrize("source, expected", [
    ("from test_hub import one_line_error\n", {"test_hub"}),
    ("import tests.test_hub as h\n", {"test_hub"}),
    ("from tests import test_hub\n", {"test_hub"}),
    ("from . import test_hub\n", {"test_hub"}),
    ("def f():\n    from test_hub import cache_file\n", {"test_hub"}),
    ("from hubhelp import one_line_error\nimport test_hubx\n", set()),
])
def test_the_test_import_finder_sees_every_form(tmp_path, source, expected):
    p = tmp_path / "test_x.py"
    p.write_text(source)
    assert imported_test_modules(p, {"test_hub", "test_x"}) == expected
