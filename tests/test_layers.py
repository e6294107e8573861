"""mk's import graph: no cycles, and every import (at module level or inside a function) goes down or across
the declared layers, never up. Layers, from the ground up (the README's architecture section says the same):

- ground: records, data files, arithmetic every layer shares (the weights' numerics: INT8, FP8 blocks, INT4, MXFP4,
  which the sharding cuts by their blocks), and measuring instruments that know no model;
- arith: the speed of light;
- model: checkpoints, the reference decoder;
- plan: the step plan;
- kernel: the megakernel, the engines that generate;
- cost: the timing model and what measures a step;
- analysis: every table a notebook shows, one module per subject;
- views: figures and the report;
- face: the command line and notebook helpers.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {
    "ground": [
        "mk",
        "mk.units",
        "mk.paths",
        "mk.files",
        "mk.progress",
        "mk.tpu",
        "mk.config",
        "mk.config.*",
        "mk.chips",
        "mk.routing",
        "mk.speculative",
        "mk.kernel_setup",
        "mk.kv_slots",
        "mk.engines",
        "mk.params",
        "mk.dtypes",
        "mk.quant",
        "mk.checkpoint_formats",
        "mk.format_trees",
        "mk.published",
        "mk.params",
        "mk.assistant_config",
        "mk.sharding",
        "mk.sharding.*",
        "mk.profiling",
        "mk.profiling.*",
    ],
    "arith": ["mk.sol"],
    "model": [
        "mk.hf_layout",
        "mk.blocks",
        "mk.mla",
        "mk.reference",
        "mk.weights",
        "mk.assistant",
    ],
    "plan": ["mk.plan", "mk.plan.*"],
    "kernel": ["mk.megakernel", "mk.megakernel.*", "mk.generate"],
    "cost": ["mk.timing", "mk.timing.*", "mk.measure", "mk.measure.*"],
    "analysis": ["mk.analysis", "mk.analysis.*"],
    "views": ["mk.figures", "mk.report", "mk.views", "mk.views.*"],
    "face": ["mk.__main__", "mk.cli", "mk.cli.*", "mk.notebook"],
}
ORDER = list(LAYERS)
PLOTTING = ("plotly", "kaleido")  # only views and face may import these


def modules() -> dict[str, Path]:
    out = {}
    for p in (ROOT / "mk").rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def layer_of(name: str) -> int:
    for i, (layer, names) in enumerate(LAYERS.items()):
        for n in names:
            if name == n or (n.endswith(".*") and name.startswith(n[:-1])):
                return i
    raise AssertionError(f"{name} is in no layer: add it to tests/test_layers.py (and the README's architecture)")


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """Every mk module ``name`` imports, anywhere in the file, with the line: ``from x import y`` counts y
    when y is a module, else x."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("mk"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub if sub in known else target, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "mk"]
    return out


def third_party(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
    return tops


def graph() -> dict[str, dict[str, int]]:
    mods = modules()
    return {name: {t: line for t, line in imports(name, path, set(mods)) if t != name} for name, path in mods.items()}


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_goes_up_a_layer():
    bad = []
    for name, targets in graph().items():
        for target, line in targets.items():
            # importing mk.a.b runs mk.a's __init__ too: the package counts as imported
            chain = [".".join(target.split(".")[: i + 1]) for i in range(target.count(".") + 1)]
            for t in chain:
                if layer_of(t) > layer_of(name):
                    bad.append(f"{name} ({ORDER[layer_of(name)]}) line {line} imports {t} ({ORDER[layer_of(t)]})")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(set(bad)))


