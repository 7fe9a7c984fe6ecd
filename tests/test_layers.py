"""The shape of the house (docs/architecture.md): each package imports only itself and the layers below it,
no two modules import each other (directly or round a longer loop; at module level, inside a function or only
for the type checker alike), and no module under esqbe/ is longer than 700 lines (one job a module; ~600 is the
aim)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "esqbe"
MAX_LINES = 700

# A module may import modules of its own unit and of units in a LOWER layer; units of one layer do not
# import each other. `esqbe` itself (the lazy facade of esqbe/__init__.py) sits on top: the CLI imports it
# for esqbe.open_index, and importing it is allowed everywhere.
LAYERS = {
    "esqbe.errors": 0,
    "esqbe.core": 1,
    "esqbe.domain": 2,
    "esqbe.rescore": 3, "esqbe.ingest": 3,
    "esqbe.settings": 4,
    "esqbe.encode": 5,
    "esqbe.tagger": 6,
    "esqbe.backends": 7,
    "esqbe.query": 8,
    "esqbe.index": 9,
    "esqbe.evaluation": 10, "esqbe.server": 10, "esqbe.distributed": 10,
    "esqbe.cli": 11,
    "esqbe": 12,
}

# what `import esqbe` / `from esqbe import ...` gives (the names of esqbe/__init__.py's lazy __getattr__)
FACADE = {"esqbe"} | {f"esqbe.{name}" for name in
                      ("open_index", "open_backend", "encoder_only", "Index", "IndexReport", "EncodeReport")}


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module under esqbe/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        out[dotted] = path
    return out


def unit(module: str) -> str | None:
    parts = module.split(".")
    for n in (2, 1):
        name = ".".join(parts[:n])
        if name in LAYERS and (n == 1 or len(parts) >= 2):
            return name
    return None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def _imported(node: ast.Import | ast.ImportFrom, me: str, is_package: bool) -> list[str]:
    """The esqbe modules (or `module.name`s) an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = me.split(".") if is_package else me.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [module] + [f"{module}.{a.name}" for a in node.names]


def imports(path: Path, me: str, *, module_level_only: bool, type_checking: bool = False) -> list[tuple[int, str]]:
    """(line, imported name) of each esqbe import in a module, `if TYPE_CHECKING:` blocks left out unless
    `type_checking`; with `module_level_only`, imports inside functions (run later, on a call) are left out too."""
    tree = ast.parse(path.read_text())
    skip = set() if type_checking else _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    found = []

    def visit(node: ast.AST) -> None:
        if id(node) in skip:
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.extend((node.lineno, t) for t in _imported(node, me, is_package) if t.startswith("esqbe"))
        if module_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def layering_violations() -> list[str]:
    bad = []
    for me, path in modules().items():
        mine = unit(me) if me != "esqbe" else "esqbe"
        assert mine is not None, f"{me} belongs to no layer: add its package to LAYERS (and docs/architecture.md)"
        for line, target in imports(path, me, module_level_only=False):
            if target in FACADE:
                continue
            other = unit(target)
            if other is None or other == mine:
                continue
            if LAYERS[other] >= LAYERS[mine]:
                rel = path.relative_to(ROOT).as_posix()
                bad.append(f"{rel}:{line}: {mine} (layer {LAYERS[mine]}) imports {target} (layer {LAYERS[other]})")
    return sorted(set(bad))


def import_graph(*, every: bool = False) -> dict[str, set[str]]:
    """Module -> the esqbe modules it imports when it is imported (module level, TYPE_CHECKING left out); with
    `every`, every import it names: inside functions and under TYPE_CHECKING too (the facade `esqbe`, which
    imports lazily on a name's first use, left out)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for me, path in known.items():
        if every and me == "esqbe":
            continue
        graph[me] = set()
        for _, target in imports(path, me, module_level_only=not every, type_checking=every):
            # `from esqbe.x import y`: esqbe.x, and esqbe.x.y where y is a module
            if target in known and target != me and not (every and target == "esqbe"):
                graph[me].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_every_package_imports_only_its_own_and_lower_layers():
    violations = layering_violations()
    assert not violations, "\n".join(violations)


def test_no_module_level_import_cycles():
    graph = import_graph()
    assert len(graph) > 40 and graph["esqbe.server.app"], "the import graph is empty: the walk is broken"
    assert not cycles(graph), cycles(graph)


def test_no_import_cycles_at_all():
    """Not round a lazy import inside a function, nor round one made only for the type checker: a module that
    needs another's types and the other its functions means one of them holds what belongs to a third."""
    graph = import_graph(every=True)
    assert graph["esqbe.query.combine"] >= {"esqbe.query.results", "esqbe.query.search"}, "the walk is broken"
    found = cycles(graph)
    assert not found, "import cycles (module level, in functions or under TYPE_CHECKING): " + "; ".join(
        " -> ".join(c) for c in found)


def test_type_only_and_lazy_imports_are_seen(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from esqbe.query import results\n"
                      "def f():\n    from esqbe.query.search import facet_view\n")
    every = [name for _, name in imports(source, "esqbe.query.m", module_level_only=False, type_checking=True)]
    assert "esqbe.query.results" in every and "esqbe.query.search" in every
    assert imports(source, "esqbe.query.m", module_level_only=True) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_over_700_lines():
    lengths = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in modules().values()}
    too_long = {name: n for name, n in sorted(lengths.items()) if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them: one job a module): {too_long}"
