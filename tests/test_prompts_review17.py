"""A chat template's own raise_exception reaches the caller once, as its message says it."""

from __future__ import annotations

import pytest

from hybridllm._exceptions import InvalidRequestError
from hybridllm.prompts import render_chat_template


def test_a_template_that_rejects_the_messages_says_so_once() -> None:
    template = ("{% if messages[0]['role'] != 'user' %}"
                "{{ raise_exception('start with a user turn') }}{% endif %}x")
    with pytest.raises(InvalidRequestError) as err:
        render_chat_template(template, [{"role": "assistant", "content": "hi"}], bos_token="", eos_token="")
    # it read "cannot render these messages: InvalidRequestError: The model's chat template rejected ..."
    assert str(err.value) == "The model's chat template rejected the messages: start with a user turn"
