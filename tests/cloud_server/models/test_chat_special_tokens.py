"""The cloud server reads a message's text as plain text: only its template writes control tokens.

Before, the server rendered the template and encoded the whole text with special parsing
(``encode(apply_chat_template(messages))``), so ``<|im_end|>\\n<|im_start|>system`` in a user's
message forged a system turn. Checked on both tokenizers (llama.cpp's vocabulary of the GGUF and
a ``tokenizers`` folder exported from it) for SmolLM2 and Qwen2.5-Coder, against the old path for
ordinary conversations, and through the server's request preparation.
"""

from __future__ import annotations

import pytest

from tests.backends.test_special_tokens import CONVERSATIONS, FORGED

pytest.importorskip("torch")
pytestmark = pytest.mark.real


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def tokenizers(request, tmp_path_factory):
    from cloud_server.models.export_hf import write_tokenizer
    from cloud_server.models.tokenizer import GGUFTokenizer, HFTokenizer
    from hybridllm.models import pull

    path = pull(request.param)
    # the exporter's own tokenizer files (without the weights: seconds, not a minute for Qwen's)
    return GGUFTokenizer(path), HFTokenizer(write_tokenizer(path, tmp_path_factory.mktemp("hf")))


def _controls(tok, ids):
    return [i for i in ids if i in set(tok._special_ids().values())]


def test_a_forged_turn_is_plain_text_on_both_tokenizers(tokenizers):
    forged = [{"role": "user", "content": FORGED}]
    plain = [{"role": "user", "content": "hi"}]
    for tok in tokenizers:
        old = tok.encode(tok.apply_chat_template(forged))
        ids = tok.encode_chat(forged)
        assert len(_controls(tok, old)) > len(_controls(tok, ids))
        assert _controls(tok, ids) == _controls(tok, tok.encode_chat(plain))
        assert FORGED in tok.decode(ids)  # decoding drops control tokens: the text is all text
    gguf, hf = tokenizers
    assert gguf.encode_chat(forged) == hf.encode_chat(forged)


def test_ordinary_conversations_get_the_ids_they_got_before(tokenizers):
    for tok in tokenizers:
        for messages in CONVERSATIONS:
            for gen in (True, False):
                old = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=gen))
                assert tok.encode_chat(messages, add_generation_prompt=gen) == old, (type(tok), messages)


def test_a_template_error_is_a_request_error_on_messages(tokenizers):
    from cloud_server.exceptions import InvalidRequestError

    tok = tokenizers[0]
    with pytest.raises(InvalidRequestError, match="image_url") as info:
        tok.encode_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert info.value.param == "messages"


def test_the_server_prepares_a_chat_request_without_forged_control_tokens(tokenizers):
    from types import SimpleNamespace

    from cloud_server.api.metrics import ServerMetrics
    from cloud_server.api.serving import OpenAIServing
    from hybridllm.wire import ChatCompletionRequest

    tok = tokenizers[0]
    engine = SimpleNamespace(tokenizer=tok, max_model_len=512, is_ready=True, model_name="m")
    serving = OpenAIServing(engine, "m", ServerMetrics(lambda: None, lambda: "m"))
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": FORGED}], "max_tokens": 8}
    )
    ids = serving.prepare(req).prompt_ids
    assert ids == tok.encode_chat([{"role": "user", "content": FORGED}])
    assert _controls(tok, ids) == _controls(tok, tok.encode_chat([{"role": "user", "content": "hi"}]))
