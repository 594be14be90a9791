"""The cache and router packages' shape: runtime apart from build code, no import cycle (lazy imports
too), and a device that uses the cache loads no torch, scikit-learn or onnx."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hybridllm

ROOT = Path(hybridllm.__file__).parent
# what runs on a device; training, the torch reference, evaluation, CLIs and file writers are build code
RUNTIME = {
    "cache": {
        "embedder",
        "encoder",
        "reranker",
        "reranker_file",
        "verifier",
        "features",
        "index",
        "store",
        "_store_file",
        "_pages",
        "_store_reads",
        "_store_writes",
        "semantic",
        "_keys",
        "_verifier_spec",
        "_mirror",
        "_candidates",
        "_writes",
        "prepare",
        "onnx_graph",
        "logit_bound",
        "guards",
    },
    "router": {
        "router",
        "_router_file",
        "classifier",
        "mixture",
        "features",
        "policy",
        "privacy",
        "_privacy_numbers",
        "_privacy_addresses",
        "_privacy_secrets",
        "budget",
    },
}
BUILD = {
    "cache": {
        "export",
        "train",
        "train_reranker",
        "_reranker_tuning",
        "_reranker_weights",
        "_reranker_calibration",
        "evaluate",
        "_cli",
    },
    "router": {
        "fit",
        "train",
        "_train_folds",
        "_train_sources",
        "_train_cv",
        "_train_cascade",
        "embedding_cache",
        "calibrate",
        "label",
        "_label_grading",
        "_label_files",
        "_label_backends",
        "dataset",
        "_dataset_table",
        "_dataset_scores",
        "_dataset_roles",
        "preference",
        "evaluate",
        "_cli",
        "_cli_commands",
        "_cli_eval",
    },
}


def _graph(package: str) -> dict[str, set[str]]:
    """Module -> the sibling modules it imports anywhere in its body (lazy imports included)."""
    folder = ROOT / package
    modules = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        graph[name] = deps & modules
    return graph


@pytest.mark.parametrize("package", sorted(RUNTIME))
def test_every_module_is_runtime_or_build(package: str) -> None:
    modules = {p.stem for p in (ROOT / package).glob("*.py")} - {"__init__"}
    assert modules == RUNTIME[package] | BUILD[package]


@pytest.mark.parametrize("package", sorted(RUNTIME))
def test_runtime_modules_never_import_build_code(package: str) -> None:
    graph = _graph(package)
    leaks = {name: graph[name] & BUILD[package] for name in RUNTIME[package] if graph[name] & BUILD[package]}
    assert leaks == {}


@pytest.mark.parametrize("package", sorted(RUNTIME))
def test_no_import_cycle(package: str) -> None:
    graph = _graph(package)
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
        "v = get_rerank_verifier()\n"
        "p = v.predict(q, c, vecs[:1], vecs[1:])\n"
        "skip = v.predict(q, ['What is the capital of France?'], vecs[:1], vecs[1:], at_least=0.5)\n"
        "assert v._reranker is not None and v._reranker.logit_range is not None\n"
        "heavy = ('torch', 'sklearn', 'onnx', 'safetensors')\n"
        "print(float(p[0]) > 0.5, sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True []", done.stdout
