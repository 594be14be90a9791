"""``hybridllm-cloud serve``: settings that used to pass the checks and fail later, or do nothing,
are usage errors (exit status 2, one line naming the option) before anything loads:

- ``--seed`` out of a torch generator's range: the model loaded and then every sampled request
  failed ("Overflow when unpacking long long");
- ``--draft-vocab-size`` without a draft model: silently unused;
- ``--model`` / ``--draft-model`` an existing file that is not a ``.gguf`` or a folder with no
  ``config.json``: the server bound its port and started loading, then exited 1 (a file was looked
  up as a catalog id)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_server.__main__ import UsageError, main
from cloud_server.cli_checks import _check_model
from cloud_server.config import EngineConfig, SettingError

MODEL = "smollm2-135m-instruct"  # a catalog id: checked by name, never loaded here


def usage_error(capsys: pytest.CaptureFixture[str], *options: str) -> str:
    assert main(["serve", "--port", "0", *options]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("hybridllm-cloud: error:"), err
    assert "EngineConfig" not in lines[0]
    return lines[0]


@pytest.mark.parametrize("seed", [2**64 - 1, 2**64, -(2**63) - 1, 10**30])
def test_a_seed_out_of_range_is_refused(capsys: pytest.CaptureFixture[str], seed: int) -> None:
    with pytest.raises(SettingError, match="seed"):
        EngineConfig(model="m", seed=seed)
    line = usage_error(capsys, "--model", MODEL, "--seed", str(seed))
    assert "--seed must be an integer" in line and str(seed) in line


def test_seeds_in_range_and_not_ints() -> None:
    for seed in (0, -1, -(2**63), 2**64 - 2):  # 2**64 - 2: the draft's seed + 1 still fits
        assert EngineConfig(model="m", seed=seed).seed == seed
    for seed in (True, 1.5, "3"):
        with pytest.raises(SettingError, match="seed"):
            EngineConfig(model="m", seed=seed)  # type: ignore[arg-type]


def test_draft_vocab_size_without_a_draft_model(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SettingError, match="draft_model"):
        EngineConfig(model="m", speculative_method="ngram", draft_vocab_size=1000)
    EngineConfig(model="m", speculative_method="draft", draft_model="d", draft_vocab_size=1000)
    line = usage_error(capsys, "--model", MODEL, "--speculative-method", "ngram",
                       "--draft-vocab-size", "1000")
    assert "--draft-vocab-size goes with --draft-model" in line


def test_a_file_that_is_no_gguf_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0" * 16)
    line = usage_error(capsys, "--model", str(weights))
    assert "--model" in line and "not a .gguf file" in line
    line = usage_error(capsys, "--model", MODEL, "--speculative-method", "draft",
                       "--draft-model", str(weights))
    assert "--draft-model" in line and "not a .gguf file" in line


def test_a_folder_without_config_json_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    line = usage_error(capsys, "--model", str(tmp_path))
    assert "--model" in line and "config.json" in line


def test_what_the_loader_takes_passes(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    _check_model(str(tmp_path / "m.gguf"))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    _check_model(str(tmp_path / "hf"))
    _check_model(MODEL)
    with pytest.raises(UsageError, match="neither an existing file"):
        _check_model(str(tmp_path / "missing.gguf"))


def test_a_device_this_machine_lacks_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    model = tmp_path / "m.gguf"
    model.write_bytes(b"not read: refused before the load")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = usage_error(capsys, "--model", str(model), "--device", "cuda")
    assert "--device cuda" in line and "no CUDA device" in line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    line = usage_error(capsys, "--model", str(model), "--device", "cuda:2")
    assert "--device cuda:2" in line and "2 CUDA device(s)" in line


def test_a_cpu_kv_pool_larger_than_memory_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    import os

    model = tmp_path / "m.gguf"
    model.write_bytes(b"not read: refused before the load")
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    line = usage_error(capsys, "--model", str(model), "--device", "cpu",
                       "--kv-cache-memory-mb", str(2 * total_mb))
    assert f"--kv-cache-memory-mb {2 * total_mb}" in line and "memory" in line
