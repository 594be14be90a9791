"""``hybridllm-cloud``: options, key sources and one-line errors (no model is loaded here)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_server.__main__ import build_parser
from cloud_server.api.auth import API_KEYS_ENV, ApiKeyChecker, load_api_keys
from cloud_server.exceptions import AuthError, ConfigError

from .helpers import ROOT


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloud_server", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hybridllm-cloud: error:")
    assert fragment in lines[0]
    assert "Traceback" not in proc.stderr


def test_parser_defaults_and_repeatable_keys() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "m.gguf", "--api-key", "a", "--api-key", "b", "--max-waiting", "3"]
    )
    assert (args.host, args.port, args.api_key, args.max_waiting) == (
        "127.0.0.1",
        8000,
        ["a", "b"],
        3,
    )


def test_keys_from_cli_env_and_file(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nk-file-1\n\nk-file-2\n")
    env = {API_KEYS_ENV: "k-env-1, k-env-2,,"}
    keys = load_api_keys(["k-cli", "k-env-1"], key_file, env)
    assert keys == ["k-cli", "k-env-1", "k-env-2", "k-file-1", "k-file-2"]
    assert load_api_keys([], None, {}) == []


def test_key_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_api_keys([], tmp_path / "missing", {})
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="no key"):
        load_api_keys([], empty, {})


def test_checker_accepts_every_key_and_only_bearer() -> None:
    checker = ApiKeyChecker(["alpha", "beta"])
    checker.check("Bearer alpha")
    checker.check("bearer beta")
    for header in (None, "", "Bearer", "Bearer alph", "Bearer alphaa", "Basic alpha", "alpha"):
        with pytest.raises(AuthError):
            checker.check(header)
    ApiKeyChecker([]).check(None)  # no keys configured: open


def test_missing_model_is_a_one_line_usage_error() -> None:
    proc = run_cli("serve")
    assert proc.returncode == 2
    assert_one_line_error(proc, "--model")


def test_unknown_model_fails_fast() -> None:
    assert_one_line_error(run_cli("serve", "--model", "/nonexistent/x.gguf"), "/nonexistent/x.gguf")


def test_bad_engine_setting(smollm2_path: Path) -> None:
    proc = run_cli("serve", "--model", str(smollm2_path), "--block-size", "3")
    assert_one_line_error(proc, "--block-size")


def test_bad_key_file(smollm2_path: Path, tmp_path: Path) -> None:
    proc = run_cli("serve", "--model", str(smollm2_path), "--api-key-file", str(tmp_path / "no"))
    assert_one_line_error(proc, "API key file")


def test_port_in_use(smollm2_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        proc = run_cli("serve", "--model", str(smollm2_path), "--port", str(port))
    assert_one_line_error(proc, f"127.0.0.1:{port}")


def test_model_that_fails_to_load_exits_with_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("not a gguf file")
    proc = run_cli("serve", "--model", str(bogus), "--port", "0", "--log-level", "critical")
    assert_one_line_error(proc, "loading model")


def test_system_prompt_defaults_to_the_catalog_models_own(tmp_path: Path) -> None:
    from cloud_server.__main__ import _system_prompt
    from hybridllm.models import load_catalog

    own = load_catalog()["smollm2-135m-instruct"].extra["system_prompt"]
    assert own and _system_prompt("smollm2-135m-instruct", None) == own
    assert _system_prompt("smollm2-135m-instruct", "") is None  # '' turns it off
    assert _system_prompt("smollm2-135m-instruct", "Be brief.") == "Be brief."
    assert _system_prompt("gemma3-270m", None) is None  # a base model has none
    assert _system_prompt(str(tmp_path), None) is None  # a path is not a catalog id


def test_max_body_bytes_flag() -> None:
    from hybridllm.wire import DEFAULT_MAX_BODY_BYTES

    assert build_parser().parse_args(["serve", "--model", "m"]).max_body_bytes == DEFAULT_MAX_BODY_BYTES
    args = build_parser().parse_args(["serve", "--model", "m", "--max-body-bytes", "1000"])
    assert args.max_body_bytes == 1000


def test_enforce_eager_flag_reaches_the_engine_config() -> None:
    from cloud_server.cli_settings import _engine_config

    parse = build_parser().parse_args
    assert _engine_config(parse(["serve", "--model", "m.gguf"])).enforce_eager is False
    assert _engine_config(parse(["serve", "--model", "m.gguf", "--enforce-eager"])).enforce_eager is True


def test_shutdown_timeout_flag(smollm2_path: Path) -> None:
    parse = build_parser().parse_args
    assert parse(["serve", "--model", "m"]).shutdown_timeout is None  # the default grace, 5 s
    assert parse(["serve", "--model", "m", "--shutdown-timeout", "0"]).shutdown_timeout == 0.0
    proc = run_cli("serve", "--model", "m", "--shutdown-timeout", "-1")
    assert proc.returncode == 2 and "--shutdown-timeout" in proc.stderr
    # Ray Serve drains a fleet by its own rules: refused, not silently ignored
    proc = run_cli("serve", "--model", str(smollm2_path), "--replicas", "2", "--shutdown-timeout", "3")
    assert_one_line_error(proc, "--shutdown-timeout applies to the single-process server")
