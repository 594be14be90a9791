"""A Hugging Face folder's tokenizer files read as transformers reads them: a damaged or ill-typed
``tokenizer_config.json`` / ``generation_config.json`` is a ModelLoadError naming the file (not a
JSONDecodeError, AttributeError or TypeError), stop ids may be a list in either
``generation_config.json`` or ``config.json``, and a chat template may come as a list of named
templates or as ``chat_template.jinja``. Tiny byte-level tokenizers built here; no hub access."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.tokenizer import HFTokenizer

CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MSGS = [{"role": "user", "content": "hi <|im_end|><s> é 日本 😀"}]


def _folder(path: Path, cfg: dict | None = None, **files: str) -> Path:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    marks = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
    tok.add_special_tokens([AddedToken(t, special=True) for t in marks])
    tok.save(str(path / "tokenizer.json"))  # ids: 256 <s>, 257 </s>, 258 <|im_start|>, 259 <|im_end|>
    if cfg is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)
    return path


CFG = {"bos_token": "<s>", "eos_token": "<|im_end|>", "add_bos_token": True, "chat_template": CHATML}


@pytest.mark.parametrize(("name", "text", "match"), [
    ("tokenizer_config.json", "{broken", "cannot read .*tokenizer_config.json"),
    ("generation_config.json", "{broken", "cannot read .*generation_config.json"),
    ("tokenizer_config.json", "[1, 2]", "tokenizer_config.json must hold a JSON object"),
    ("generation_config.json", '{"eos_token_id": "</s>"}', "generation_config.json: eos_token_id"),
    ("generation_config.json", '{"eos_token_id": [257, null]}', "generation_config.json: eos_token_id"),
    ("config.json", '{"eos_token_id": [257, "x"]}', "config.json: eos_token_id"),
])
def test_a_damaged_config_file_is_named(tmp_path, name, text, match):
    folder = _folder(tmp_path)
    (folder / name).write_text(text, encoding="utf-8")
    with pytest.raises(ModelLoadError, match=match):
        HFTokenizer(folder)


def test_a_config_file_not_utf8_is_named(tmp_path):
    folder = _folder(tmp_path)
    (folder / "tokenizer_config.json").write_bytes(b'{"eos_token": "\xff"}')
    with pytest.raises(ModelLoadError, match="cannot read .*tokenizer_config.json"):
        HFTokenizer(folder)


def test_stop_ids_from_generation_config_as_a_list(tmp_path):
    folder = _folder(tmp_path, CFG, generation_config__json='{"eos_token_id": [257, 259]}',
                     config__json='{"eos_token_id": 1}')  # generation_config.json wins
    assert HFTokenizer(folder).eos_token_ids == [257, 259]


def test_stop_ids_from_config_json_without_a_generation_config(tmp_path):
    """Llama 3.1's config.json lists its three stop ids; transformers and vLLM stop on each when
    there is no generation_config.json. Before, only the tokenizer's own eos stopped it."""
    folder = _folder(tmp_path, CFG, config__json='{"eos_token_id": [257, 258]}')
    assert HFTokenizer(folder).eos_token_ids == [257, 258, 259]
    (tmp_path / "b").mkdir()
    folder2 = _folder(tmp_path / "b", CFG, config__json='{"bos_token_id": 256}')  # none named
    assert HFTokenizer(folder2).eos_token_ids == [259]


def test_a_list_of_named_chat_templates_takes_the_default(tmp_path):
    """Before: the list reached the Jinja compiler and every chat request was a TypeError."""
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": CHATML}]
    tok = HFTokenizer(_folder(tmp_path, {**CFG, "chat_template": named}))
    want = "<s><|im_start|>user\n" + MSGS[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(MSGS) == want


def test_a_list_without_a_default_template_is_named(tmp_path):
    folder = _folder(tmp_path, {**CFG, "chat_template": [{"name": "tool_use", "template": "T"}]})
    with pytest.raises(ModelLoadError, match="no 'default' template .*tool_use"):
        HFTokenizer(folder)


def test_chat_template_jinja_is_read(tmp_path):
    """transformers (4.50+) saves the template as chat_template.jinja, not in tokenizer_config.json:
    before, such a chat model was taken for a base model and got a completion prompt."""
    cfg = {k: v for k, v in CFG.items() if k != "chat_template"}
    tok = HFTokenizer(_folder(tmp_path, cfg, chat_template__jinja=CHATML))
    assert tok.chat_template == CHATML
    assert tok.apply_chat_template(MSGS, add_generation_prompt=False).endswith("<|im_end|>\n")


def test_chat_ids_one_bos_and_user_markers_stay_text(tmp_path):
    """(Held before too.) The template writes the BOS and add_bos_token is set: one BOS, as
    transformers' apply_chat_template gives; a user's "<|im_end|>" / "<s>" are plain bytes."""
    tok = HFTokenizer(_folder(tmp_path, CFG))
    ids = tok.encode_chat(MSGS)
    assert ids[:2] == [256, 258] and ids.count(256) == 1
    assert ids.count(259) == 1  # only the template's own end of turn
    assert tok.decode(ids) == "user\n" + MSGS[0]["content"] + "\nassistant\n"
    no_gen = tok.encode_chat(MSGS, add_generation_prompt=False)
    assert no_gen == ids[: len(no_gen)] and no_gen[-2:] == [259, tok.encode("\n", add_special=False)[0]]
    text = "é 日本 😀 \x00"
    assert tok.decode(tok.encode(text, add_special=False)) == text
    assert tok.encode(text)[0] == 256 and tok.encode("<s>x") == [256, *tok.encode("x", add_special=False)]
