"""Settings review 16c: a secret in a URL's query string is masked wherever settings are shown, an
error never prints a password or key, a typo names the setting it was meant to be, an argument of the
wrong type is named, HYBRIDLLM_HOME may be relative, and ``python -m hybridllm`` runs the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridllm._config import HybridLLMConfig, load_config, public_text, public_value
from hybridllm._exceptions import ConfigError
from hybridllm._paths import cache_dir, data_dir


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("HYBRIDLLM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")


@pytest.mark.parametrize("url, shown", [
    ("https://h/v1?key=SECRET1", "https://h/v1?key=***"),
    ("https://r.openai.azure.com/openai?api-version=2024-06-01&api-key=SECRET1#x",
     "https://r.openai.azure.com/openai?api-version=2024-06-01&api-key=***#x"),
    ("https://h/v1?sv=2022&sig=SECRET1%2Fab&se=2030", "https://h/v1?sv=2022&sig=***&se=2030"),
    ("https://h/v1?Access_Token=SECRET1&monkey=1&keys=2", "https://h/v1?Access_Token=***&monkey=1&keys=2"),
    ("https://u:SECRET1@h/v1?token=SECRET1", "https://***@h/v1?token=***"),
    ("https://h/v1?api_key=SECRET1;auth=SECRET1", "https://h/v1?api_key=***;auth=***"),
    ("https://h/v1?key=", "https://h/v1?key="),  # nothing to hide: unchanged
])
def test_a_query_string_secret_is_masked_and_the_url_kept(url, shown):
    assert public_value(url) == shown
    assert public_text(f"cannot reach '{url}' now") == f"cannot reach '{shown}' now"


def test_config_show_masks_query_secrets_of_every_url():
    cfg = HybridLLMConfig(cloud_url="https://a.example/v1?key=SECRET1",
                          cloud_endpoints=[{"url": "https://b.example/v1?token=SECRET2", "region": "eu"}])
    shown = json.dumps(cfg.public_dict(), default=str)
    assert "SECRET1" not in shown and "SECRET2" not in shown
    assert "https://a.example/v1?key=***" in shown and "https://b.example/v1?token=***" in shown


def test_an_environment_error_does_not_print_the_password(monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_CLOUD_URL", "ftp://ann:hunter2@h/v1?key=SECRET1")
    with pytest.raises(ConfigError) as err:
        load_config()
    assert "HYBRIDLLM_CLOUD_URL" in str(err.value)
    assert "hunter2" not in str(err.value) and "SECRET1" not in str(err.value)


def test_a_file_type_error_does_not_print_a_password_or_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('cloud_url = ["https://ann:hunter2@h/v1", 3]\n')
    with pytest.raises(ConfigError, match="cloud_url must be") as err:
        load_config(path)
    assert "hunter2" not in str(err.value)
    path.write_text("cloud_api_key = 123456789012345\n")  # a key written as a number
    with pytest.raises(ConfigError, match="cloud_api_key must be a string") as err:
        load_config(path)
    assert "123456789012345" not in str(err.value)


def test_a_typo_names_the_setting_it_was_meant_to_be(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("n_ctxx = 2048\ntemprature = 0.2\nzzz = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "n_ctxx -> n_ctx" in message and "temprature -> temperature" in message
    assert "zzz" in message and "zzz ->" not in message  # no guess when nothing is close
    with pytest.raises(ConfigError, match="cloud_ur -> cloud_url"):
        load_config(cloud_ur="https://h/v1")


def test_an_argument_of_the_wrong_type_is_named():
    with pytest.raises(ConfigError, match=r"^n_ctx must be an integer, got '4096'\.$"):
        load_config(n_ctx="4096")
    with pytest.raises(ConfigError, match="cache_max_entries must be an integer"):
        load_config(cache_max_entries="many")
    assert load_config(n_ctx=2048).n_ctx == 2048  # a right one still passes


def test_a_relative_home_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDLLM_HOME", "hl")
    assert data_dir() == tmp_path / "hl" and cache_dir() == tmp_path / "hl" / "cache"
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", "c")
    assert cache_dir() == tmp_path / "c"
    monkeypatch.setenv("HYBRIDLLM_HOME", "~/hl")
    assert data_dir() == Path.home() / "hl"


def test_python_dash_m_hybridllm_runs_the_cli(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDLLM_")}
    run = subprocess.run([sys.executable, "-m", "hybridllm", "config", "show", "--config",
                          str(tmp_path / "missing.toml")], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 2 and "does not exist" in run.stderr, run.stderr  # a usage error
    # a usage error is the package's own _UsageError (exit 2), not a second copy's (exit 1)
    run = subprocess.run([sys.executable, "-m", "hybridllm", "serve", "--config",
                          str(tmp_path / "missing.toml")], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 2 and "does not exist" in run.stderr, run.stderr
