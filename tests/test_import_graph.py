"""Shrike's imports point one way: read statically from src/shrike (ast, imports inside functions included, since
a lazy import is a dependency all the same), the module graph has no cycle and no module imports a layer above
its own; and loading a model, run for real, imports nothing of the server."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
EXTENSIONS = {"shrike._C"}  # compiled at build time, so not in src/

# The layers, bottom first. A module may import its own layer and the layers below, never one above. A module
# belongs to the longest entry naming it or a package above it.
LAYERS: list[tuple[str, list[str]]] = [
    ("kernel core: the compiled extension, the machine, the registry of implementations",
     ["shrike", "shrike._C", "shrike.errors", "shrike.platform", "shrike.kernels", "shrike.registry"]),
    ("checkpoints: model directories, GGUF import, config, tensors, tokenizer, formats, quantization math",
     ["shrike.default_model", "shrike.convert", "shrike.model.config", "shrike.model.weights", "shrike.tokenizer",
      "shrike.template_tools", "shrike.token_bytes", "shrike.quantization.safetensors_io",
      "shrike.quantization.repack_cache", "shrike.quantization.compressed_tensors_format",
      "shrike.quantization.weight_forms", "shrike.quantization.schemes", "shrike.quantization.quantizer"]),
    ("ops: the op table, its references, weight formats and the tape executor",
     ["shrike.ops", "shrike.kv_int8", "shrike.weight_formats", "shrike.executor",
      "shrike.quantization.reference_kernels", "shrike.quantization.backends"]),
    ("layers", ["shrike.layers"]),
    ("model: architectures, their quantized linears, plugins, loading",
     ["shrike.model", "shrike.plugins", "shrike.quantization.loading"]),
    ("engine: scheduling, sampling, speculative decoding, the settings",
     ["shrike.engine", "shrike.sampling", "shrike.speculative"]),
    ("front ends", ["shrike.server", "shrike.llm", "shrike.outputs", "shrike.generate", "shrike.doctor"]),
    ("offline tools: apart from the runtime, which never imports them",
     ["shrike.eval_ppl", "shrike.synth", "shrike.convert.quantized", "shrike.quantization.quantize_checkpoint",
      "shrike.quantization.smoothing", "shrike.quantization.calibration", "shrike.quantization.gptq"]),
    ("command line", ["shrike.cli"]),
]


def source_modules(src: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the shrike modules it imports (the longest prefix of each imported name that is a module)."""
    modules = source_modules(src)
    known = set(modules) | EXTENSIONS

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        package = module if is_package else module.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                imported.update(resolve(f"{base}.{alias.name}") for alias in node.names)
        graph[module] = {m for m in imported if m and m.split(".")[0] == "shrike" and m != module}
    return graph


def layer_of(module: str) -> int | None:
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({LAYERS[layer_of(a)][0].split(':')[0]}) imports {b} ({LAYERS[layer_of(b)][0].split(':')[0]})"
            for a, targets in sorted(graph.items()) for b in sorted(targets) if layer_of(b) > layer_of(a)]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_has_a_layer(graph):
    assert [m for m in sorted(graph) if layer_of(m) is None] == [], "add these modules to LAYERS"


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_no_module_imports_a_layer_above_its_own(graph):
    assert upward_imports(graph) == []


# Only the op layer calls into the compiled extension: kernels.py (the packed weight forms and the thread pool),
# the ops, the weight-format table and the executor that lowers a tape onto C++.
KERNEL_CALLERS = {"shrike.kernels", "shrike.ops", "shrike.weight_formats", "shrike.executor.compile"}


def test_only_the_op_layer_imports_the_extension(graph):
    assert sorted(m for m, targets in graph.items() if "shrike._C" in targets and m not in KERNEL_CALLERS) == []


def test_the_checks_see_a_cycle_and_an_upward_import():
    made_up = {"shrike.ops": {"shrike.layers.norm"}, "shrike.layers.norm": {"shrike.ops"}, "shrike.errors": set()}
    assert cycles(made_up) == [["shrike.layers.norm", "shrike.ops"]]
    assert upward_imports(made_up) == ["shrike.ops (ops) imports shrike.layers.norm (layers)"]


def test_loading_a_model_imports_nothing_of_the_server(default_model_dir):
    script = ("import sys\nfrom shrike.model.loader import load_model\n"
              f"load_model({str(default_model_dir)!r}, progress=False)\n"
              "print(sorted(m for m in sys.modules if m.startswith(('shrike.server', 'shrike.engine'))))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
