"""The hybrid proxy (``hybridllm serve``) still refuses logprobs with a clear 400, while the cloud
server's request models (``cloud_server.api.protocol``) accept them: the device route cannot
always give them, so the proxy keeps the shared models' refusal."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from cloud_server.api.protocol import (  # noqa: E402
    CloudChatCompletionRequest,
    CloudCompletionRequest,
    parse_request,
)
from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire import ChatCompletionRequest, CompletionRequest, WireError  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "param"), [
    ({"logprobs": True}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 3}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
])  # fmt: skip
def test_the_proxy_refuses_logprobs(body, param) -> None:
    edge = FakeBackend(reply=lambda m: "one two three")
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, **body})
    finally:
        llm.close()
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "logprobs are not supported by this server" in err["message"], err
    assert edge.calls == []


def test_shared_models_refuse_and_the_cloud_models_accept() -> None:
    chat = {"model": "m", "messages": MSGS, "logprobs": True, "top_logprobs": 2}
    legacy = {"model": "m", "prompt": "hi", "logprobs": 3}
    for model, body in ((ChatCompletionRequest, chat), (CompletionRequest, legacy)):
        with pytest.raises(WireError) as info:
            parse_request(model, body)
        assert info.value.param == "logprobs" and "not supported" in str(info.value)
    assert parse_request(CloudChatCompletionRequest, chat).num_logprobs() == 2
    assert parse_request(CloudCompletionRequest, legacy).num_logprobs() == 3
    assert parse_request(CloudChatCompletionRequest, {"model": "m", "messages": MSGS}).num_logprobs() is None
