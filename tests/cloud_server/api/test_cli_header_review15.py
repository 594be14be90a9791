"""``hybridllm-cloud serve``: what a model's header rules out is a usage error (exit status 2, one
line naming the option and the model's figure) before the port is bound or a weight is read:

- ``--max-model-len`` above the model's context length (a GGUF's ``context_length``, a folder's
  ``max_position_embeddings``): the server started, then exited 1 naming ``max_model_len``;
- a ``--draft-model`` with another vocabulary (SmolLM2-135M beside Qwen2.5-Coder-0.5B) or other
  end-of-sequence ids: refused only once both models had loaded;
- a KV pool (``--kv-cache-memory-mb``, ``--block-size``) that cannot hold one ``--max-model-len``
  sequence: the server started, then exited 1;
- a draft model whose context is shorter than the target's ``max_model_len``: the server served,
  and every step of a sequence past the draft's length failed ("index 512 is out of bounds for
  dimension 0 with size 512": SmolLM2 with a copy of itself whose header says 512 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cloud_server.__main__ as cli
from cloud_server.cli_checks import _check_model_header
from cloud_server.cli_settings import _engine_config
from cloud_server.models.header import read_gguf_metadata, read_model_header


@pytest.fixture(autouse=True)
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Binding the port means the check came too late: fail at once, nothing loads."""

    def listen(*args: object, **kwargs: object) -> None:
        raise AssertionError("the port was bound: the setting was not refused before the start")

    monkeypatch.setattr(cli, "listen", listen)


