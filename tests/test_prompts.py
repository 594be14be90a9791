"""One prompt module for both sides: the edge backend and the cloud tokenizer render the same text."""

from __future__ import annotations

import pytest

from hybridllm import InvalidRequestError
from hybridllm.prompts import (
    COMPLETION_STOPS,
    PromptFormat,
    default_system_prompt,
    text_of_content,
)

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_content_parts_join_text_and_refuse_the_rest():
    assert text_of_content([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"
    with pytest.raises(InvalidRequestError, match="must be a string"):
        text_of_content([{"type": "text", "text": {}}])
    with pytest.raises(InvalidRequestError, match="image_url"):
        text_of_content([{"type": "image_url", "image_url": {"url": "x"}}])


def test_template_gets_the_default_system_prompt_only_when_none_is_given():
    fmt = PromptFormat(chat_template=TEMPLATE, system_prompt="Be brief.")
    assert fmt.render([{"role": "user", "content": "hi"}]) == "<|system|>Be brief.\n<|user|>hi\n<|assistant|>"
    own = [{"role": "system", "content": "Be long."}, {"role": "user", "content": "hi"}]
    assert "Be brief." not in fmt.render(own) and fmt.stops(own) == ()


def test_base_model_prompts():
    fmt = PromptFormat()
    assert fmt.kind == "completion"
    assert fmt.render([{"role": "user", "content": "The capital of France is"}]) == "The capital of France is"
    convo = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    assert fmt.render(convo) == "User: Hi\nAssistant: Hello\nUser: Bye\nAssistant:"
    assert fmt.stops(convo) == COMPLETION_STOPS


def test_a_broken_template_is_a_request_error():
    fmt = PromptFormat(chat_template="{{ raise_exception('no system role') }}")
    with pytest.raises(InvalidRequestError, match="no system role"):
        fmt.render([{"role": "user", "content": "x"}])


def test_catalog_names_smollm2s_system_prompt():
    assert default_system_prompt("smollm2-135m-instruct")
    assert default_system_prompt("gemma3-270m") is None
    assert default_system_prompt("no-such-model") is None


@pytest.mark.real
@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gemma3-270m"])
def test_edge_and_cloud_render_the_same_prompt(model, request):
    """The cloud tokenizer and the edge backend see one text for one conversation."""
    path = request.getfixturevalue("smollm2_path" if model.startswith("smollm2") else "gemma3_path")
    pytest.importorskip("torch")
    from cloud_server.models.tokenizer import GGUFTokenizer
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    edge = LlamaCppBackend(model, n_ctx=256)
    try:
        cloud = GGUFTokenizer(path)
        cloud.system_prompt = default_system_prompt(model)
        for msgs in (
            [{"role": "user", "content": "The capital of France is"}],
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
            ],
        ):
            assert cloud.apply_chat_template(msgs) == edge.render(msgs)
            assert cloud.stop_strings(msgs) == edge.prompt_format.stops(msgs)
    finally:
        edge.close()
