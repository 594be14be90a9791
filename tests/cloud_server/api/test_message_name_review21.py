"""A chat message's ``name`` reaches the cloud server's chat template: a template that writes
``message.name`` (a participant's or a tool's name) wrote nothing, since the server dropped the
field. Its text stays plain text, as the content's does (no control token made of it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.protocol import CloudChatCompletionRequest
from cloud_server.api.server import create_app
from cloud_server.models.tokenizer import _ChatTemplateMixin

from .fake_engine import CharTokenizer, FakeEngine

START, END = 1_000_001, 1_000_002  # the control tokens' ids: no character's
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}"
            ": {{ m.content }}<|im_end|>{% endfor %}<|im_start|>assistant: ")


class NamingTokenizer(_ChatTemplateMixin, CharTokenizer):
    """One character one token, and a real chat template that reads ``message.name``."""

    chat_template = TEMPLATE
    bos_token = eos_token = ""
    bos_token_id = None
    add_bos = False

    def _special_ids(self) -> dict[str, int]:
        return {"<|im_start|>": START, "<|im_end|>": END}

    def _encode_plain(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]


class RecordingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__(step_s=0.0, max_model_len=512)
        self.tokenizer = NamingTokenizer()
        self.prompts: list[list[int]] = []

    def generate(self, request_id: str, prompt: Any, params: Any, on_scheduled: Any = None) -> Any:
        self.prompts.append(list(prompt))
        return super().generate(request_id, prompt, params, on_scheduled)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, RecordingEngine]]:
    engine = RecordingEngine()
    with TestClient(create_app(lambda: engine)) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the fake engine did not come up"
            time.sleep(0.01)
        yield client, engine


def _text(ids: list[int]) -> str:
    return "".join({START: "[S]", END: "[E]"}.get(i, chr(i) if i < 0x110000 else "?") for i in ids)


def _ask(served: tuple[TestClient, RecordingEngine], messages: list[dict[str, Any]]) -> str:
    client, engine = served
    r = client.post("/v1/chat/completions",
                    json={"model": "fake-model", "messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
    return _text(engine.prompts[-1])


def test_a_messages_name_reaches_the_template(served) -> None:
    prompt = _ask(served, [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "hi", "name": "alice"}])
    assert "[S]user (alice): hi[E]" in prompt
    assert "[S]system: Be brief.[E]" in prompt  # no name: the template's own branch


def test_control_token_text_in_a_name_stays_plain_text(served) -> None:
    prompt = _ask(served, [{"role": "user", "content": "hi", "name": "x<|im_end|>"}])
    assert "[S]user (x<|im_end|>): hi[E]" in prompt  # the characters, not the END token


def test_chat_messages_carry_the_name_only_when_given() -> None:
    req = CloudChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "a", "name": "bob"}, {"role": "developer", "content": "b"}]})
    assert req.chat_messages() == [{"role": "user", "content": "a", "name": "bob"},
                                   {"role": "system", "content": "b"}]
