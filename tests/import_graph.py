"""The product code's import graph, read from its source (nothing is imported): which
module imports which, counting imports inside functions too and leaving out those under
`if TYPE_CHECKING:` (type hints only, never run). `tests/unit/test_house_bars.py` holds the
house to its bars with it."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("api", "workers", "models", "pipelines", "migrations")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def product_files() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def _runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:`."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for sub in node.body for n in ast.walk(sub))
    return (node for node in ast.walk(tree) if id(node) not in hidden)


@dataclass
class ImportGraph:
    paths: dict[str, Path] = field(default_factory=dict)  # module -> its file
    edges: dict[str, set[str]] = field(default_factory=dict)  # module -> product modules it imports

    @classmethod
    def read(cls) -> "ImportGraph":
        graph = cls({module_name(p): p for p in product_files()})
        for name, path in graph.paths.items():
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            found: set[str] = set()
            for node in _runtime_nodes(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                        base = ".".join(kept + ([base] if base else []))
                    targets = [f"{base}.{a.name}" for a in node.names] + [base]
                else:
                    continue
                found.update(t for t in map(graph._resolve, targets) if t and t != name)
            graph.edges[name] = found
        return graph

    def _resolve(self, dotted: str) -> str | None:
        """The product module an import names (`a.b.c` may be a name in module `a.b`)."""
        while dotted and dotted not in self.paths:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def folder(self, module: str) -> str:
        return self.paths[module].parent.relative_to(ROOT).as_posix()

    def cycles(self) -> list[list[str]]:
        """The module circles: each strongly connected set of more than one module."""
        return _strongly_connected(self.paths, self.edges)

    def folder_edges(self) -> dict[str, set[str]]:
        edges: dict[str, set[str]] = {}
        for a, targets in self.edges.items():
            for b in targets:
                if self.folder(a) != self.folder(b):
                    edges.setdefault(self.folder(a), set()).add(self.folder(b))
        return edges

    def folder_cycles(self) -> list[list[str]]:
        edges = self.folder_edges()
        return _strongly_connected(sorted(set(edges) | {f for t in edges.values() for f in t}), edges)


def _strongly_connected(nodes, edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; the components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
