"""``hybridllm-cloud serve``: a bad ``HYBRIDLLM_POWER_WATTS`` is a usage error before anything loads,
on the single-process server and with ``--replicas``, in the energy meter's own words.

Before: the meter read it only once the model had loaded (each replica's meter, with --replicas),
so the server bound its port, loaded for minutes, then stopped with exit 1. In-process: the bind
and the cluster's start are replaced by stand-ins that say they were reached; no model, no Ray."""

from __future__ import annotations

import pytest

import cloud_server.__main__ as cli
import cloud_server.cluster.launch as launch
from cloud_server.exceptions import ServerError

SINGLE = ["serve", "--model", "smollm2-135m-instruct", "--port", "0"]
CLUSTER = ["serve", "--model", "smollm2-135m-instruct", "--replicas", "1", "--port", "8123"]
REACHED = "reached the load"


@pytest.fixture(autouse=True)
def _nothing_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks that read a model or import torch are not this test's; the bind and the
    cluster's start stop the run where the load would begin."""
    for name in ("_check_model", "_check_device", "_check_model_header"):
        monkeypatch.setattr(cli, name, lambda *a, **k: None)

    def reached(*args: object, **kwargs: object) -> None:
        raise ServerError(REACHED)

    monkeypatch.setattr(cli, "listen", reached)
    monkeypatch.setattr(launch, "serve_cluster", reached)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv", [SINGLE, CLUSTER], ids=["single", "replicas"])
@pytest.mark.parametrize("value", ["300W", "-5", "nan", "0", "inf", " "])
def test_a_bad_power_figure_is_refused_before_the_load(argv, value, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", value)
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert REACHED not in err
    assert err.count("\n") == 1 and "Traceback" not in err
    # the meter's own wording (check_watts), then what to do
    assert err.startswith(f"hybridllm-cloud: error: HYBRIDLLM_POWER_WATTS={value!r} is not a "
                          "positive number of watts: set it to ")
    assert "or unset it" in err


@pytest.mark.parametrize("argv", [SINGLE, CLUSTER], ids=["single", "replicas"])
@pytest.mark.parametrize("value", ["42.5", "300", ""])
def test_a_good_or_empty_power_figure_goes_on_to_the_load(argv, value, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", value)
    code, err = _run(argv, capsys)
    assert code == 1 and REACHED in err


@pytest.mark.parametrize("argv", [SINGLE, CLUSTER], ids=["single", "replicas"])
def test_the_variable_is_not_read_under_power_watts(argv, monkeypatch, capsys) -> None:
    """--power-watts forces the estimate at its figure: the meter never reads the variable."""
    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", "300W")
    code, err = _run([*argv, "--power-watts", "50"], capsys)
    assert code == 1 and REACHED in err