def find_cycle(g: dict[str, dict[str, int]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in g.get(n, {}):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in g:
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_fail_on_what_they_guard_against():
    """The walker finds a cycle like the one the reference once had (reference -> quant -> generate ->
    reference), and a plan that imports the kernel is an import up the layers."""
    g = {"mk.reference": {"mk.quant": 1}, "mk.quant": {"mk.generate": 1}, "mk.generate": {"mk.reference": 1}}
    assert find_cycle(g) == ["mk.reference", "mk.quant", "mk.generate", "mk.reference"]
    assert layer_of("mk.plan.step") < layer_of("mk.megakernel.kernel")
    assert layer_of("mk.timing") < layer_of("mk.views.timeline") and layer_of("mk.sol") < layer_of("mk.reference")


def test_only_views_and_the_face_import_plotting():
    views = ORDER.index("views")
    bad = [
        f"{name} imports {sorted(third_party(path) & set(PLOTTING))}"
        for name, path in modules().items()
        if layer_of(name) < views and third_party(path) & set(PLOTTING)
    ]
    assert not bad, bad


@pytest.mark.parametrize("module", ["mk.timing", "mk.sol", "mk.plan", "mk.analysis.verdict"])
def test_the_cost_model_runs_without_plotting(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in {PLOTTING!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def readme_layers() -> dict[str, list[str]]:
    """The README's layer table as LAYERS spells it: a `name/` (a folder) is the package and its modules."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| layer | modules |") :].split("\n\n", 1)[0].splitlines()[2:]
    out = {}
    for row in table:
        layer, names = (c.strip() for c in row.strip("|").split("|")[:2])
        out[layer] = []
        for name in re.findall(r"`([^`]+)`", names):
            dotted = "mk." + name.rstrip("/").replace("/", ".")
            out[layer] += [dotted, dotted + ".*"] if name.endswith("/") else [dotted]
    return out


def test_the_readme_layer_table_is_this_one():
    """The README's architecture table names the same modules in the same layers as LAYERS (the package itself
    aside), so the one a reader sees is the one the tests hold the imports to."""
    ours = {layer: sorted(set(names) - {"mk"}) for layer, names in LAYERS.items()}
    assert {layer: sorted(names) for layer, names in readme_layers().items()} == ours


def longest_chain(g: dict[str, dict[str, int]]) -> list[str]:
    """The longest chain of imports inside mk, a folder of modules (a package with modules in it) counted as one
    node: the measure of how many floors the house stands on."""
    folders = {".".join(m.split(".")[:2]) for m in g if m.count(".") >= 2}

    def node(m: str) -> str:
        if m == "mk.__main__":  # python -m mk's entry: a shim that runs mk.cli, no floor of its own
            return "mk.cli"
        top = ".".join(m.split(".")[:2])
        return top if top in folders else m

    nodes: dict[str, set[str]] = {}
    for a, targets in g.items():
        for t in targets:
            if "mk" not in (a, t) and node(a) != node(t):
                nodes.setdefault(node(a), set()).add(node(t))
    memo: dict[str, list[str]] = {}

    def chain(n: str) -> list[str]:
        if n not in memo:
            memo[n] = [n] + max((chain(t) for t in nodes.get(n, ())), key=len, default=[])
        return memo[n]

    return max((chain(n) for n in nodes), key=len)


def test_the_house_stands_on_at_most_twelve_floors():
    chain = longest_chain(graph())
    assert len(chain) <= 12, " -> ".join(chain)


MAX_MODULE_LINES = 700  # one module, one idea
MAX_FUNCTION_LINES = 80  # a function fits a screen


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines of every module of mk, and of every function (``module:qualified name``, nested ones too)."""
    module_lines, function_lines = {}, {}
    for name, path in modules().items():
        text = path.read_text()
        module_lines[name] = len(text.splitlines())

        def walk(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    qualified = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        function_lines[f"{name}:{qualified}"] = child.end_lineno - child.lineno + 1
                    walk(child, qualified + ".")

        walk(ast.parse(text), "")
    return module_lines, function_lines


def test_every_module_and_function_fits_its_size():
    module_lines, function_lines = sizes()
    assert function_lines["mk.megakernel.kernel:build_call"] > 20  # what is measured: whole functions, by line
    long_modules = {n: k for n, k in module_lines.items() if k > MAX_MODULE_LINES}
    long_functions = {n: k for n, k in function_lines.items() if k > MAX_FUNCTION_LINES}
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"
