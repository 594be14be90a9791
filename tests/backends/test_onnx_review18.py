"""The ONNX backend's prompt files (helper-h4, review 18), on a fake ONNX Runtime GenAI: no model
is loaded. The chat template is read as transformers and the cloud server read it
(``chat_template.jinja`` first; a list of named templates in tokenizer_config.json), and a
damaged prompt file is a ModelCorruptError naming what to do, not a traceback or a silent loss."""

from __future__ import annotations

import json
import pathlib
import sys
import types

import pytest

from hybridllm import GenerationParams, ModelCorruptError

VOCAB = ["<unk>", "<s>", "</s>", "<|im_end|>", "hi", "there", "STOP", "end"]
JINJA = "{% for m in messages %}JINJA {{ m['content'] }}\n{% endfor %}"
CONFIG_TEMPLATE = "{% for m in messages %}CONFIG {{ m['content'] }}\n{% endfor %}"


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    data = json.loads(tok.to_str())
    data["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, t in enumerate(VOCAB[:4])]
    return json.dumps(data)


class _Gen:
    """Logits that make the model say ``script`` (token ids) one after the other, then </s>."""

    def __init__(self, script):
        self.script, self.n, self.prompt = script, 0, None

    def append_tokens(self, tokens):
        self.n += len(tokens)

    def rewind_to(self, n):
        self.n = n

    def get_logits(self):
        import numpy as np

        row = np.zeros((1, 1, len(VOCAB)), dtype=np.float32)
        step = self.n - _FakeOg.prompt_len
        row[0, 0, _FakeOg.script[step] if 0 <= step < len(_FakeOg.script) else 2] = 50.0
        return row


class _FakeOg(types.ModuleType):
    script: list[int] = []
    prompt_len = 0

    def __init__(self):
        super().__init__("onnxruntime_genai")
        self.Config = lambda path: types.SimpleNamespace(overlay=lambda text: None)
        self.Model = lambda config: object()

        class Tokenizer:
            eos_token_ids = [2]

            def __init__(self, model):
                pass

            def to_token_id(self, text):
                return VOCAB.index(text)

            def create_stream(self):
                return types.SimpleNamespace(decode=lambda t: " " + VOCAB[t])

        self.Tokenizer = Tokenizer
        self.GeneratorParams = lambda model: types.SimpleNamespace(set_search_options=lambda **kw: None)
        self.Generator = lambda model, params: _Gen(_FakeOg.script)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", _FakeOg())
    (tmp_path / "genai_config.json").write_text(json.dumps(
        {"model": {"context_length": 64, "bos_token_id": 1, "eos_token_id": [2]}}))
    (tmp_path / "tokenizer.json").write_text(_tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CONFIG_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
    return tmp_path


def _backend(folder, **kw):
    from hybridllm.backends.onnx import OnnxBackend

    return OnnxBackend(str(folder), huge_pages=False, **kw)


def test_chat_template_jinja_wins_over_tokenizer_config(folder):
    """As transformers (since 4.50) and the cloud server read a folder. Before: the edge took
    tokenizer_config.json's template, so one folder answered with two prompt formats."""
    (folder / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    edge = _backend(folder)
    assert edge.render([{"role": "user", "content": "hi"}]).startswith("JINJA hi")


def test_chat_template_jinja_wins_over_our_record_too(folder):
    """Our record (hybridllm.json) copies tokenizer_config.json's template at prepare time."""
    (folder / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    (folder / "hybridllm.json").write_text(json.dumps({"chat_template": CONFIG_TEMPLATE}))
    assert _backend(folder).render([{"role": "user", "content": "hi"}]).startswith("JINJA hi")


def test_a_list_of_named_templates_takes_the_default(folder):
    """Before: the list itself became the template, and every request failed in the renderer."""
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": JINJA}]}))
    edge = _backend(folder)
    assert edge.chat_format == "template"
    assert edge.render([{"role": "user", "content": "hi"}]).startswith("JINJA hi")


@pytest.mark.parametrize("template, says", [
    ([{"name": "tool_use", "template": "TOOLS"}], "names no 'default' template"),
    (42, "must be a string or a list of named templates"),
])
def test_a_template_that_is_not_one_says_so(folder, template, says):
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    with pytest.raises(ModelCorruptError, match=says) as err:
        _backend(folder)
    assert "tokenizer_config.json" in str(err.value) and "Prepare it again" in str(err.value)


@pytest.mark.parametrize("text", ['{"chat_template": "x", ', "[1, 2]", b"\xff\xfe{}"])
def test_a_damaged_tokenizer_config_is_a_corrupt_folder(folder, text):
    """Before: a JSON array raised AttributeError ('list' object has no attribute 'get'), and
    bad JSON was ignored: the folder's template, BOS and EOS were silently dropped and the model
    got the plain completion transcript, a prompt it was not tuned on."""
    path = folder / "tokenizer_config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ModelCorruptError, match="tokenizer_config.json") as err:
        _backend(folder)
    assert "Prepare it again" in str(err.value)


def test_files_are_read_as_utf8_whatever_the_locale(folder, monkeypatch):
    """A read without an encoding decodes in the locale's (cp1252 on Windows): a template with
    non-ASCII text came out garbled, and an undecodable tokenizer.json lost the end-of-text
    tokens (the model wrote past its end)."""
    real = pathlib.Path.read_text

    def locale_read(self, encoding=None, errors=None):
        return real(self, encoding=encoding or "cp1252", errors=errors)

    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }} \u2192 ok", encoding="utf-8")
    monkeypatch.setattr(pathlib.Path, "read_text", locale_read)
    edge = _backend(folder)
    assert edge.render([{"role": "user", "content": "hi"}]).startswith("hi \u2192 ok")


def test_a_stream_stops_at_a_stop_string_and_at_the_window(folder):
    """The token loop on the fake runtime: a stop string ends the answer without it, and
    max_tokens past the context is cut to the room left (finish 'length')."""
    (folder / "chat_template.jinja").write_text(JINJA, encoding="utf-8")
    edge = _backend(folder, n_ctx=8)
    messages = [{"role": "user", "content": "hi"}]
    _FakeOg.prompt_len = len(edge.tokenize(messages))
    _FakeOg.script = [4, 5, 6, 7]  # hi there STOP end
    out = edge.generate(messages, GenerationParams(max_tokens=10, temperature=0.0, stop=["STOP"]))
    assert (out.text.strip(), out.finish_reason) == ("hi there", "stop")
    _FakeOg.script = [4] * 20
    out = edge.generate(messages, GenerationParams(max_tokens=1000, temperature=0.0))
    assert out.finish_reason == "length"
    assert out.usage.completion_tokens == 8 - _FakeOg.prompt_len
