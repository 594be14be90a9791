"""Autoscaling settings: the window against Ray Serve's metrics push interval, and the
queued-tokens target under the project's integer rule (``hybridllm._types.is_integer``). No Ray
needed (the one test that compares with Ray's own constant skips without it).

Before: ``--autoscale-window-s 5`` (Serve's ``look_back_period_s``, not above its 10 s
``metrics_interval_s``) was taken; Serve only warned, once Ray had started, that a later release
will refuse it, and the policy saw at most part of one push. ``QueuedTokensPolicy(256.0)`` was taken
as 256 where ``--target-tokens-per-replica`` and ``ClusterConfig`` refuse a float, and numpy's int64
was refused."""

from __future__ import annotations

import numpy as np
import pytest

import cloud_server.config as config_module
from cloud_server.cli_parser import UsageError, build_parser
from cloud_server.cli_settings import _cluster_config
from cloud_server.cluster.autoscale import QueuedTokensPolicy
from cloud_server.config import ClusterConfig
from cloud_server.exceptions import ConfigError


@pytest.mark.parametrize("window", [0.5, 5, 10, 10.0])
def test_a_window_not_above_serves_push_interval_is_refused(window) -> None:
    with pytest.raises(ConfigError, match=r"--autoscale-window-s must be more than 10 seconds, Ray "
                                          r"Serve's metrics push interval .*got " + str(window)):
        ClusterConfig(replicas=1, max_replicas=2, autoscale_window_s=window)


def test_the_option_is_refused_before_anything_loads(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = build_parser().parse_args(["serve", "--model", "m", "--replicas", "1", "--max-replicas", "2",
                                      "--port", "9000", "--autoscale-window-s", "8"])
    with pytest.raises(UsageError, match="more than 10 seconds"):
        _cluster_config(args)


def test_a_window_above_it_is_kept() -> None:
    assert ClusterConfig(replicas=1, max_replicas=2, autoscale_window_s=10.5).autoscale_window_s == 10.5
    assert ClusterConfig().autoscale_window_s == 30.0


def test_the_interval_is_serves_own() -> None:
    config = pytest.importorskip("ray.serve.config")
    ours = config_module.SERVE_METRICS_INTERVAL_S
    assert config.DEFAULT_METRICS_INTERVAL_S == ours == config.AutoscalingConfig().metrics_interval_s


@pytest.mark.parametrize("bad", [256.0, 1.0, np.float64(512)])
def test_a_float_target_is_refused_as_the_option_refuses_it(bad) -> None:
    with pytest.raises(ValueError, match=r"must be an integer >= 1, got"):
        QueuedTokensPolicy(target_tokens_per_replica=bad)
    with pytest.raises(ConfigError, match=r"--target-tokens-per-replica must be an integer >= 1"):
        ClusterConfig(target_tokens_per_replica=bad)


def test_numpys_int_is_an_integer_target() -> None:
    target = QueuedTokensPolicy(target_tokens_per_replica=np.int64(256)).target_tokens_per_replica
    assert target == 256 and type(target) is int
