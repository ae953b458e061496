"""The package's imports, read from its source: no cycle, and no import from a lower layer
into a higher one (the layers of DESIGN.md)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _imports() -> dict[str, set[str]]:
    """{module: the distpm modules it imports}, function-level imports included."""
    paths = {
        ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (SRC / "distpm").rglob("*.py")
    }
    graph = {}
    for name, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distpm"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in paths else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("distpm")}
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


# bottom first; a module may import from its own layer and the layers below it
LAYERS = [
    ("units", ["distpm.units", "distpm.version"]),
    ("cosmology", ["distpm.cosmology", "distpm.background", "distpm.linear_power",
                   "distpm.halofit", "distpm.boltzmann"]),
    ("ops", ["distpm.ops"]),
    ("parallel", ["distpm.parallel"]),
    # above cosmology and parallel: SimConfig still checks the device grid and the spectra
    ("config", ["distpm.config"]),
    ("particles", ["distpm.state", "distpm.shares"]),
    ("mesh ops", ["distpm.painting", "distpm.kernels"]),
    ("ic", ["distpm.ic"]),
    ("nbody", ["distpm.nbody", "distpm.gravity"]),
    ("simulation", ["distpm.simulation"]),
    ("lightcone", ["distpm.lightcone"]),
    ("analysis", ["distpm.analysis"]),
    ("io", ["distpm.io"]),
    ("plots", ["distpm.plots"]),
    # what a run writes of its lightcone (maps, spectra, their figures) is one of its outputs
    ("pipeline", ["distpm.plan", "distpm.compiled", "distpm.pipeline", "distpm.outputs",
                  "distpm.runfile",
                  "distpm.preflight",
                  "distpm.lightcone.output", "distpm.lightcone.tomography"]),
    ("cli", ["distpm.cli", "distpm"]),
]  # fmt: skip


def _layer(module: str) -> int:
    """The index of the layer of ``module`` (its longest matching prefix)."""
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    return best


def _upward(graph) -> list[str]:
    """Every import of a module from a higher layer than the importer's."""
    return sorted(
        f"{m} ({LAYERS[_layer(m)][0]}) imports {d} ({LAYERS[_layer(d)][0]})"
        for m, deps in graph.items()
        for d in deps
        if _layer(d) > _layer(m)
    )


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, out = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    graph = _imports()
    assert len(graph) > 50 and "distpm.ops.compact" in graph["distpm.parallel.migrate"]
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_every_module_is_in_a_layer_and_imports_nothing_above_it():
    graph = _imports()
    assert [m for m in graph if _layer(m) is None] == []
    assert _layer("distpm") == len(LAYERS) - 1 and _layer("distpm.nbody.loop") == 8
    assert _upward(graph) == []


def test_an_upward_import_is_found():
    graph = {"distpm.units": {"distpm.pipeline"}, "distpm.pipeline": {"distpm.units"}}
    assert _upward(graph) == ["distpm.units (units) imports distpm.pipeline (pipeline)"]
