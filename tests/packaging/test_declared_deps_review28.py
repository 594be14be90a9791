"""Every package the client's code imports is one it declares: in ``[project].dependencies`` (the
light install), or in the extra whose feature imports it. Before: the prompts (``hybridllm/
_chat_template.py``, for every chat template, on either edge backend) imported jinja2, which the
light install declared nowhere and got only because llama-cpp-python happens to depend on it.
Fast: the sources are parsed, nothing is installed."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = {"hybridllm", "cloud_server"}
# modules only the features of an extra import (each checked to be in that extra below)
IN_EXTRA = {
    "fastapi": "proxy", "starlette": "proxy", "uvicorn": "proxy", "pydantic": "proxy",  # serve
    "onnxruntime_genai": "onnx",  # the ONNX Runtime edge backend
    "torch": "export", "gguf": "export",  # ONNX preparation, reranker training
    "matplotlib": "dev",  # router eval --plot
}
# distributions an extra brings through another one (pydantic and starlette come with FastAPI)
THROUGH = {"pydantic": "fastapi", "starlette": "fastapi"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported(package: str) -> set[str]:
    """Top-level modules of other distributions that ``package``'s sources import."""
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - OURS


def _distribution(module: str) -> str:
    (dist, *_) = packages_distributions()[module]
    return dist.lower().replace("_", "-")


def test_every_module_the_client_imports_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    light = {_name(r) for r in project["dependencies"]}
    extras = {name: {_name(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    undeclared = []
    for module in sorted(_imported("hybridllm")):
        dist = _distribution(THROUGH.get(module, module))
        extra = IN_EXTRA.get(module)
        if extra is None and dist not in light:
            undeclared.append(f"{module} ({dist}): not in [project].dependencies")
        elif extra is not None and dist not in extras[extra]:
            undeclared.append(f"{module} ({dist}): not in the [{extra}] extra")
    assert undeclared == []
