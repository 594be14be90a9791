"""Pin the public API: adding or removing a name is a deliberate change."""

import hybridllm


def test_all_names_exist_and_are_exported():
    for name in hybridllm.__all__:
        assert hasattr(hybridllm, name), name
    import types

    # submodules appear as attributes once imported; they are not part of the curated API
    public = {n for n in dir(hybridllm) if not n.startswith("_")
              and not isinstance(getattr(hybridllm, n), types.ModuleType)}
    assert public <= set(hybridllm.__all__) | {"__version__"}, public - set(hybridllm.__all__)


def test_every_error_derives_from_the_base():
    for name in hybridllm.__all__:
        obj = getattr(hybridllm, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, hybridllm.HybridLLMError), name


def test_import_does_no_heavy_work():
    import subprocess
    import sys

    heavy = "('llama_cpp', 'numpy', 'onnxruntime', 'torch', 'httpx')"
    code = f"import sys, hybridllm; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_error_tree_is_pinned():
    """Every public error and its parent, as drawn in hybridllm/_exceptions.py and the README."""
    tree = {
        "ConfigError": "HybridLLMError",
        "InvalidRequestError": "HybridLLMError",
        "ContextWindowExceededError": "InvalidRequestError",
        "StreamConsumedError": "HybridLLMError",
        "ModelError": "HybridLLMError",
        "ModelNotFoundError": "ModelError",
        "ModelPackageMissingError": "ModelError",
        "ModelCorruptError": "ModelError",
        "BackendError": "HybridLLMError",
        "EdgeError": "BackendError",
        "EdgeBusyError": "EdgeError",
        "CloudError": "BackendError",
        "CloudUnavailableError": "CloudError",
        "CloudRateLimitError": "CloudError",
        "CloudBudgetSpentError": "CloudRateLimitError",
        "CloudAuthError": "CloudError",
        "RouterError": "HybridLLMError",
        "RouterFileError": "RouterError",
        "CacheError": "HybridLLMError",
        "CacheCorruptError": "CacheError",
        "DataError": "HybridLLMError",
    }
    errors = {n for n in hybridllm.__all__ if isinstance(getattr(hybridllm, n), type)
              and issubclass(getattr(hybridllm, n), Exception)}
    assert errors == set(tree) | {"HybridLLMError"}
    for name, parent in tree.items():
        assert getattr(hybridllm, name).__mro__[1] is getattr(hybridllm, parent), name
    from hybridllm import _exceptions

    for name in tree:  # the drawn tree names each one
        assert name in (_exceptions.__doc__ or ""), name
