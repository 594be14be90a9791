"""Review 13: the routing policy's inputs at their edges (a malformed cascade band, a prompt
length that is not a count) and its lazily loaded router under concurrent first calls."""

from __future__ import annotations

import math
import threading
import time

import pytest

from hybridllm._exceptions import ConfigError, InvalidRequestError
from hybridllm.router import policy as policy_module
from hybridllm.router.policy import RoutingPolicy

from .fakes import length_router


@pytest.mark.parametrize("band", [(0.2,), [0.2], 0.5, ("a", "b"), (None, 0.5), (0.1, 0.5, 0.9),
                                  (math.nan, 0.5), (True, 0.5)])
def test_a_malformed_cascade_band_is_a_config_error(band: object) -> None:
    # a one-item list or a scalar raised "not enough values to unpack" / "cannot unpack", strings
    # a TypeError from "<=": tracebacks that do not say which setting is wrong
    with pytest.raises(ConfigError, match="cascade_band must be"):
        RoutingPolicy(length_router(), cascade_band=band)  # type: ignore[arg-type]


def test_a_cascade_band_as_a_list_still_works() -> None:
    p = RoutingPolicy(length_router(), cascade_band=[0.0, 1.0])  # type: ignore[arg-type]
    assert p.decide("What is 2 + 2?").cascade


@pytest.mark.parametrize("tokens", [math.nan, -1, "5", True, math.inf])
def test_a_prompt_length_that_is_not_a_count_is_refused(tokens: object) -> None:
    # NaN skipped the context check (NaN > 2048 is False) and routed by the score; "5" raised a
    # TypeError from ">"; -1 and True passed as lengths
    p = RoutingPolicy(length_router())
    with pytest.raises(InvalidRequestError, match="prompt_tokens must be"):
        p.decide("What is 2 + 2?", prompt_tokens=tokens)  # type: ignore[arg-type]


def test_a_whole_prompt_length_still_routes() -> None:
    p = RoutingPolicy(length_router(), edge_context_tokens=64)
    assert p.decide("hi", prompt_tokens=64).route == "edge"
    assert p.decide("hi", prompt_tokens=65.0).route == "cloud"  # a float count from a backend


def test_concurrent_first_decisions_load_the_router_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the pipeline calls decide() from executor threads: each of the first concurrent requests saw
    # no router yet and loaded its own copy
    loads = []

    def slow_load():
        loads.append(1)
        time.sleep(0.05)
        return length_router()

    monkeypatch.setattr(policy_module, "load_router", slow_load)
    p = RoutingPolicy()
    start = threading.Barrier(8)
    errors = []

    def go():
        start.wait()
        try:
            p.decide("What is 2 + 2?")
        except Exception as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(loads) == 1


def test_a_bad_prompt_length_is_refused_on_every_route() -> None:
    # checked with the other arguments, not only where the context check reads it
    p = RoutingPolicy(length_router())
    for kw in ({"force": "cloud"}, {"force": "edge"}):
        with pytest.raises(InvalidRequestError, match="prompt_tokens must be"):
            p.decide("What is 2 + 2?", prompt_tokens=math.nan, **kw)
    with pytest.raises(InvalidRequestError, match="prompt_tokens must be"):
        p.decide("mail jane@example.com", prompt_tokens=-3)
