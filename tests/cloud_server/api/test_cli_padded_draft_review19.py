"""A draft folder whose embedding is padded to another row count than the target's passes the
start-up check (Qwen2.5 checkpoints pad 151,665 ids to 151,936 or 152,064 rows): the header's
``vocab_size`` counts rows, not ids, so the tokenizers are compared by the engine at load. Two
GGUF tokenizers with other id counts are still refused at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

import cloud_server.__main__ as cli
from cloud_server.cli_checks import _check_model_header
from cloud_server.cli_settings import _engine_config
from tests.cloud_server.api.test_cli_header_review15 import gguf_header, hf_folder, usage_error


def test_folders_padded_differently_pass_the_start_up_check(tmp_path: Path) -> None:
    target = hf_folder(tmp_path / "target", vocab=151936)
    draft = hf_folder(tmp_path / "draft", vocab=152064)
    args = cli.build_parser().parse_args(["serve", "--device", "cpu", "--model", str(target),
                                          "--speculative-method", "draft", "--draft-model", str(draft)])
    _check_model_header(args, _engine_config(args), False)


def test_gguf_tokenizers_of_other_sizes_are_still_refused(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    target = gguf_header(tmp_path / "target.gguf", tokens=8)
    draft = gguf_header(tmp_path / "draft.gguf", tokens=9)
    line = usage_error(capsys, "--model", str(target), "--speculative-method", "draft",
                       "--draft-model", str(draft))
    assert "vocabulary of 9 tokens, the target's 8" in line
