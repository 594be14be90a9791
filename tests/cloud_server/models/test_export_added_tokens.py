"""The folder exported from a GGUF keeps its user-defined tokens (Qwen2.5's <tool_call>).

Before, ``export_hf`` wrote control tokens only, so when Qwen's chat template itself wrote
``<tool_call>`` (an assistant turn with ``tool_calls``) the GGUF's tokenizer gave the one id 151657
and the exported folder (and the ONNX folder prepared from it) five plain ids: 72 ids against 77
for one weather-tool conversation. Now the exported tokenizer.json carries them as added tokens not
flagged special, as Qwen's own tokenizer.json does, and a message's text still reads them as
characters (``hybridllm.prompts.tokenizers_plain``).
"""

from __future__ import annotations

import json

import pytest

from cloud_server.models.export_hf import _tokenizer_json


def _toy_meta():
    """GGUF tokenizer metadata (as ``read_gguf_header`` gives it) of a tiny byte-level BPE
    vocabulary: letters, one merge, a control token (type 3) and two user-defined ones (type 4)."""
    tokens = ["<", ">", "/", "a", "b", "t", "ab", "<|end|>", "<t>", "</t>"]
    types = [1, 1, 1, 1, 1, 1, 1, 3, 4, 4]
    return {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": ["a b"]}


def test_user_defined_tokens_are_exported_unflagged(tmp_path):
    from hybridllm.prompts import tokenizers_plain

    _tokenizer_json(_toy_meta(), tmp_path)
    added = {t["content"]: (t["id"], t["special"])
             for t in json.loads((tmp_path / "tokenizer.json").read_text())["added_tokens"]}
    assert added == {"<|end|>": (7, True), "<t>": (8, False), "</t>": (9, False)}
    # the template's markers, which a message's text never becomes
    specials, encode = tokenizers_plain(tmp_path / "tokenizer.json")
    assert specials == {"<|end|>": 7, "<t>": 8, "</t>": 9}
    assert encode("<t>ab</t>") == [0, 5, 1, 6, 0, 2, 5, 1]


QWEN = "qwen2.5-coder-0.5b-instruct"
TOOL_CALL, END_TOOL_CALL = 151657, 151658


def _call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


TOOL_CONVERSATIONS = [
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [_call("weather", {"city": "Paris"})]},
     {"role": "tool", "content": "sunny"}],
    [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Add 2 and 3, then 4 and 5."},
     {"role": "assistant", "content": "Adding.", "tool_calls": [
         _call("add", '{"a": 2, "b": 3}'), _call("add", {"a": 4, "b": 5, "note": "café ✓"})]},
     {"role": "tool", "content": "5"}, {"role": "tool", "content": "9"},
     {"role": "assistant", "content": "5 and 9."}, {"role": "user", "content": "Thanks"}],
    # the user's own <tool_call> is characters; the template's is its token
    [{"role": "user", "content": "What does <tool_call> mean?"},
     {"role": "assistant", "content": "", "tool_calls": [_call("lookup", {"q": "<tool_call>"})]},
     {"role": "tool", "content": "</tool_call> ends <tool_call>"}],
]


@pytest.fixture(scope="module")
def qwen_pair(tmp_path_factory):
    from cloud_server.models.export_hf import write_tokenizer
    from cloud_server.models.tokenizer import GGUFTokenizer, HFTokenizer
    from hybridllm.models import pull

    path = pull(QWEN)
    folder = write_tokenizer(path, tmp_path_factory.mktemp("qwen-hf"))
    return GGUFTokenizer(path), HFTokenizer(folder), folder


@pytest.mark.real
def test_a_tool_call_conversation_gets_the_ggufs_ids_from_the_exported_folder(qwen_pair):
    from hybridllm.prompts import tokenize_prompt, tokenizers_plain

    gguf_tok, hf_tok, folder = qwen_pair
    # the ONNX device reads the folder's tokenizer.json this way (hybridllm.backends.onnx)
    specials, plain = tokenizers_plain(folder / "tokenizer.json")
    for messages in TOOL_CONVERSATIONS:
        ids = gguf_tok.encode_chat(messages)
        calls = sum(len(m.get("tool_calls") or []) for m in messages)
        assert ids.count(TOOL_CALL) == ids.count(END_TOOL_CALL) == calls, messages  # the template's
        assert hf_tok.encode_chat(messages) == ids, messages
        assert tokenize_prompt(hf_tok.prompt_format(), messages, special_ids=specials,
                               encode_plain=plain) == ids, messages
    # a raw completion prompt is read as written on both: <tool_call> is its token
    raw = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call>"
    assert hf_tok.encode(raw) == gguf_tok.encode(raw)
    assert TOOL_CALL in hf_tok.encode(raw)
    assert hf_tok.decode(gguf_tok.encode(raw)) == gguf_tok.decode(gguf_tok.encode(raw))
