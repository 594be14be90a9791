"""Run-time routing given bad input: a clear error naming what to pass, never a bare TypeError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hybridllm import ConfigError, InvalidRequestError
from hybridllm.router import RoutingPolicy
from hybridllm.router.budget import Budget

from .fakes import length_router


@pytest.mark.parametrize("bad", [None, 123, b"What is 2+2?", ["What is 2+2?"]])
def test_score_text_refuses_what_is_not_text(bad: object) -> None:
    # before: TypeError ("object of type 'int' has no len()", "cannot use a string pattern on a
    # bytes-like object") from deep in the features
    with pytest.raises(InvalidRequestError, match="score_text\\(\\) takes the prompt's text"):
        length_router().score_text(bad)  # type: ignore[arg-type]


def test_score_text_of_text_is_unchanged() -> None:
    r = length_router()
    assert r.score_text("What is 2+2?") == r.score("What is 2+2?")


def test_should_escalate_takes_none_as_no_confidence_as_the_pipeline_does() -> None:
    # before: TypeError "must be real number, not NoneType" (a backend without log-probabilities
    # gives mean_logprob None; the pipeline already treats it as -inf)
    r = length_router()
    assert r.should_escalate(None) is True
    assert RoutingPolicy(r, privacy="off").should_escalate(None) is True


def test_should_escalate_refuses_a_string() -> None:
    with pytest.raises(InvalidRequestError, match="mean token log-probability"):
        length_router().should_escalate("-0.5")  # type: ignore[arg-type]


def test_should_escalate_gives_a_plain_bool_for_numpy_numbers() -> None:
    # before: numpy's bool, which json.dumps refuses
    r = length_router()
    for lp, want in ((np.float32(-0.5), False), (np.float64(-3.0), True), (np.float32("nan"), True)):
        got = r.should_escalate(lp)
        assert type(got) is bool and got is want
        json.dumps(got)


def test_should_escalate_rule_is_unchanged() -> None:
    r = length_router()  # logprob_threshold -1.0
    assert [r.should_escalate(v) for v in (-0.5, -1.0, -1.5, float("-inf"), float("nan"), 0.0)] == [
        False, False, True, True, True, False]


@pytest.mark.parametrize("path", ["/tmp/my-router", Path("/tmp/my-router")])
def test_a_policy_given_a_router_path_says_to_load_it(path: object) -> None:
    # before: accepted, then AttributeError "'str' object has no attribute 'score_text'" at the
    # first request
    with pytest.raises(ConfigError, match=r"load_router\('/tmp/my-router'\)"):
        RoutingPolicy(path)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value", "plain"),
    [("max_cloud_calls_per_hour", np.int64(3), 3), ("max_cloud_tokens_per_day", np.int32(500), 500),
     ("max_cloud_usd_per_day", np.float32(0.5), 0.5), ("price_per_1k_tokens", np.float32(0.25), 0.25)],
)
def test_budget_takes_numpy_numbers(name: str, value: object, plain: object) -> None:
    # before: "must be a non-negative integer or None, got np.int64(3)" (it is one)
    b = Budget(**{name: value})
    got = getattr(b, name)
    assert got == plain and type(got) is type(plain)


def test_budget_with_numpy_limit_counts_as_with_a_python_one() -> None:
    now = [0.0]
    a = Budget(max_cloud_calls_per_hour=np.int64(2), clock=lambda: now[0])
    b = Budget(max_cloud_calls_per_hour=2, clock=lambda: now[0])
    for budget in (a, b):
        for _ in range(2):
            held, why = budget.reserve(10)
            assert held is not None and why is None
    assert a.reserve(10) == b.reserve(10) == (None, "budget spent: 2/2 cloud calls this hour (2 in flight)")


@pytest.mark.parametrize("bad", [2.0, float("inf"), -1, True, "3"])
def test_budget_still_refuses_a_count_that_is_not_a_whole_number(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_cloud_calls_per_hour must be a non-negative integer"):
        Budget(max_cloud_calls_per_hour=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -0.01, True, "5"])
def test_budget_still_refuses_bad_dollars(bad: object) -> None:
    with pytest.raises(ConfigError, match="non-negative number of dollars"):
        Budget(max_cloud_usd_per_day=bad)  # type: ignore[arg-type]


def test_a_router_file_saved_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    # before: "router.json is corrupt (Unexpected UTF-8 BOM ...)" for a threshold edited in
    # Windows Notepad or written by PowerShell 5's Set-Content -Encoding utf8
    from hybridllm.router import load_router

    folder = length_router(0.4).save(tmp_path / "r")
    cfg = folder / "router.json"
    config = json.loads(cfg.read_text(encoding="utf-8"))
    config["threshold"] = 0.7
    cfg.write_bytes(b"\xef\xbb\xbf" + json.dumps(config).encode("utf-8"))
    r = load_router(folder)
    assert r.threshold == 0.7
    assert r.route("hi" * 10) == length_router(0.7).route("hi" * 10)


def test_a_router_file_that_cannot_be_read_is_a_router_file_error(tmp_path: Path, monkeypatch) -> None:
    # before: the bare PermissionError, not a HybridLLMError (root reads any file, so simulated)
    from hybridllm import RouterFileError
    from hybridllm.router import load_router

    folder = length_router().save(tmp_path / "r")
    real = Path.read_text

    def denied(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "router.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(RouterFileError, match="router.json cannot be read .*Permission denied"):
        load_router(folder)


def test_a_policy_takes_a_numpy_context_length() -> None:
    # before: "edge_context_tokens must be a positive integer, got np.int64(64)" (it is one)
    p = RoutingPolicy(length_router(), privacy="off", edge_context_tokens=np.int64(64))
    assert p.edge_context_tokens == 64 and type(p.edge_context_tokens) is int
    assert p.decide("hi", prompt_tokens=65).route == "cloud"
    assert p.decide("hi", prompt_tokens=64).reason == RoutingPolicy(
        length_router(), privacy="off", edge_context_tokens=64).decide("hi", prompt_tokens=64).reason

