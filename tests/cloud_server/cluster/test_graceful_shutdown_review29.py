"""How long a replica being removed (scaled down, or the app deleted at exit) has to finish its
answers: ``--graceful-shutdown-s`` (ClusterConfig.graceful_shutdown_s), 120 s by default.

Serve's own default of 20 s killed a replica the autoscaler removed while it still streamed
answers: on a 2-core CPU machine, 4 answers of 160 tokens on one SmolLM2 replica took over 20 s,
and each failed with a 500 (seen in test_autoscale_real). Both deployments get the setting: the
front end streams the engine replicas' answers, so at exit it must outlast them.
"""

from __future__ import annotations

import pytest

from cloud_server.config import ClusterConfig, EngineConfig
from cloud_server.exceptions import ConfigError


def _cluster(argv: list[str]):
    from cloud_server.__main__ import build_parser
    from cloud_server.cli_settings import _cluster_config

    return _cluster_config(build_parser().parse_args(["serve", "--model", "m.gguf", *argv]))


def test_the_default_outlasts_a_long_cpu_answer_and_the_flag_sets_it():
    assert _cluster(["--replicas", "2"]).graceful_shutdown_s == 120.0
    assert _cluster(["--replicas", "2", "--graceful-shutdown-s", "45"]).graceful_shutdown_s == 45.0


def test_the_flag_goes_with_replicas_and_must_be_a_finite_number():
    from cloud_server.cli_settings import UsageError

    with pytest.raises(UsageError, match="--graceful-shutdown-s"):
        _cluster(["--graceful-shutdown-s", "45"])
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="graceful_shutdown_s|--graceful-shutdown-s"):
            ClusterConfig(replicas=1, graceful_shutdown_s=bad)


def test_both_deployments_get_it():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.app import build_app

    cluster = ClusterConfig(replicas=1, max_replicas=4, graceful_shutdown_s=75.0)
    app = build_app(EngineConfig("m.gguf"), cluster)
    frontend = app._bound_deployment
    engine = frontend.init_args[0]._bound_deployment
    assert engine._deployment_config.graceful_shutdown_timeout_s == 75.0
    assert frontend._deployment_config.graceful_shutdown_timeout_s == 75.0
    default = build_app(EngineConfig("m.gguf"), ClusterConfig(replicas=2))._bound_deployment
    assert default.init_args[0]._bound_deployment._deployment_config.graceful_shutdown_timeout_s == 120.0
