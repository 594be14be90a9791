"""Tokens that add no text are named in logprobs (review 40).

A control token (``<|endoftext|>``, ``<|im_end|>``) decodes to nothing. Before, every such token
read "" in logprobs: a legacy completion's ``top_logprobs`` dict, keyed by the token's name, kept
one of them, and with the logprob of the last one (SmolLM2's ``logprobs: 5`` after an answer gave 4
entries, ``""`` holding the less likely control token's figure), and a chat entry's ``token`` did
not say which token it was. Now a control token is named by its marker (``<|im_end|>``, as vLLM
names it) and any other token without text by vLLM's ``token_id:N``; a chat entry's ``bytes`` stay
the token's own (none), so the entries' bytes still join to the answer's UTF-8.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cloud_server.api.generation import Prepared
from cloud_server.api.logprobs import chat_logprobs, text_logprobs
from cloud_server.api.metrics import ServerMetrics
from cloud_server.api.serving import OpenAIServing
from cloud_server.engine.logprobs import TokenLogprob
from cloud_server.engine.sampling_params import SamplingParams

TEXTS = {0: b"", 1: b"", 2: b"", 3: b"\n", 4: b"ok"}
NAMES = {0: "<|endoftext|>", 2: "<|im_end|>"}  # id 1: no text and no marker name


class _Tok:
    """Ids 0..2 add no text (as control tokens); 0 and 2 are the template's markers."""

    def decode(self, ids: list[int]) -> str:
        return b"".join(TEXTS[i] for i in ids).decode()

    def token_bytes(self, token_id: int) -> bytes:
        return TEXTS[token_id]

    def marker_bytes(self) -> dict[int, bytes]:
        return {i: name.encode() for i, name in NAMES.items()}


# emitted "\n" (id 3); its four most likely alternatives include all three textless tokens
ENTRY = TokenLogprob(3, -0.5, top=[(3, -0.5), (2, -1.5), (4, -2.0), (1, -3.0), (0, -4.0)], text_offset=0)


def test_legacy_top_logprobs_keep_every_textless_token_with_its_own_logprob() -> None:
    tok = _Tok()
    legacy = text_logprobs([ENTRY], tok.decode, tok.token_bytes, names=NAMES)
    assert legacy["top_logprobs"] == [
        {"\n": -0.5, "<|im_end|>": -1.5, "ok": -2.0, "token_id:1": -3.0, "<|endoftext|>": -4.0}
    ]
    assert legacy["tokens"] == ["\n"]


def test_chat_entries_name_textless_tokens_and_keep_their_empty_bytes() -> None:
    tok = _Tok()
    emitted = TokenLogprob(2, -1.5, top=[(2, -1.5), (0, -4.0)])
    content = chat_logprobs([ENTRY, emitted], tok.decode, tok.token_bytes, names=NAMES)["content"]
    assert [t["token"] for t in content[0]["top_logprobs"]] == [
        "\n",
        "<|im_end|>",
        "ok",
        "token_id:1",
        "<|endoftext|>",
    ]
    assert content[1]["token"] == "<|im_end|>" and content[1]["bytes"] == []
    assert b"".join(bytes(e["bytes"]) for e in content) == b"\n"  # the answer's bytes, as before


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_the_server_names_them_from_the_tokenizers_markers(kind: str) -> None:
    engine = SimpleNamespace(tokenizer=_Tok())
    serving = OpenAIServing(engine, "m", ServerMetrics(lambda: None, lambda: "m"))  # type: ignore[arg-type]
    prepared = Prepared(
        kind=kind,
        request_id="r",
        prompt_ids=[4],
        params=SamplingParams(logprobs=5),
        stream=False,
        include_usage=False,
        created=0,
        logprobs=True,
    )
    out = serving._logprobs(prepared, [ENTRY])
    assert out is not None
    if kind == "chat":
        names = [t["token"] for t in out["content"][0]["top_logprobs"]]
    else:
        names = list(out["top_logprobs"][0])
    assert "<|im_end|>" in names and "<|endoftext|>" in names and "token_id:1" in names


def test_smollm2s_control_tokens_are_named(smollm2_path: Path) -> None:
    """The real GGUF tokenizer: its markers (ids 0..16) are every token without text."""
    from cloud_server.models.tokenizer import GGUFTokenizer

    tok = GGUFTokenizer(smollm2_path)
    names = {i: raw.decode() for i, raw in tok.marker_bytes().items()}
    entry = TokenLogprob(
        198, -0.1, top=[(198, -0.1), (2, -2.0), (0, -9.0)]
    )  # "\n", <|im_end|>, <|endoftext|>
    legacy = text_logprobs([entry], tok.decode, tok.token_bytes, names=names)
    assert legacy["top_logprobs"] == [{"\n": -0.1, "<|im_end|>": -2.0, "<|endoftext|>": -9.0}]


def test_tokenize_names_control_tokens_in_token_strs(smollm2_path: Path) -> None:
    """vLLM's /tokenize gives "<|im_start|>" for a chat's markers; they read "" here before."""
    from cloud_server.api.protocol import TokenizeRequest
    from cloud_server.models.tokenizer import GGUFTokenizer

    engine = SimpleNamespace(tokenizer=GGUFTokenizer(smollm2_path), max_model_len=512)
    serving = OpenAIServing(engine, "m", ServerMetrics(lambda: None, lambda: "m"))  # type: ignore[arg-type]
    req = TokenizeRequest(messages=[{"role": "user", "content": "hi"}], return_token_strs=True)
    strs = serving.tokenize(req)["token_strs"]
    assert strs[0] == "<|im_start|>" and "<|im_end|>" in strs and "" not in strs, strs
    assert "".join(strs).endswith("<|im_start|>assistant\n")


def test_detokenize_writes_control_tokens_by_name(smollm2_path: Path) -> None:
    """vLLM's /detokenize of a templated prompt keeps its turn markers; they were dropped here, so
    /tokenize then /detokenize of a chat did not give its prompt back."""
    from cloud_server.api.protocol import DetokenizeRequest, TokenizeRequest
    from cloud_server.models.tokenizer import GGUFTokenizer

    tok = GGUFTokenizer(smollm2_path)
    engine = SimpleNamespace(tokenizer=tok, max_model_len=512)
    serving = OpenAIServing(engine, "m", ServerMetrics(lambda: None, lambda: "m"))  # type: ignore[arg-type]
    ids = serving.tokenize(TokenizeRequest(messages=[{"role": "user", "content": "héllo 🙂"}]))["tokens"]
    text = serving.detokenize(DetokenizeRequest(tokens=ids))["prompt"]
    assert text.startswith("<|im_start|>") and "héllo 🙂<|im_end|>" in text, text
    assert text.endswith("<|im_start|>assistant\n"), text
    # ordinary ids only: the text as before (a character split across ids decoded whole)
    plain = tok.encode("héllo 🙂", add_special=False)
    assert serving.detokenize(DetokenizeRequest(tokens=plain))["prompt"] == "héllo 🙂"
