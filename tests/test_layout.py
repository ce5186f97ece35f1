"""The architecture as the import graph shows it (README: Layout): no import cycle, and the code that runs inside a
PS process never reaches the orchestration layers (kfp, kubernetes), whose ``proto`` package would shadow Paddle's.

Every import statement counts, at any depth (inside functions too), as ``../shared/tools/import_graph.py`` reads it.
"""

import ast
import subprocess
import sys

from tests.conftest import ROOT

PACKAGES = ("components", "pipelines")
ORCHESTRATION = {"kfp", "kubernetes"}
# What the PS side may import of this project: itself and the layers below it.
PS_SIDE = "components.ps"
BELOW_PS = ("components.config", "components.redaction", "components.days", "components.checkpoint", "components.data_prep",
            "components.metrics")


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
