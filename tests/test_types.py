import pytest

from hybridllm import GenerationParams, InvalidRequestError
from hybridllm._types import normalize_messages


@pytest.mark.parametrize("kwargs, word", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": "x"}, "seed"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
def test_invalid_params_raise_with_the_parameter_named(kwargs, word):
    with pytest.raises(InvalidRequestError, match=word):
        GenerationParams(**kwargs)


def test_unknown_parameter_is_named():
    with pytest.raises(InvalidRequestError, match="max_tokenz"):
        GenerationParams.from_kwargs(max_tokenz=3)


def test_stop_string_becomes_tuple():
    assert GenerationParams(stop="x").stop == ("x",)


@pytest.mark.parametrize("messages", [[], "", "   ", [{"role": "robot", "content": "x"}],
                                      [{"role": "user"}], ["hello"],
                                      [{"role": "system", "content": "only a system turn"}]])
def test_bad_messages_raise(messages):
    with pytest.raises(InvalidRequestError):
        normalize_messages(messages)


def test_messages_normalized():
    assert normalize_messages("hi") == [{"role": "user", "content": "hi"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert normalize_messages(parts)[0]["content"] == "a\nb"  # as vLLM joins text parts
    assert normalize_messages([{"role": "developer", "content": "s"},
                               {"role": "user", "content": "u"}])[0]["role"] == "system"


def test_half_an_emoji_is_refused_as_the_servers_refuse_it():
    """A lone surrogate (JSON's "\\ud83d" without its pair) cannot be encoded for the tokenizers or
    llama.cpp: the request gets an InvalidRequestError naming where, not a UnicodeEncodeError."""
    from hybridllm._exceptions import InvalidRequestError
    from hybridllm._types import normalize_messages

    with pytest.raises(InvalidRequestError, match="The prompt holds a lone UTF-16 surrogate"):
        normalize_messages("hi \ud83d")
    parts = [{"role": "user", "content": [{"type": "text", "text": "x \udc00"}]}]
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]\['content'\]\[0\]\['text'\] holds a lone"):
        normalize_messages(parts)
    assert normalize_messages("hi \U0001f600")[0]["content"] == "hi \U0001f600"  # a whole emoji is fine
