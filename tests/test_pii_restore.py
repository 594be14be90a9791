"""privacy="redact" through the pipeline, on fakes (fast): the cloud sees numbered placeholders, one
per distinct value, and the user sees the values again, whole answers and streams alike. The same
with the real edge model and a real cloud server is in e2e/test_pii_restore_real.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hybridllm import AsyncHybridLLM, CloudUnavailableError, HybridLLM
from hybridllm._types import last_user_text
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend
from hybridllm.router import RoutingPolicy
from tests._open_clients import close_clients_left_open  # noqa: F401 - an autouse fixture

PROMPT = "Write to jane.doe@example.com and cc bob@example.org about the invoice."


class HardRouter:
    """Every prompt is hard: the router's part of the policy sends it to the cloud."""

    threshold = 0.5

    def score_text(self, text, *, embedding=None):
        return 0.9

    def should_escalate(self, mean_logprob):
        return True


class EchoCloud(FakeBackend):
    """Echoes what it received, or streams ``pieces`` exactly as given (chunk boundaries included)."""

    def __init__(self, pieces=None):
        super().__init__(model="cloud-model", reply=lambda m: f"you said: {last_user_text(m)}")
        self.pieces = pieces

    def stream(self, messages, params):
        if self.pieces is None:
            yield from super().stream(messages, params)
            return
        self.calls.append(messages)
        for p in self.pieces:
            yield Delta(p)
        yield Delta("", finish_reason="stop")


class StoringCache:
    """An exact-match cache that stores private prompts too (``store_pii=True``)."""

    def __init__(self):
        self.entries = {}

    def embed_query(self, msgs):
        return None

    def get(self, msgs, *, model, params_key, namespace=None, embedding=None):
        text = self.entries.get(repr(msgs))
        return None if text is None else type("Hit", (), {"text": text, "similarity": 1.0,
                                                          "verifier_prob": None, "metadata": {}})()

    def put(self, msgs, text, *, model, params_key, namespace=None, pii=False, metadata=None,
            embedding=None):
        self.entries[repr(msgs)] = text
        return "id"

    def close(self):
        pass


def make(cloud=None, cache=False):
    cloud = cloud or EchoCloud()
    policy = RoutingPolicy(HardRouter(), privacy="redact")
    llm = HybridLLM(edge=FakeBackend(model="edge-model", reply=lambda m: "edge answer"), cloud=cloud,
                    policy=policy, cache=cache)
    return llm, cloud


def sent_to_cloud(cloud) -> str:
    return " ".join(str(m["content"]) for m in cloud.calls[-1])


def test_two_addresses_stay_distinct_for_the_cloud_and_the_answer_is_restored():
    llm, cloud = make()
    c = llm.chat(PROMPT)
    sent = sent_to_cloud(cloud)
    assert sent == "Write to [EMAIL_1] and cc [EMAIL_2] about the invoice."
    assert c.route == "cloud" and "email redacted for the cloud" in c.reason
    assert c.text == f"you said: {PROMPT}"


def test_the_same_value_gets_the_same_placeholder_in_every_turn():
    llm, cloud = make()
    msgs = [
        {"role": "system", "content": "The user is jane.doe@example.com, phone 415-555-2671."},
        {"role": "user", "content": "Remind JANE.DOE@example.com to call 415 555 2671 and bob@example.org."},
    ]
    llm.chat(msgs)
    assert [m["content"] for m in cloud.calls[-1]] == [
        "The user is [EMAIL_1], phone [PHONE_1].",
        "Remind [EMAIL_1] to call [PHONE_1] and [EMAIL_2].",
    ]


def test_placeholders_in_any_case_and_bare_are_restored():
    cloud = EchoCloud(pieces=["Sent to [email_2]; EMAIL_1 is cc. ", "[EMAIL_3] and EMAIL_12 are not ours."])
    llm, _ = make(cloud)
    assert llm.chat(PROMPT).text == (
        "Sent to bob@example.org; jane.doe@example.com is cc. [EMAIL_3] and EMAIL_12 are not ours."
    )


@pytest.mark.parametrize("cut", range(1, len("[EMAIL_2]")))
def test_a_placeholder_split_across_stream_chunks_is_restored(cut):
    answer = "Mail [EMAIL_2] now"
    at = answer.index("[EMAIL_2]") + cut
    llm, _ = make(EchoCloud(pieces=[answer[:at], answer[at:]]))
    stream = llm.stream(PROMPT)
    chunks = [ch.text for ch in stream]
    assert "".join(chunks) == "Mail bob@example.org now"
    assert not any("[" in ch or "EMAIL" in ch for ch in chunks)
    assert stream.completion is not None and stream.completion.text == "Mail bob@example.org now"


