"""The house's bars on the product code (api/, workers/, models/, pipelines/, migrations/):
no module over 400 lines, no function over 60, no import circle across folders or within a
wing of pipelines/, and no import that climbs back up a floor."""
from __future__ import annotations

import ast

from tests.import_graph import ROOT, ImportGraph, _strongly_connected, product_files

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# The floors, lowest first: a folder imports only from its own floor and those below it.
FLOORS = {"models": 0, "migrations": 1, "pipelines": 2, "workers": 3, "api": 4}
# pipelines/: the ground floor (modules directly in it, and the log beneath them), the
# wings built on it, and the composition root above every wing.
BENEATH_GROUND = {"pipelines/eventlog"}
ROOF = {"pipelines/bootstrap"}


def _top(folder: str) -> str:
    return folder.split("/")[0]


def test_no_module_is_over_400_lines():
    over = {p.relative_to(ROOT).as_posix(): n for p in product_files() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_60_lines():
    over = []
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    over.append(f"{path.relative_to(ROOT).as_posix()}:{node.name} ({lines})")
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_no_import_circle_spans_two_folders_or_two_modules_of_a_wing():
    graph = ImportGraph.read()
    across = [c for c in graph.cycles() if len({graph.folder(m) for m in c}) > 1]
    assert not across, f"import circles across folders: {across}"
    in_pipelines = [c for c in graph.cycles() if any(m.startswith("pipelines.") for m in c)]
    assert not in_pipelines, f"import circles in pipelines/: {in_pipelines}"
    assert not graph.folder_cycles(), f"folders importing each other: {graph.folder_cycles()}"


def test_no_import_climbs_back_up_a_floor():
    graph = ImportGraph.read()
    climbs = []
    for source, targets in graph.folder_edges().items():
        for target in targets:
            if FLOORS[_top(target)] > FLOORS[_top(source)]:
                climbs.append(f"{source} -> {target}")
            ground = source == "pipelines" or source in BENEATH_GROUND
            if ground and target.startswith("pipelines/") and target not in BENEATH_GROUND:
                climbs.append(f"{source} -> {target} (the ground floor imports a wing)")
            if source in BENEATH_GROUND and target == "pipelines":
                climbs.append(f"{source} -> {target} (the log imports the floor above it)")
            if target in ROOF and source.startswith("pipelines"):
                climbs.append(f"{source} -> {target} (a wing imports the composition root)")
    assert not climbs, f"imports that climb: {sorted(climbs)}"


def test_the_circle_finder_finds_circles():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _strongly_connected(sorted(edges), edges) == [["a", "b", "c"]]
    assert _strongly_connected(["x", "y"], {"x": {"y"}}) == []
