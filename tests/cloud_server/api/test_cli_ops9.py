"""``hybridllm-cloud serve``: a bad engine setting, model or key is a usage error (exit status 2,
one line naming the option) found before anything loads, where it was an error from the dataclass
(``EngineConfig.block_size``, exit 1) or, for ``--device cuda:x``, a failure after the server had
started loading; an empty API key source is refused rather than read as "no key" (an open server).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cloud_server.api.auth import API_KEYS_ENV, load_api_keys
from cloud_server.cli_settings import _option_names
from cloud_server.config import EngineConfig
from cloud_server.exceptions import ConfigError

from .helpers import ROOT

MODEL = "smollm2-135m-instruct"  # a catalog id: checked by name, never loaded here


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cloud_server", "serve", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)


def assert_usage_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("hybridllm-cloud: error:"), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "EngineConfig" not in lines[0]  # the option's name, not the dataclass field's
    assert proc.stdout == ""  # nothing started: no log line, no listening banner


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        (["--block-size", "3"], ["--block-size", "power of two"]),
        (["--dtype", "fp8"], ["--dtype", "'fp8'"]),
        (["--device", "tpu"], ["--device", "'tpu'"]),
        (["--device", "cuda:x"], ["--device", "'cuda:x'"]),
        (["--max-model-len", "1"], ["--max-model-len"]),
        (["--max-num-seqs", "600"], ["--max-num-batched-tokens", "--max-num-seqs"]),
        (["--speculative-method", "ngram", "--num-speculative-tokens", "17"], ["--num-speculative-tokens"]),
        (["--draft-model", MODEL], ["--draft-model", "--speculative-method draft"]),
        (["--speculative-method", "draft", "--draft-model", "no-such-draft"],
         ["--draft-model", "no-such-draft"]),
        (["--api-key", ""], ["--api-key", "empty"]),
    ],
)
def test_bad_values_and_combinations_are_usage_errors(options: list[str], fragments: list[str]) -> None:
    assert_usage_error(run_cli("--model", MODEL, "--port", "0", *options), *fragments)


def test_unknown_model_is_a_usage_error_naming_the_option() -> None:
    assert_usage_error(run_cli("--model", "no-such-model", "--port", "0"), "--model", "no-such-model")


def test_usage_errors_in_process_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    from cloud_server.__main__ import main

    assert main(["serve", "--model", MODEL, "--block-size", "3"]) == 2
    assert "--block-size must be a power of two" in capsys.readouterr().err


def test_empty_key_variable_is_refused_not_an_open_server() -> None:
    import os

    for value in ("", " , "):
        env = {**os.environ, API_KEYS_ENV: value}
        assert_usage_error(run_cli("--model", MODEL, "--port", "0", env=env), API_KEYS_ENV, "holds no key")


def test_key_sources_empty_or_not() -> None:
    with pytest.raises(ConfigError, match="--api-key"):
        load_api_keys(["sk-one", " "], None, {})
    with pytest.raises(ConfigError, match=API_KEYS_ENV):
        load_api_keys([], None, {API_KEYS_ENV: ","})
    # unset: an open server, as documented; stray separators beside real keys are fine
    assert load_api_keys([], None, {}) == []
    assert load_api_keys(["sk-cli"], None, {API_KEYS_ENV: "sk-env,,"}) == ["sk-cli", "sk-env"]


def test_option_names_translate_fields_and_nothing_else() -> None:
    assert _option_names("EngineConfig.block_size must be a power of two") == \
        "--block-size must be a power of two"
    assert _option_names("EngineConfig.kv_cache_memory_bytes must be at least 1 MiB") == \
        "--kv-cache-memory-mb must be at least 1 MiB"
    # already an option, or a plain word that happens to be a field: unchanged
    assert _option_names("--draft-model goes with the model") == "--draft-model goes with the model"
    assert _option_names("some_other_name stays") == "some_other_name stays"


def test_device_index_must_be_a_number() -> None:
    EngineConfig(model="m", device="cuda:1")
    EngineConfig(model="m", device="cpu")
    for device in ("cuda:x", "cuda:", "gpu"):
        with pytest.raises(ConfigError, match="device"):
            EngineConfig(model="m", device=device)


def test_a_good_command_line_gets_past_the_checks(tmp_path: Path) -> None:
    """The same checks let a valid command through (here to the port, which is taken)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        proc = run_cli("--model", MODEL, "--port", str(port), "--block-size", "32", "--device", "cpu",
                       "--speculative-method", "ngram", "--num-speculative-tokens", "4")
    assert proc.returncode == 1, proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr.strip().splitlines()[-1]
