"""The HF export reads the GGUF's tokenizer from the header (``read_gguf_header``), not with
``gguf.GGUFReader``: 0.28 s instead of 3.7 s for SmolLM2's tokenizer, 1.0 s instead of 17 s for
Qwen2.5-Coder-0.5B's, paid by every ONNX build. The files it writes are byte-identical to those
GGUFReader's values gave (checked on both models when this changed; SmolLM2 here)."""

from __future__ import annotations

import json

import pytest

from cloud_server.models import export_hf


def _no_reader(*args, **kwargs):
    raise AssertionError("export_hf built a gguf.GGUFReader")


def _write_toy_gguf(path):
    """A GGUF with only the tokenizer metadata the export reads: a tiny byte-level BPE vocabulary
    with a control token, a user-defined one, a bool and the chat template."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<", ">", "a", "b", "ab", "<|end|>", "<t>"])
    w.add_token_types([1, 1, 1, 1, 1, 3, 4])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(5)
    w.add_eos_token_id(5)
    w.add_add_bos_token(True)
    w.add_chat_template("{{ messages[0]['content'] }}é")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_write_tokenizer_reads_the_header_not_gguf_reader(tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    src = tmp_path / "toy.gguf"
    _write_toy_gguf(src)
    monkeypatch.setattr(gguf, "GGUFReader", _no_reader)
    monkeypatch.setattr(gguf.gguf_reader, "GGUFReader", _no_reader)
    out = export_hf.write_tokenizer(src, tmp_path / "hf")
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config == {"bos_token": "<|end|>", "eos_token": "<|end|>", "add_bos_token": True,
                      "chat_template": "{{ messages[0]['content'] }}é"}
    added = {t["content"]: (t["id"], t["special"])
             for t in json.loads((out / "tokenizer.json").read_text())["added_tokens"]}
    assert added == {"<|end|>": (5, True), "<t>": (6, False)}


def _reference_files(gguf_path, out):
    """The tokenizer files as the export wrote them from GGUFReader's ``field.contents()``."""
    import gguf

    fields = gguf.GGUFReader(str(gguf_path)).fields
    meta = {key: field.contents() for key, field in fields.items()}
    out.mkdir()
    export_hf._tokenizer_json(meta, out)
    tokens = meta["tokenizer.ggml.tokens"]
    config = {
        "bos_token": tokens[int(meta.get("tokenizer.ggml.bos_token_id", 1))],
        "eos_token": tokens[int(meta.get("tokenizer.ggml.eos_token_id", 2))],
        "add_bos_token": str(meta.get("tokenizer.ggml.add_bos_token", False)).lower() == "true",
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.mark.real
def test_smollm2_tokenizer_files_equal_gguf_readers(smollm2_path, tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    ref = _reference_files(smollm2_path, tmp_path / "ref")
    monkeypatch.setattr(gguf, "GGUFReader", _no_reader)
    monkeypatch.setattr(gguf.gguf_reader, "GGUFReader", _no_reader)
    out = export_hf.write_tokenizer(smollm2_path, tmp_path / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