def test_a_held_back_tail_is_flushed_at_the_end_of_the_stream():
    # a bare name at the very end may yet grow (EMAIL_1 -> EMAIL_12): held until the stream ends
    llm, _ = make(EchoCloud(pieces=["Reply to EMAIL", "_1"]))
    chunks = [ch.text for ch in llm.stream(PROMPT) if ch.text]
    assert chunks == ["Reply to ", "jane.doe@example.com"]
    # a possible start that is not one is shown as written
    llm, _ = make(EchoCloud(pieces=["costs [EMA", "X] and E"]))
    assert llm.chat(PROMPT).text == "costs [EMAX] and E"


def test_the_async_client_restores_streams_too():
    async def run():
        policy = RoutingPolicy(HardRouter(), privacy="redact")
        cloud = EchoCloud(pieces=["to [EMA", "IL_1] and [E", "MAIL_2]"])
        async with AsyncHybridLLM(edge=FakeBackend(), cloud=cloud, policy=policy, cache=False) as llm:
            return "".join([ch.text async for ch in llm.stream(PROMPT)])

    assert asyncio.run(run()) == "to jane.doe@example.com and bob@example.org"


def test_a_placeholder_looking_string_the_user_wrote_is_not_taken_for_one():
    prompt = "My template says [EMAIL_1] and email_2; fill in ann@example.com and cy@example.com."
    llm, cloud = make()
    c = llm.chat(prompt)
    sent = sent_to_cloud(cloud)
    # the user's own [EMAIL_1] and email_2 reach the cloud as written; the values get other numbers
    assert sent == "My template says [EMAIL_1] and email_2; fill in [EMAIL_3] and [EMAIL_4]."
    assert c.text == f"you said: {prompt}"


def test_the_map_never_reaches_the_cloud_nor_the_logs(caplog):
    llm, cloud = make()
    decision = llm._core.policy.decide([{"role": "user", "content": PROMPT}])
    assert decision.placeholders == {"[EMAIL_1]": "jane.doe@example.com", "[EMAIL_2]": "bob@example.org"}
    assert "example.com" not in repr(decision) and "placeholders" not in repr(decision)
    with caplog.at_level(logging.DEBUG):
        c = llm.chat(PROMPT)
    request = repr(cloud.calls)
    assert "jane.doe" not in request and "bob@" not in request and "example" not in request
    assert "jane.doe" not in caplog.text and "jane.doe" not in c.reason


def test_the_cache_stores_the_restored_answer_and_replays_it():
    cache = StoringCache()
    llm, cloud = make(cache=cache)
    first = llm.chat(PROMPT)
    assert first.route == "cloud" and list(cache.entries.values()) == [f"you said: {PROMPT}"]
    again = llm.chat(PROMPT)
    assert again.route == "cache" and again.text == first.text and len(cloud.calls) == 1


def test_a_cloud_stream_breaking_mid_placeholder_never_shows_half_of_it():
    class Breaking(EchoCloud):
        def stream(self, messages, params):
            self.calls.append(messages)
            yield Delta("Write to [EMA")
            raise CloudUnavailableError("connection reset")

    edge = FakeBackend(model="edge-model", reply=lambda m: "and more")
    llm = HybridLLM(edge=edge, cloud=Breaking(), policy=RoutingPolicy(HardRouter(), privacy="redact"),
                    cache=False)
    c = llm.chat(PROMPT)
    # half a placeholder is dropped: the device writes on from the text shown
    assert c.route == "cloud->edge" and c.text.split() == ["Write", "to", "and", "more"]
    assert edge.continued == ["Write to "]


def test_keep_on_device_and_off_carry_no_map():
    for privacy in ("keep_on_device", "off"):
        d = RoutingPolicy(HardRouter(), privacy=privacy).decide(PROMPT)
        assert d.placeholders == {}


def test_the_proxy_restores_json_and_stream():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    llm, cloud = make(EchoCloud(pieces=["cc [EMAIL", "_2] please"]))
    body = {"model": "x", "messages": [{"role": "user", "content": PROMPT}]}
    with TestClient(create_app(llm)) as http:
        r = http.post("/v1/chat/completions", json=body)
        assert r.json()["choices"][0]["message"]["content"] == "cc bob@example.org please"
        s = http.post("/v1/chat/completions", json={**body, "stream": True})
        assert "bob@example.org" in s.text and "EMAIL" not in s.text
    llm.close()
    assert all("bob@" not in repr(call) for call in cloud.calls)
