"""The reason a user reads says what happened and what to do. Before: with privacy="redact", a
request the device answered after all (the budget spent, the cloud down, a cascade whose device
answer was kept) still said "email redacted for the cloud", although nothing went to any cloud;
and a prompt kept on the device by privacy did not say how to let the cloud answer it, nor that it
overrode the caller's route="cloud"."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import HybridLLM
from hybridllm.backends.fake import FakeBackend
from hybridllm.router.policy import RoutingPolicy

from .fakes import length_router

PROMPT = "Please write a long and polite reply to jane@corp.io about the delayed invoice"


def _policy(**kw) -> RoutingPolicy:
    # the prompt is past the pivot: the router sends it to the cloud (score 0.99)
    return RoutingPolicy(length_router(0.5, pivot_chars=20), privacy="redact", **kw)


class _Down(FakeBackend):
    def is_available(self) -> bool:
        return False


def test_a_redacted_request_the_budget_keeps_on_the_device_claims_no_redaction():
    cloud = FakeBackend(model="cloud-model", reply=lambda m: "from the cloud")
    with HybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud, policy=_policy(), cache=False,
                   max_cloud_calls_per_hour=0) as llm:
        c = llm.chat(PROMPT)
    assert c.route == "edge" and not cloud.calls
    assert "budget spent: 0/0 cloud calls this hour" in c.reason
    assert "redacted" not in c.reason, c.reason


def test_a_redacted_request_the_device_answers_for_a_cloud_that_is_down_claims_no_redaction():
    cloud = _Down(model="cloud-model")
    with HybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud, policy=_policy(), cache=False) as llm:
        c = llm.chat(PROMPT)
    assert c.route == "edge (cloud unavailable)" and not cloud.calls
    assert "cloud unavailable" in c.reason and "redacted" not in c.reason, c.reason


@pytest.mark.parametrize(("logprob", "route", "redacted"), [
    (-0.05, "edge", False),  # the device was confident: its answer is kept, nothing is sent
    (-5.0, "edge->cloud", True),  # unsure: escalated, and the cloud is sent placeholders
])
def test_a_cascade_says_redacted_only_when_it_escalates(logprob, route, redacted):
    edge = FakeBackend(model="edge-model", logprob=logprob)
    cloud = FakeBackend(model="cloud-model", reply=lambda m: "from the cloud")
    policy = _policy(cascade_band=(0.0, 0.9999))
    with HybridLLM(edge=edge, cloud=cloud, policy=policy, cache=False) as llm:
        c = llm.chat(PROMPT)
    assert c.route == route
    assert ("email redacted for the cloud" in c.reason) is redacted, c.reason
    if redacted:
        assert "jane@corp.io" not in json.dumps(cloud.calls, default=str)


def test_kept_on_device_names_the_setting_that_sends_it_and_the_route_it_overrode():
    policy = RoutingPolicy(length_router(), privacy="keep_on_device")
    d = policy.decide("mail jane@corp.io")
    assert d.route == "edge" and "kept on device" in d.reason and "privacy='redact'" in d.reason
    assert "route='cloud'" not in d.reason
    forced = policy.decide("mail jane@corp.io", force="cloud")
    assert forced.route == "edge" and "kept on device over route='cloud'" in forced.reason


# -- over real HTTP: a loopback OpenAI-like cloud that records what it was sent ---------------------


class _Cloud(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.bodies: list[bytes] = []
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        cloud: _Cloud = self.server  # type: ignore[assignment]
        cloud.bodies.append(self.rfile.read(int(self.headers.get("content-length") or 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        events = [{"choices": [{"index": 0, "delta": {"content": cloud.answer}, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38}}]
        for event in [*map(json.dumps, events), "[DONE]"]:
            self.wfile.write(f"data: {event}\n\n".encode())
        self.wfile.flush()


@pytest.fixture
def cloud():
    server = _Cloud("Done: [IP_ADDRESS_1] is blocked.")
    yield server
    server.shutdown()
    server.server_close()


def test_over_http_the_cloud_never_sees_the_ip_address_and_the_reasons_say_what_happened(cloud):
    prompt = "Write a firewall rule that blocks the address 81.2.69.160 on every port, please"
    with HybridLLM(edge=FakeBackend(model="edge-model"), cloud_url=cloud.url, policy=_policy(),
                   cloud_model="gpt-4o", cache=False, cloud_max_retries=0, max_cloud_calls_per_hour=1) as llm:
        sent = llm.chat(prompt)
        kept = llm.chat(prompt)  # the hour's one call is spent
    assert sent.route == "cloud" and sent.text == "Done: 81.2.69.160 is blocked."
    assert "ip_address redacted for the cloud" in sent.reason
    assert len(cloud.bodies) == 1 and b"81.2.69.160" not in cloud.bodies[0]
    assert b"[IP_ADDRESS_1]" in cloud.bodies[0]
    assert kept.route == "edge" and "budget spent: 1/1 cloud calls this hour" in kept.reason
    assert "redacted" not in kept.reason, kept.reason
