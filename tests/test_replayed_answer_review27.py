"""An answer message sent back as the official openai client sends it is a valid turn.

Before: ``messages.append(completion.choices[0].message.model_dump())`` (the usual way to keep a
conversation going) was a 400 "Unrecognized request argument supplied: messages[1].annotations"
from both servers, and so was OpenAI's own answer replayed here (``annotations: []``,
``audio: null``, ``function_call: null`` are fields of every answer message), so a conversation
could not move from OpenAI's cloud to ours. Only an assistant turn may carry them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
import openai  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app as create_proxy  # noqa: E402

# an answer of OpenAI's API, as `ChatCompletionMessage.model_dump()` gives it back
OPENAI_ANSWER = {
    "role": "assistant", "content": "Paris is the capital.", "refusal": None,
    "annotations": [{"type": "url_citation", "url_citation": {
        "url": "https://example.org", "title": "x", "start_index": 0, "end_index": 5}}],
    "audio": None, "function_call": None, "tool_calls": None,
}


def _turns(answer: dict) -> list[dict]:
    return [{"role": "user", "content": "Capital of France?"}, answer,
            {"role": "user", "content": "And of Spain?"}]


def test_the_cloud_server_takes_its_own_and_openais_answers_back():
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine
    from tests.cloud_server.api.helpers import ThreadServer

    server = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        first = client.chat.completions.create(model="fake-model", max_tokens=4,
                                               messages=[{"role": "user", "content": "hi"}])
        own = first.choices[0].message.model_dump()
        assert {"annotations", "audio", "function_call"} <= own.keys()
        for answer in (own, OPENAI_ANSWER, {**OPENAI_ANSWER, "audio": {"id": "audio_1"},
                                            "function_call": {"name": "f", "arguments": "{}"}}):
            again = client.chat.completions.create(model="fake-model", max_tokens=4, messages=_turns(answer))
            assert again.choices[0].finish_reason == "length"
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="fake-model", max_tokens=4, messages=[
                {"role": "user", "content": "hi", "annotations": []}])
        assert "messages[0]" in str(bad.value) and "annotations" in str(bad.value)
    finally:
        server.stop()


def test_hybridllm_serve_reads_the_replayed_answer_as_the_assistant_turn():
    edge = FakeBackend(model="tiny-edge", reply=lambda m: "Madrid.")
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_proxy(llm)) as http:
            ok = http.post("/v1/chat/completions", json={"model": "x", "messages": _turns(OPENAI_ANSWER)})
            wrong = http.post("/v1/chat/completions", json={"model": "x", "messages": [
                {"role": "system", "content": "be brief", "function_call": None},
                {"role": "user", "content": "hi"}]})
    finally:
        llm.close()
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"] == "Madrid."
    assert [m["content"] for m in edge.calls[0] if m["role"] == "assistant"] == ["Paris is the capital."]
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "messages[0]", wrong.text
