"""Every policy rule, in order, with the reason each decision carries."""

from __future__ import annotations

import pytest

from hybridllm._exceptions import ConfigError, InvalidRequestError
from hybridllm.router.policy import RoutingPolicy

from .fakes import length_router

SHORT = "What is 2 + 2?"
LONG = "Explain in detail " + "the causes of the French revolution and their consequences " * 6


def policy(**kw):
    return RoutingPolicy(length_router(), **kw)


def test_score_routes_short_to_edge_and_long_to_cloud():
    p = policy()
    short, long = p.decide(SHORT), p.decide(LONG)
    assert short.route == "edge" and short.score is not None and short.score < 0.5
    assert "< threshold" in short.reason
    assert long.route == "cloud" and long.score is not None and long.score >= 0.5
    assert ">= threshold" in long.reason


def test_router_route_matches_threshold():
    r = length_router()
    assert r.route([{"role": "user", "content": SHORT}])[0] == "edge"
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": LONG}]
    assert r.route(msgs)[0] == "cloud"


def test_force():
    p = policy()
    assert p.decide(LONG, force="edge").route == "edge"
    d = p.decide(SHORT, force="cloud")
    assert d.route == "cloud" and d.reason == "forced cloud by the caller" and d.score is None
    with pytest.raises(InvalidRequestError):
        p.decide(SHORT, force="gpu")


def test_keep_on_device_beats_force_and_score():
    p = policy(privacy="keep_on_device")
    d = p.decide(LONG + " my email is a.b@example.com", force="cloud")
    assert d.route == "edge" and d.pii_kinds == ["email"] and "privacy" in d.reason


def test_redact_sends_placeholders_to_the_cloud():
    p = policy(privacy="redact")
    d = p.decide(LONG + " card 4111 1111 1111 1111")
    assert d.route == "cloud" and d.pii_kinds == ["card"]
    assert d.messages_for_cloud[-1]["content"].endswith(" card [CARD_1]")
    assert "4111" not in d.messages_for_cloud[-1]["content"]
    assert d.placeholders == {"[CARD_1]": "4111 1111 1111 1111"}  # kept on the device, to restore
    assert "4111" not in repr(d)


def test_redact_numbers_distinct_values_so_the_cloud_can_tell_them_apart():
    d = policy(privacy="redact").decide(LONG + " Write to ann@example.com and cc bo@example.org.")
    assert d.messages_for_cloud[-1]["content"].endswith("Write to [EMAIL_1] and cc [EMAIL_2].")
    assert d.placeholders == {"[EMAIL_1]": "ann@example.com", "[EMAIL_2]": "bo@example.org"}
    for privacy in ("keep_on_device", "off"):
        assert policy(privacy=privacy).decide(LONG + " ann@example.com").placeholders == {}


def test_privacy_off_ignores_pii():
    d = policy(privacy="off").decide(LONG + " a.b@example.com")
    assert d.route == "cloud" and d.pii_kinds == []
    assert "a.b@example.com" in d.messages_for_cloud[-1]["content"]


def test_the_policy_holds_no_budget_or_availability_rule():
    """The budget ledger and the cloud's reachability are the pipeline's (tests/test_pipeline.py);
    the policy that only a test could exercise with them is gone."""
    import inspect

    assert set(inspect.signature(RoutingPolicy.decide).parameters) == \
        {"self", "messages", "force", "prompt_tokens", "embedding"}
    assert "budget" not in inspect.signature(RoutingPolicy).parameters


def test_long_prompt_goes_to_cloud():
    p = policy(edge_context_tokens=64)
    d = p.decide(SHORT, prompt_tokens=65)
    assert d.route == "cloud" and "exceeds the edge context (64)" in d.reason
    assert p.decide(SHORT, prompt_tokens=64).route == "edge"
    # estimated from the text (the length router alone would send it to the cloud too: the reason
    # says which rule decided)
    estimated = p.decide("word " * 400)
    assert estimated.route == "cloud" and "exceeds the edge context (64)" in estimated.reason
    assert estimated.score is None


def test_cascade_band():
    p = policy(cascade_band=(0.3, 0.7))
    mid = "x" * 100  # score 0.5 (the fake router's pivot)
    d = p.decide(mid)
    assert d.route == "edge" and d.cascade and "edge first" in d.reason
    assert not p.decide(LONG).cascade


def test_should_escalate_uses_the_calibrated_threshold():
    r = length_router()
    r.logprob_threshold = -0.8
    p = RoutingPolicy(r)
    assert p.should_escalate(-1.2) and not p.should_escalate(-0.3)
    assert p.should_escalate(float("nan"))


@pytest.mark.parametrize(
    "kw",
    [{"privacy": "maybe"}, {"edge_context_tokens": 0}, {"cascade_band": (0.6, 0.4)}],
)
def test_bad_settings(kw):
    with pytest.raises(ConfigError):
        RoutingPolicy(length_router(), **kw)


def test_bad_messages():
    with pytest.raises(InvalidRequestError):
        policy().decide([])


def test_pii_in_an_earlier_or_system_turn_keeps_the_prompt_on_the_device():
    msgs = [{"role": "system", "content": "Customer: AB 12 34 56 C"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": LONG}]
    d = policy().decide(msgs, force="cloud")
    assert d.route == "edge" and d.pii_kinds == ["national_id"] and "kept on device" in d.reason


def test_redact_sends_no_detected_value_in_any_turn_and_says_so():
    msgs = [{"role": "system", "content": "Support for jane@example.com"},
            {"role": "user", "content": "my card is 4111 1111"},
            {"role": "user", "content": "1111 1111. " + LONG}]
    d = policy(privacy="redact").decide(msgs)
    assert d.route == "cloud" and d.pii_kinds == ["card", "email"]
    assert "card, email redacted for the cloud" in d.reason
    sent = " ".join(m["content"] for m in d.messages_for_cloud)
    assert "jane@example.com" not in sent and "4111" not in sent and "1111" not in sent
    assert [m["content"] for m in msgs][0] == "Support for jane@example.com"  # the caller's copy
    edge = policy(privacy="redact").decide("card 4111 1111 1111 1111?")
    assert edge.route == "edge" and "redacted" not in edge.reason


def test_the_readme_router_example_uses_real_parameters():
    """The Router section's example builds a policy and a client with parameters that exist."""
    import ast
    import re
    from pathlib import Path

    from hybridllm._config import HybridLLMConfig

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Router"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    import inspect

    accepted = {
        "RoutingPolicy": set(inspect.signature(RoutingPolicy).parameters),
        "HybridLLM": set(HybridLLMConfig.__dataclass_fields__) | {"edge", "cloud", "cache", "policy"},
    }
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id in accepted]
    assert {c.func.id for c in calls} == set(accepted)
    for call in calls:
        for kw in call.keywords:
            assert kw.arg in accepted[call.func.id], (call.func.id, kw.arg)
