"""ClusterConfig's errors name the option at fault, the value given and what is allowed; a value
of the wrong kind (NaN, a string from a Serve config file) is a ConfigError, not a traceback."""

from __future__ import annotations

import pytest

from cloud_server.config import ClusterConfig
from cloud_server.exceptions import ConfigError


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"replicas": 0}, ["--replicas", ">= 1", "got 0"]),
        ({"replicas": 2, "min_replicas": -1}, ["--min-replicas", ">= 0", "got -1"]),
        ({"replicas": 1, "max_replicas": 0}, ["--max-replicas", ">= 1", "got 0"]),
        ({"replicas": 1, "max_replicas": 2, "target_tokens_per_replica": 0},
         ["--target-tokens-per-replica", ">= 1", "got 0"]),
        ({"replicas": 3, "min_replicas": 3, "max_replicas": 2},
         ["--min-replicas 3 is above --max-replicas 2", "from 0 to 2"]),
        ({"replicas": 5, "min_replicas": 1, "max_replicas": 4},
         ["--replicas 5 must lie within", "from 1 to 4"]),
        # --max-replicas not given: the message says where its figure comes from
        ({"replicas": 2, "min_replicas": 3}, ["--replicas 2 must lie within", "its default", "from 3 to 3"]),
        ({"replicas": 1, "max_replicas": 2, "autoscale_window_s": 0},
         ["--autoscale-window-s", "> 0", "got 0"]),
        ({"replicas": 1, "max_replicas": 2, "upscale_delay_s": -1}, ["--upscale-delay-s", ">= 0", "got -1"]),
    ],
)
def test_bound_errors_name_option_value_and_range(kwargs: dict, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        ClusterConfig(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"replicas": 2, "min_replicas": "1"},  # a Serve config file's string: was a TypeError
        {"replicas": 2, "max_replicas": "4"},
        {"replicas": 2, "min_replicas": True, "max_replicas": 4},
        {"replicas": 1, "imbalance_ratio": float("nan")},  # was accepted: every margin NaN
        {"replicas": 1, "min_margin_tokens": "128"},
        {"replicas": 1, "replica_cpus": float("nan")},
        {"replicas": 1, "stats_period_s": "0.5"},
        {"replicas": 1, "upscale_delay_s": 10**400, "max_replicas": 2},  # past a float: no OverflowError
    ],
)
def test_bad_kinds_are_config_errors(kwargs: dict) -> None:
    name = next(k for k in kwargs if k != "replicas")
    with pytest.raises(ConfigError, match=name.split("_")[0]) as info:
        ClusterConfig(**kwargs)
    assert "got" in str(info.value)


def test_good_values_still_pass() -> None:
    auto = ClusterConfig(replicas=2, min_replicas=0, max_replicas=4, imbalance_ratio=0, min_margin_tokens=0,
                         upscale_delay_s=0, downscale_delay_s=0.5, replica_cpus=0.5)
    assert (auto.min_replicas, auto.max_replicas) == (0, 4)
    only_min = ClusterConfig(replicas=2, min_replicas=1)
    assert (only_min.min_replicas, only_min.max_replicas) == (1, 2)
    only_max = ClusterConfig(replicas=1, max_replicas=3)
    assert (only_max.min_replicas, only_max.max_replicas) == (1, 3)
