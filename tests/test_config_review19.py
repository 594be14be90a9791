"""Config files that cannot be read as settings give a ConfigError naming the file (review 19)."""

from __future__ import annotations

import pytest

from hybridllm._config import load_config
from hybridllm._exceptions import ConfigError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("HYBRIDLLM_"):
            monkeypatch.delenv(name)


def test_a_config_file_nested_past_the_stack_is_a_config_error_naming_it(tmp_path):
    # tomllib reads nested arrays recursively: a RecursionError traceback named no file
    path = tmp_path / "config.toml"
    path.write_text("n_ctx = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="too deeply") as err:
        load_config(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(("name", "value"), [
    ("cascade", "no"),  # any non-empty text is true: the cascade was silently on
    ("cache", "false"),
    ("n_ctx", 1.5),
    ("cache_max_entries", True),
    ("edge_model", 5),
])
def test_an_argument_of_the_wrong_type_is_a_config_error_naming_it(name, value):
    with pytest.raises(ConfigError, match=rf"^{name} must be "):
        load_config(**{name: value})


def test_arguments_python_code_passes_are_still_taken(tmp_path):
    np = pytest.importorskip("numpy")
    cfg = load_config(cache=0, cascade=1, cache_path=tmp_path / "c.sqlite3", router=tmp_path,
                      cloud_url=("http://a:1", "http://b:2"), n_ctx=np.int64(2048), threshold=1)
    assert (cfg.cache, cfg.cascade, cfg.n_ctx) == (0, 1, 2048)
    assert cfg.cache_path == tmp_path / "c.sqlite3"


def test_a_bad_environment_variable_an_argument_overrides_is_not_read(monkeypatch):
    # the rule of every source: a value a later source overrides is not checked (a stale
    # HYBRIDLLM_N_CTX=abc failed an app that passes n_ctx itself)
    monkeypatch.setenv("HYBRIDLLM_N_CTX", "abc")
    assert load_config(n_ctx=2048).n_ctx == 2048
    with pytest.raises(ConfigError, match="HYBRIDLLM_N_CTX='abc'"):
        load_config()
