"""Helpers one private module shares with another have public names there (review 30).

Before: ``hybridllm/_pipeline/accounting.py`` imported ``_MAX_TOKENS`` from ``router/budget.py``
and ``_is_number`` from ``_types.py``, underscore names private to those modules. They are now
``MAX_TOKENS`` and ``is_number``: public in their (private) modules, not in ``hybridllm.__all__``,
and no module of the package imports another's underscore name for them."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import hybridllm
from hybridllm._pipeline import accounting
from hybridllm._types import is_number
from hybridllm.router import budget

PACKAGE = Path(hybridllm.__file__).parent


def test_the_shared_names_are_public_in_their_modules_and_used_by_accounting():
    assert accounting.MAX_TOKENS is budget.MAX_TOKENS
    assert accounting.is_number is is_number
    assert not hasattr(budget, "_MAX_TOKENS")
    assert "MAX_TOKENS" not in hybridllm.__all__ and "is_number" not in hybridllm.__all__


def test_is_number_is_a_finite_real_number():
    assert is_number(1) and is_number(2.5) and is_number(-3)
    for bad in (math.nan, math.inf, -math.inf, True, "1", None, 10**400):
        assert not is_number(bad), bad


def test_no_module_imports_the_old_private_names():
    old = {"_MAX_TOKENS", "_is_number"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                found += [f"{path.relative_to(PACKAGE)}: {a.name}" for a in node.names if a.name in old]
    assert found == []
