"""The house rules of imports, read statically from every module: four floors, no cycles, no private names.

Floors: cluster -> policies -> measurers -> graphs; a module may import only its own floor or lower ones.
Imports inside functions count too (they are still dependencies, only later ones); imports under
``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOORS = ("graphs", "measurers", "policies", "cluster")  # lowest first


def project_modules() -> dict[str, Path]:
    modules = {}
    for floor in FLOORS:
        for path in sorted((REPO / floor).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of the tree except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    skipped = {id(inner) for node in ast.walk(tree)
               if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for child in node.body for inner in ast.walk(child)}
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def imports_of(path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every project import the file runs."""
    found = []
    for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names if alias.name.split(".")[0] in FLOORS]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in FLOORS:
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:  # `from pkg import module`
                    found.append((submodule, "", node.lineno))
                else:
                    found.append((node.module, alias.name, node.lineno))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for target, _, _ in imports_of(path, modules):
            if target in modules and target != name and not name.startswith(target + "."):
                graph[name].add(target)  # a package's __init__ imported by its own submodule is no cycle
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (a list of modules, first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_layering__no_import_cycle_between_files():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_layering__find_cycle_sees_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_layering__no_floor_imports_a_higher_one():
    modules = project_modules()
    upward = []
    for name, path in modules.items():
        floor = FLOORS.index(name.split(".")[0])
        for target, _, line in imports_of(path, modules):
            if FLOORS.index(target.split(".")[0]) > floor:
                upward.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not upward, "\n".join(upward)


def test_layering__no_relative_imports():
    """Relative imports would slip past every other check here (they name no floor)."""
    relative = [f"{path.relative_to(REPO)}:{node.lineno}" for path in project_modules().values()
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, "\n".join(relative)


def test_layering__no_module_imports_another_modules_private_name():
    modules = project_modules()
    private = [f"{path.relative_to(REPO)}:{line} imports {target}.{imported}"
               for name, path in modules.items() for target, imported, line in imports_of(path, modules)
               if imported.startswith("_") and target != name]
    assert not private, "\n".join(private)


def test_layering__ray_only_in_cluster_and_rllib_only_in_policies():
    misplaced = []
    for name, path in project_modules().items():
        floor = name.split(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for imported in names:
                if imported.startswith("ray.rllib") and floor != "policies":
                    misplaced.append(f"{name} imports {imported}")
                elif imported.split(".")[0] == "ray" and not imported.startswith("ray.rllib") and floor != "cluster":
                    misplaced.append(f"{name} imports {imported}")
    assert not misplaced, "\n".join(misplaced)
