"""The queued-tokens policy refuses a bad target when it is made, naming it and the value (no Ray).

Before: ``QueuedTokensPolicy(0.5)`` truncated the target to 0 and ``QueuedTokensPolicy(0)`` was
taken; each failed later, on every autoscaling tick in Serve's controller, with a message that gave
neither the option nor the value, and the fleet never scaled."""

from __future__ import annotations

import math

import pytest

from cloud_server.cluster.autoscale import QueuedTokensPolicy, desired_replicas


@pytest.mark.parametrize("bad", [0, -5, 0.5, 1.5, 256.0, math.nan, math.inf, True, "4096"])
def test_a_bad_target_is_refused_when_the_policy_is_made(bad) -> None:
    with pytest.raises(ValueError, match=r"--target-tokens-per-replica\) must be an integer >= 1, got"):
        QueuedTokensPolicy(target_tokens_per_replica=bad)


def test_a_good_target_is_kept_as_an_int() -> None:
    assert QueuedTokensPolicy(target_tokens_per_replica=256).target_tokens_per_replica == 256


def test_desired_replicas_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"got 0$"):
        desired_replicas(10, 0, current=1, min_replicas=1, max_replicas=2)
