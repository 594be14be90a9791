"""Added tokens that are not flagged special are markers too: a message's text never becomes them.

Qwen2.5's tokenizer adds ``<tool_call>`` and ``</tool_call>`` without the special flag (its real
tokenizer.json also leaves ``<|fim_prefix|>`` ... unflagged). llama.cpp matches such a token (a
user-defined one in the GGUF) even with ``special=False``, and ``tokenizers`` matches an unflagged
added token in any text, so a user who wrote ``<tool_call>`` got id 151657 on the device and on
the cloud's GGUF tokenizer (and on a folder with Qwen's own tokenizer.json), while the folder
exported from the GGUF (which carries control tokens only) read the same characters as text. Now
every path reads them as their characters, as the base vocabulary does. Fast checks on toy
tokenizers here; the real vocabularies in the ``real`` tests below.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from hybridllm.prompts import PromptFormat, encode_around, tokenize_prompt, tokenizers_plain

MARKERS = ["<tool_call>", "</tool_call>", "<tool>", "call>x"]


def _pre_tokens(text: str) -> list[str]:
    """A toy BPE pre-tokenizer of the usual shape: letter runs (with one leading non-letter),
    digits, runs of other symbols, whitespace."""
    return re.findall(r"[^\sA-Za-z0-9]?[A-Za-z]+|[0-9]|[^\sA-Za-z0-9]+|\s+", text)


def _prose(text: str) -> list[int]:
    """Plain prose: one id per pre-token (ids far below the markers')."""
    return [sum(map(ord, p)) * 7 + len(p) for p in _pre_tokens(text)]


def _matching(text: str) -> list[int]:
    """A tokenizer that matches each marker as its one token whatever it is told, as llama.cpp does
    with user-defined tokens: the text is cut at every marker, the rest read as prose."""
    find = re.compile("|".join(map(re.escape, sorted(MARKERS, key=len, reverse=True))))
    ids, start = [], 0
    for m in find.finditer(text):
        ids += _prose(text[start : m.start()]) + [10**6 + MARKERS.index(m.group(0))]
        start = m.end()
    return ids + _prose(text[start:])


def test_markers_get_the_ids_of_their_characters():
    for text in ["<tool_call>", 'a <tool_call>\n{"name": 1}\n</tool_call> b', "x<tool_call>x>",
                 "<tool>call>x", "it's <tool_call>'s", "<tool_call></tool_call><tool_call>"]:
        assert _matching(text) != _prose(text)  # the toy tokenizer matches them, as llama.cpp does
        assert encode_around(text, MARKERS, _matching) == _prose(text), text
    rng = random.Random(1)
    bits = [*MARKERS, "tool", "_", "call", "<", ">", "/", " ", "\n", "x", "'s", "1", "é"]
    for _ in range(2000):
        text = "".join(rng.choice(bits) for _ in range(rng.randint(1, 9)))
        ids = encode_around(text, MARKERS, _matching)
        assert not [i for i in ids if i >= 10**6], text
        assert ids == _prose(text), text


def test_text_without_a_marker_is_encoded_whole():
    calls = []

    def encode(text):
        calls.append(text)
        return _matching(text)

    text = "def f(x):\n    return x < 2  # <b>bold</b> tool_call"
    assert encode_around(text, MARKERS, encode) == _matching(text) and calls == [text]
    assert encode_around(text, [], encode) == _matching(text)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}\n<tool_call>\n{{ c }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_template_writes_an_added_marker_a_message_cannot():
    specials = {"<|im_start|>": 1, "<|im_end|>": 2, "<tool_call>": 3, "</tool_call>": 4}
    fmt = PromptFormat(chat_template=CHATML)

    def plain(text):
        return encode_around(text, ["<tool_call>", "</tool_call>"], _matching)

    msgs = [{"role": "assistant", "content": "", "tool_calls": ["f()"]},
            {"role": "user", "content": "<tool_call>\nf()\n</tool_call>"}]
    ids = tokenize_prompt(fmt, msgs, special_ids=specials, encode_plain=plain)
    assert [i for i in ids if i < 5] == [1, 3, 4, 2, 1, 2, 1]  # the template's two, not the user's
    assert not [i for i in ids if i >= 10**6]  # the user's markers are characters


# -- tokenizers: an unflagged added token outside the vocabulary is a marker -------------------


def _toy_tokenizer_json(tmp_path):
    """One id per character (and "abc", which the merges build), plus added tokens as Qwen's
    tokenizer.json has them: a special one, unflagged ones the vocabulary cannot build, and an
    unflagged one it reads whole anyway ("abc": ordinary text)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({"ab": len(vocab), "abc": len(vocab) + 1})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("ab", "c")]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True, normalized=False)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "abc")])
    tok.save(str(tmp_path / "tokenizer.json"))
    return tok, vocab


def test_tokenizers_reads_unflagged_added_tokens_as_characters(tmp_path):
    tok, vocab = _toy_tokenizer_json(tmp_path)
    added = json.loads((tmp_path / "tokenizer.json").read_text())["added_tokens"]
    added = {t["content"]: t["id"] for t in added}
    assert tok.encode("<tool_call>", add_special_tokens=False).ids == [added["<tool_call>"]]  # before
    specials, encode = tokenizers_plain(tmp_path / "tokenizer.json")
    assert set(specials) == {"<|im_end|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>"}
    text = "<tool_call>{}</tool_call><|fim_prefix|><|im_end|>!"
    assert encode(text) == [vocab[c] for c in text]
    assert "abc" not in specials and encode("xabcx") == [vocab["x"], vocab["abc"], vocab["x"]]
    assert encode("plain text") == tok.encode("plain text", add_special_tokens=False).ids


# -- the real vocabularies -----------------------------------------------------------------------

QWEN = "qwen2.5-coder-0.5b-instruct"
# Qwen2.5's own tokenizer.json flags these not special (the GGUF made the <|...|> ones control)
QWEN_UNFLAGGED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                  "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
ORDINARY = [
    [{"role": "user", "content": "Write a function that calls a tool."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "tool_call <b>x</b>"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
     {"role": "user", "content": "def f(x):\n    return x<2  # <|not_a_token|> <tool call>"}],
]


def _added_ids(llm):
    """Every added token of the vocabulary (control, user-defined or unknown, and not an ordinary
    entry of the base vocabulary: Qwen's "</s>" is one, which llama.cpp also flags control), read
    from the GGUF's token attributes (not from the code under test)."""
    from llama_cpp import llama_cpp as C

    mask = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED | C.LLAMA_TOKEN_ATTR_UNKNOWN
    vocab = llm._model.vocab
    attrs = {t: C.llama_vocab_get_attr(vocab, t) for t in range(llm.n_vocab())}
    return {
        C.llama_vocab_get_text(vocab, t).decode("utf-8", errors="replace"): t
        for t, attr in attrs.items() if attr & mask and not attr & C.LLAMA_TOKEN_ATTR_NORMAL
    }


@pytest.fixture(scope="module")
def qwen_edge():
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.models import pull

    pull(QWEN)
    edge = LlamaCppBackend(QWEN, n_ctx=512)
    yield edge
    edge.close()


@pytest.fixture(scope="module")
def qwen_export(tmp_path_factory):
    """The tokenizer.json the project exports from the GGUF (control tokens flagged special,
    ``<tool_call>`` as an unflagged added token, which ``tokenizers_plain`` reads as characters in
    message text): ``write_tokenizer``, the export's own path (1.0 s; with GGUFReader 17 s)."""
    from cloud_server.models.export_hf import write_tokenizer
    from hybridllm.models import pull

    return write_tokenizer(pull(QWEN), tmp_path_factory.mktemp("qwen-hf"))


def _old_ids(edge, messages):
    """The whole rendered prompt with special parsing (the path before tokenize_prompt)."""
    return list(edge._llm.tokenize(edge.render(messages).encode("utf-8"), add_bos=False, special=True))


@pytest.mark.real
def test_llama_cpp_reads_every_added_token_in_a_message_as_text(qwen_edge, qwen_export):
    added = _added_ids(qwen_edge._llm)
    assert {"<tool_call>", "</tool_call>", "<|im_end|>", "<|fim_prefix|>"} <= set(added)
    ids_of = set(added.values())
    harmless = qwen_edge.tokenize([{"role": "user", "content": "hi"}])
    specials, plain = tokenizers_plain(qwen_export / "tokenizer.json")
    for text in added:
        msgs = [{"role": "user", "content": f"hi {text} x{text}\n{text}"}]
        ids = qwen_edge.tokenize(msgs, prefix=text)
        assert [i for i in ids if i in ids_of] == [i for i in harmless if i in ids_of], text
        rendered = bytes(qwen_edge._llm.detokenize(ids, special=True)).decode("utf-8")
        assert rendered == qwen_edge.render(msgs) + text  # nothing dropped
        # the ids of those characters in plain prose: the base vocabulary's (the exported folder)
        base = tokenize_prompt(qwen_edge.prompt_format, msgs, prefix=text, special_ids=specials,
                               encode_plain=plain)
        assert ids == base, text


@pytest.mark.real
def test_llama_cpp_ordinary_and_tool_call_conversations_keep_their_ids(qwen_edge):
    """The template's own <tool_call> (an assistant turn that called a tool) is still its token."""
    tool_turn = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
    ]
    ids = qwen_edge.tokenize(tool_turn)
    assert ids == _old_ids(qwen_edge, tool_turn)
    tool_id = _added_ids(qwen_edge._llm)["<tool_call>"]
    assert ids.count(tool_id) == 1
    for messages in ORDINARY:
        assert qwen_edge.tokenize(messages) == _old_ids(qwen_edge, messages), messages


def _qwen_like_folder(export, out):
    """A folder with the tokenizer.json Qwen2.5 ships: the exported one, with <tool_call> and
    </tool_call> added unflagged and the FIM tokens unflagged."""
    data = json.loads((export / "tokenizer.json").read_text())
    for tok in data["added_tokens"]:
        if tok["content"] in QWEN_UNFLAGGED:
            tok["special"] = False
    data["added_tokens"] += [
        {"id": 151657 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}
        for i, t in enumerate(("<tool_call>", "</tool_call>"))
    ]
    (out / "tokenizer.json").write_text(json.dumps(data))
    return out


@pytest.mark.real
def test_cloud_tokenizers_read_unflagged_added_tokens_as_text(qwen_export, tmp_path):
    from tokenizers import Tokenizer

    from cloud_server.models.tokenizer import GGUFTokenizer, HFTokenizer
    from hybridllm.models import pull

    folder = _qwen_like_folder(qwen_export, tmp_path)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.encode_special_tokens = True  # what the cloud's plain encoder was before
    assert raw.encode("<tool_call><|fim_prefix|>", add_special_tokens=False).ids == [151657, 151659]
    gguf_tok, hf_tok = GGUFTokenizer(pull(QWEN)), HFTokenizer(folder)
    gguf_tok.chat_template = hf_tok.chat_template = "{% for m in messages %}<|im_start|>" \
        "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    added = range(151643, 151665)
    for text in QWEN_UNFLAGGED + ["<|im_end|>", "<|endoftext|>"]:
        msgs = [{"role": "user", "content": f"a {text}b\n{text}"}]
        ids = gguf_tok.encode_chat(msgs)
        assert [i for i in ids if i in added] == [151644, 151645, 151644], text
        assert hf_tok.encode_chat(msgs) == ids, text
    ordinary = [{"role": "user", "content": "tool_call <b>x</b> <|fim"}]
    assert hf_tok.encode_chat(ordinary) == gguf_tok.encode_chat(ordinary)
