"""EngineConfig's errors say which settings are at fault (``SettingError.fields``), so the command
line words them with its options without reading the message's prose.

Before, ``hybridllm-cloud`` rewrote the message with a regex that took any word with an underscore
that matched a field for that field, the value given included: ``--dtype block_size`` was refused
with "got '--block-size'", an option the user never typed.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloud_server.cli_settings import _option
from cloud_server.config import EngineConfig, SettingError

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}

BAD = [
    ({"model": ""}, ["--model"]),
    ({"max_num_seqs": 0}, ["--max-num-seqs", "got 0"]),
    ({"block_size": 24}, ["--block-size", "power of two", "got 24"]),
    ({"kv_cache_memory_bytes": 1000}, ["--kv-cache-memory-mb"]),
    ({"max_model_len": 1}, ["--max-model-len"]),
    ({"max_num_seqs": 600}, ["--max-num-batched-tokens must be >= --max-num-seqs"]),
    ({"device": "tpu"}, ["--device", "got 'tpu'"]),
    ({"dtype": "fp8"}, ["--dtype", "got 'fp8'"]),
    ({"quantization": "int2"}, ["--quantization", "got 'int2'"]),
    ({"speculative_method": "eagle"}, ["--speculative-method", "got 'eagle'"]),
    ({"speculative_method": "ngram", "num_speculative_tokens": 17}, ["--num-speculative-tokens"]),
    ({"draft_model": "d"}, ["--draft-model goes with --speculative-method draft"]),
    ({"draft_vocab_size": -1}, ["--draft-vocab-size"]),
    ({"num_threads": 0}, ["--num-threads"]),
]


@pytest.mark.parametrize(("settings", "fragments"), BAD)
def test_every_refusal_names_its_fields(settings: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(SettingError) as info:
        EngineConfig(**{"model": "m", **settings})
    exc = info.value
    assert exc.fields and set(exc.fields) <= FIELDS
    assert set(exc.fields) & set(settings)  # the setting given is among them
    assert str(exc).startswith(f"EngineConfig.{exc.fields[0]} ")  # the Python API's wording
    worded = exc.naming(_option)
    assert "EngineConfig" not in worded
    for fragment in fragments:
        assert fragment in worded, (fragment, worded)


def test_a_value_that_looks_like_a_field_is_quoted_as_given() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cloud_server", "serve", "--model", "smollm2-135m-instruct", "--port", "0",
         "--dtype", "block_size"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("hybridllm-cloud: error: --dtype must be one of"), line
    assert "got 'block_size'" in line and "--block-size" not in line, line