def usage_error(capsys: pytest.CaptureFixture[str], *options: str) -> str:
    assert cli.main(["serve", "--port", "0", *options]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("hybridllm-cloud: error:"), err
    return lines[0]


def gguf_header(path: Path, *, context: int = 2048, tokens: int = 8, eos: int | None = 3) -> Path:
    """A GGUF file with a header and no tensors: all the start-up checks read."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_token_list([f"t{i}" for i in range(tokens)])
    if eos is not None:
        writer.add_eos_token_id(eos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def hf_folder(path: Path, *, context: int = 2048, vocab: int = 1000) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
        "num_hidden_layers": 2, "vocab_size": vocab, "max_position_embeddings": context,
    }))
    return path


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from hybridllm.models import pull

    return pull("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def qwen05() -> Path:
    from hybridllm.models import pull

    return pull("qwen2.5-coder-0.5b-instruct")


def test_max_model_len_beyond_a_gguf_context(capsys: pytest.CaptureFixture[str], smollm2: Path) -> None:
    line = usage_error(capsys, "--model", str(smollm2), "--max-model-len", "100000")
    assert "--max-model-len 100000" in line and "8192" in line
    line = usage_error(capsys, "--model", "smollm2-135m-instruct", "--max-model-len", "8193")
    assert "--max-model-len 8193" in line and "(8192 tokens)" in line


def test_max_model_len_beyond_a_folders_context(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "hf", context=2048)
    line = usage_error(capsys, "--model", str(folder), "--max-model-len", "4096")
    assert "--max-model-len 4096" in line and "2048" in line


def test_a_draft_model_with_another_vocabulary(capsys: pytest.CaptureFixture[str], smollm2: Path,
                                               qwen05: Path) -> None:
    line = usage_error(capsys, "--model", str(qwen05), "--speculative-method", "draft",
                       "--draft-model", str(smollm2))
    assert "--draft-model" in line and str(smollm2) in line and str(qwen05) in line
    assert "49152" in line and "151936" in line


def test_a_draft_model_with_other_eos_ids(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = gguf_header(tmp_path / "target.gguf", eos=3)
    draft = gguf_header(tmp_path / "draft.gguf", eos=5)
    line = usage_error(capsys, "--model", str(target), "--speculative-method", "draft",
                       "--draft-model", str(draft))
    assert "--draft-model" in line and "end-of-sequence token ids [5], the target's [3]" in line
    other = gguf_header(tmp_path / "other.gguf", tokens=9)
    line = usage_error(capsys, "--model", str(target), "--speculative-method", "draft",
                       "--draft-model", str(other))
    assert "vocabulary of 9 tokens, the target's 8" in line


def test_what_fits_passes(tmp_path: Path, smollm2: Path) -> None:
    parser = cli.build_parser()
    target = gguf_header(tmp_path / "target.gguf", context=2048)
    same = gguf_header(tmp_path / "same.gguf", context=4096)  # a longer draft context is fine
    no_eos = gguf_header(tmp_path / "no_eos.gguf", eos=None)  # not said: left to the load
    for options in (
        ["--model", str(target), "--max-model-len", "2048"],
        ["--model", str(target), "--speculative-method", "draft", "--draft-model", str(same)],
        ["--model", str(target), "--speculative-method", "draft", "--draft-model", str(no_eos)],
        ["--model", str(smollm2), "--speculative-method", "draft", "--draft-model", str(smollm2)],
        ["--model", str(hf_folder(tmp_path / "hf")), "--max-model-len", "2048"],
        ["--model", str(target), "--speculative-method", "draft", "--max-model-len", "512",
         "--draft-model", str(gguf_header(tmp_path / "short.gguf", context=512))],
    ):
        args = parser.parse_args(["serve", "--device", "cpu", *options])
        _check_model_header(args, _engine_config(args), False)


def test_a_header_that_cannot_be_read_is_left_to_the_load(tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(gguf_header(tmp_path / "whole.gguf").read_bytes()[:40])
    with pytest.raises(Exception):  # noqa: B017, PT011 - struct.error or ValueError
        read_gguf_metadata(damaged)
    (tmp_path / "v1.gguf").write_bytes(b"GGUF\1\0\0\0" + b"\0" * 16)
    with pytest.raises(ValueError, match="version 2 or 3"):
        read_gguf_metadata(tmp_path / "v1.gguf")
    assert read_model_header(str(damaged)) is None
    assert read_model_header(str(tmp_path / "v1.gguf")) is None
    assert read_model_header("no-such-catalog-id") is None
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert read_model_header(str(bad)) is None
    args = cli.build_parser().parse_args(
        ["serve", "--model", str(damaged), "--max-model-len", "100000", "--kv-cache-memory-mb", "1"])
    _check_model_header(args, _engine_config(args), False)


def test_a_kv_pool_that_holds_no_whole_sequence(capsys: pytest.CaptureFixture[str],
                                                smollm2: Path) -> None:
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes (bf16) = 23,040 bytes a token
    line = usage_error(capsys, "--model", str(smollm2), "--device", "cpu", "--kv-cache-memory-mb", "4")
    assert "--kv-cache-memory-mb" in line and "holds 176 tokens" in line and "4096" in line
    line = usage_error(capsys, "--model", str(smollm2), "--device", "cpu", "--block-size", "1048576")
    assert "holds 0 tokens" in line and "--block-size" in line
    line = usage_error(capsys, "--model", str(smollm2), "--device", "cpu", "--kv-cache-memory-mb",
                       "8", "--max-model-len", "8192")
    assert "less than one sequence of 8192" in line


def test_a_kv_pool_that_fits_passes(smollm2: Path) -> None:
    parser = cli.build_parser()
    for options in (["--kv-cache-memory-mb", "4", "--max-model-len", "176"], [],
                    ["--kv-cache-memory-mb", "1", "--replicas", "2"]):  # a replica's device: its own
        args = parser.parse_args(["serve", "--model", str(smollm2), "--device", "cpu", *options])
        _check_model_header(args, _engine_config(args), args.replicas is not None)


def test_a_draft_model_with_a_shorter_context(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    target = gguf_header(tmp_path / "target.gguf", context=2048)
    draft = gguf_header(tmp_path / "draft.gguf", context=512)
    line = usage_error(capsys, "--model", str(target), "--device", "cpu", "--speculative-method",
                       "draft", "--draft-model", str(draft))  # max_model_len: the target's 2048
    assert "--draft-model" in line and "context length of 512 tokens" in line
    assert "less than the target's 2048" in line and "--max-model-len 512 or less" in line
    line = usage_error(capsys, "--model", str(target), "--device", "cpu", "--speculative-method",
                       "draft", "--draft-model", str(draft), "--max-model-len", "513")
    assert "less than the target's 513" in line
