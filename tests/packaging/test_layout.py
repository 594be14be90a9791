"""The cache package's shape: runtime apart from build code, and no import cycle (lazy imports too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import hybridllm.cache

PACKAGE = Path(hybridllm.cache.__file__).parent
# what runs on a device; training, the torch reference and evaluation are build code
RUNTIME = {
    "embedder",
    "encoder",
    "reranker",
    "reranker_file",
    "verifier",
    "features",
    "index",
    "store",
    "semantic",
    "prepare",
    "onnx_graph",
}
BUILD = {"export", "train", "train_reranker", "evaluate", "_cli"}


def _graph() -> dict[str, set[str]]:
    """Module -> the sibling modules it imports anywhere in its body (lazy imports included)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        graph[name] = deps & modules
    return graph


def test_every_module_is_runtime_or_build() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} == RUNTIME | BUILD


def test_runtime_modules_never_import_build_code() -> None:
    graph = _graph()
    assert {name: graph[name] & BUILD for name in RUNTIME if graph[name] & BUILD} == {}


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path, dep])
            if dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_using_the_cache_loads_no_torch_sklearn_or_onnx() -> None:
    """Embedding and verifying need ONNX Runtime, tokenizers and numpy only (``onnx`` and
    ``safetensors`` are for preparing, once)."""
    from hybridllm.cache.prepare import prepare_embedder, prepare_reranker
    from hybridllm.cache.reranker_file import read_info

    prepare_embedder()  # here or by another test, so the process below only loads ONNX files
    info = read_info()
    prepare_reranker(info.path, info.weights_digest)
    code = (
        "import sys\n"
        "from hybridllm.cache import get_embedder\n"
        "from hybridllm.cache.reranker import get_rerank_verifier\n"
        "q, c = ['How do I learn Python?'], ['How can I learn Python?']\n"
        "vecs = get_embedder().embed(q + c)\n"
        "p = get_rerank_verifier().predict(q, c, vecs[:1], vecs[1:])\n"
        "heavy = ('torch', 'sklearn', 'onnx', 'safetensors')\n"
        "print(float(p[0]) > 0.5, sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True []", done.stdout
