"""Carbon intensity given wrong: a stated figure out of range is refused with the range it must be
in, and a feed that calls sys.exit() is an unknown figure for the request, not its end."""

from __future__ import annotations

import pytest

from hybridllm._exceptions import ConfigError
from hybridllm.carbon import CloudEndpoint


@pytest.mark.parametrize("value", [1e5, 1e6, -1])
def test_an_out_of_range_intensity_names_the_range(value):
    """Before: 1e6 was refused as "must be >= 0 gCO2/kWh", which it is."""
    with pytest.raises(ConfigError, match=r"\[0, 100000\)"):
        CloudEndpoint("https://a.example/v1", carbon_intensity=value)


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_a_feed_that_exits_is_unknown_not_the_requests_end(exc, caplog):
    """Before: the feed's SystemExit was re-raised in the waiting request's thread."""

    def feed() -> float:
        raise exc

    ep = CloudEndpoint("https://a.example/v1", carbon_intensity=feed)
    try:
        got = ep.intensity()
    except BaseException as raised:  # noqa: BLE001 - what the old code let through
        pytest.fail(f"the feed's {type(raised).__name__} reached the request")
    assert got is None
    assert type(exc).__name__ in caplog.text
    ep.carbon_intensity = lambda: 42
    assert ep.intensity() == 42.0  # answers again
