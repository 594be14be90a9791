"""The README's `hybridllm-cloud serve` passage, held to its parser as test_readme_commands_docs12.py
holds the `router` and `cache` rows: every option the command takes is named in its own section
(`### Server`), every default that passage states in figures is the code's, and the exit statuses
and energy rule it states are the code's. Fast: the parser and fakes only."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests.test_readme_commands_docs12 import _options, _parsers, _readme, _subparsers


def _server_section() -> str:
    """`### Server (`hybridllm-cloud serve`)` up to its first `####` subsection."""
    text = _readme()
    start = text.index("\n### Server (`hybridllm-cloud serve`)\n")
    return text[start : text.index("\n#### ", start + 1)]


def _serve_parser():
    return _subparsers(_parsers()["hybridllm-cloud"])["serve"]


def _takes() -> set[str]:
    return {o for a in _serve_parser()._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


def test_every_option_of_serve_is_named_in_its_server_section() -> None:
    """A reader looks the command up in its own section: an option documented only in a later
    section (the cluster table, energy) is still named here, with a link to it."""
    missing = _takes() - _options(_server_section())
    assert not missing, f"hybridllm-cloud serve: options the Server section never names: {sorted(missing)}"


def _code_default(option: str):
    """The parser's default, else (None there: resolved later) the engine's (the CPU's KV pool, the
    draft vocabulary of a larger one, prompt lookup's K), the drain's, or the EngineConfig or
    ClusterConfig field's of the same name."""
    from cloud_server.__main__ import DEFAULT_SHUTDOWN_TIMEOUT_S
    from cloud_server.config import ClusterConfig, EngineConfig
    from cloud_server.engine import pool_plan, spec_setup
    from cloud_server.engine.spec_decode.decoder import DEFAULT_K

    action = next(a for a in _serve_parser()._actions if option in a.option_strings)
    if action.default is not None:
        return action.default
    resolved = {"kv_cache_memory_mb": pool_plan._CPU_KV_BYTES >> 20,
                "draft_vocab_size": spec_setup._DRAFT_VOCAB, "shutdown_timeout": DEFAULT_SHUTDOWN_TIMEOUT_S,
                "num_speculative_tokens": DEFAULT_K["ngram"]}
    if action.dest in resolved:
        return resolved[action.dest]
    for config in (EngineConfig, ClusterConfig):
        fields = {f.name: f.default for f in dataclasses.fields(config)}
        if action.dest in fields:
            return fields[action.dest]
    return None


def test_every_figure_default_the_readme_states_is_the_codes() -> None:
    """`--port` (8000), `--max-body-bytes N` (bytes, 4 MiB), `--host` (127.0.0.1) in the options
    passage, and `default 4096` in a one-option row of the cluster table."""
    text = _readme()
    stated = re.findall(
        r"`(--[a-z][a-z-]*)(?: [A-Z_]+)?`\s+\((?:[A-Za-z]+[,;] )?(\d[\d.]*)( MiB)?[ ;:,)]", _server_section()
    )
    start = text.index("\n### Past one machine")
    table = text[start : text.index("\n\n", text.index("| flag |", start))]
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \|[^|]*; default (\d+)", table, re.M)
    stated += [(option, value, "") for option, value in rows]
    assert len(stated) > 10, stated
    takes, wrong = _takes(), []
    for option, value, unit in stated:
        if option not in takes:
            continue
        got = _code_default(option)
        if isinstance(got, str):
            ok = got == value
        else:
            ok = got is not None and float(value) * (1 << 20 if unit else 1) == got
        if not ok:
            wrong.append(f"{option}: README {value}{unit}, the code {got!r}")
    assert not wrong, wrong


def test_ctrl_c_during_the_checks_exits_130_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    import cloud_server.__main__ as cli

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.delenv("HYBRIDLLM_CLOUD_API_KEYS", raising=False)
    monkeypatch.setattr(cli, "_check_model", interrupted)
    assert cli.main(["serve", "--model", "smollm2-135m-instruct"]) == 130
    assert re.search(r"Ctrl-C before the server starts\s+\(during the option checks above\) exits 130",
                     _server_section())


def test_power_watts_forces_the_estimate_as_documented() -> None:
    """`--power-watts W` is not the fallback of the counters (`HYBRIDLLM_POWER_WATTS` is): given,
    it is the source, on a GPU as on a CPU."""
    from cloud_server.energy import EstimateSource, detect_source

    for device in ("cpu", "cuda"):
        source = detect_source(device, power_watts=7.0, nvml=object())
        assert isinstance(source, EstimateSource) and source.watts == 7.0
    energy = _readme()[_readme().index("\n#### Energy per request\n"):]
    assert re.search(r"`--power-watts W` \(watts,\s+a positive number\) forces the estimate", energy)
