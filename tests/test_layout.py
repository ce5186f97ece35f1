"""The architecture as the import graph shows it (CONTRIBUTING.md: Layout): no import cycle, no import of a room listed
above the importer's in CONTRIBUTING.md's table, and the code that runs inside a
PS process never reaches the orchestration layers (kfp, kubernetes), whose ``proto`` package would shadow Paddle's.

Every import statement counts, at any depth (inside functions too), as ``../shared/tools/import_graph.py`` reads it.
"""

import ast
import re
import subprocess
import sys

from tests.conftest import ROOT

PACKAGES = ("components", "pipelines")
ORCHESTRATION = {"kfp", "kubernetes"}
# What the PS side may import of this project: itself and the layers below it.
PS_SIDE = "components.ps"
BELOW_PS = ("components.networks", "components.table", "components.checkpoint", "components.data_prep",
            "components.calibration", "components.metrics", "components.config_rules", "components.quantities", "components.config",
            "components.storage", "components.storage_errors", "components.days", "components.redaction",
            "components.safe_paths")


def _modules() -> dict[str, set[str]]:
    """Module name -> every name it imports (absolute, relative ones resolved)."""
    graph = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            here = parts[:-1]
            imported = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        base = ".".join(list(here[:len(here) - node.level + 1]) + ([base] if base else []))
                    imported.add(base)
                    imported.update(f"{base}.{alias.name}" for alias in node.names)
            graph[name] = imported
    return graph


def _internal(graph: dict[str, set[str]], name: str) -> str | None:
    """The project module an imported name refers to (``pkg.mod.func`` -> ``pkg.mod``), if any."""
    while name and name not in graph:
        name = name.rpartition(".")[0]
    return name or None


def _edges(graph):
    return {m: {t for t in map(lambda n: _internal(graph, n), names) if t and t != m} for m, names in graph.items()}


def _reachable(edges, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges[module])
    return seen


def test_the_import_graph_has_no_cycle():
    edges = _edges(_modules())
    reach = {m: _reachable(edges, m) for m in edges}
    in_cycle = {m for m in edges if any(m in reach[n] for n in edges[m])}
    cycles = sorted({" <-> ".join(sorted(n for n in in_cycle if n in reach[m] and m in reach[n])) for m in in_cycle})
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_ps_side_never_reaches_the_orchestration_layers():
    graph = _modules()
    edges = _edges(graph)
    offenders = []
    for module in graph:
        externals = {name.split(".")[0] for name in graph[module]}
        # Any module that imports paddle, and everything a PS process's code reaches, at any depth.
        if "paddle" in externals or module.startswith(PS_SIDE):
            for reached in _reachable(edges, module):
                bad = {n.split(".")[0] for n in graph[reached]} & ORCHESTRATION
                if bad:
                    offenders.append(f"{module} reaches {reached}, which imports {sorted(bad)}")
    assert not offenders, "\n".join(offenders)


def test_the_ps_side_imports_only_itself_and_the_layers_below():
    edges = _edges(_modules())
    upward = [f"{m} -> {t}" for m in edges if m.startswith(PS_SIDE) for t in edges[m]
              if not t.startswith((PS_SIDE, *BELOW_PS))]
    assert not upward, "\n".join(upward)


def test_a_ps_process_loads_neither_kfp_nor_kubernetes():
    """What the ``proto`` shim in components.ps.role relies on, checked in a real interpreter."""
    probe = ("import sys, components.ps.role, components.ps.shard_uploader; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'kfp', 'kubernetes', 'hydra'}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _rooms() -> list[str]:
    """The rooms of CONTRIBUTING.md's layout table, top to bottom, as module prefixes (``component``: every step's
    ``component.py``)."""
    table = re.findall(r"^\| `([^`]+)` \|", (ROOT / "CONTRIBUTING.md").read_text(), re.M)
    return ["component" if "<step>" in room else room.removesuffix("/").removesuffix(".py").replace("/", ".")
            for room in table]


def _room_of(module: str, rooms: list[str]) -> str | None:
    if module.startswith("components.") and module.endswith(".component"):
        return "component"
    return next((room for room in rooms if module == room or module.startswith(room + ".")), None)


def test_imports_go_down_the_rooms_in_the_order_contributing_states():
    rooms = _rooms()
    assert rooms[:2] == ["pipelines", "component"] and "components.config" in rooms
    order = {room: i for i, room in enumerate(rooms)}
    modules = _modules()
    unplaced = sorted(m for m in modules if _room_of(m, rooms) is None and m not in PACKAGES and m != "components")
    assert not unplaced, f"modules in no room of CONTRIBUTING.md: {unplaced}"
    upward = sorted(f"{m} -> {t}" for m, targets in _edges(modules).items() for t in targets
                    if (a := _room_of(m, rooms)) and (b := _room_of(t, rooms)) and order[b] < order[a])
    assert not upward, "imports of a room listed above:\n" + "\n".join(upward)
