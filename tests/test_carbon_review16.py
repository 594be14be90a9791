"""A carbon endpoint's URL is refused by the cloud client's rule under its own setting's name,
and its user:password never reaches the logs or an error."""

from __future__ import annotations

import logging

import pytest

from hybridllm._config import HybridLLMConfig
from hybridllm._exceptions import ConfigError
from hybridllm.backends.cloud_http import _api_root
from hybridllm.carbon import CarbonPlacer, CloudEndpoint

BAD = ["http://h.example:99999/v1", "http://[::1/v1", "http://", "http://h.example:abc/v1"]


@pytest.mark.parametrize("url", BAD)
def test_a_bad_endpoint_url_is_refused_as_a_cloud_endpoint(url):
    """Before: only the scheme was checked; the URL passed, and was refused later as "cloud_url"
    (or the backend's "base_url"), a setting the user never set."""
    for make in (lambda: CloudEndpoint(url), lambda: CloudEndpoint.of({"url": url, "carbon_intensity": 5}),
                 lambda: HybridLLMConfig(cloud_endpoints=[{"url": url, "carbon_intensity": 5}])):
        with pytest.raises(ConfigError, match=r"cloud_endpoints") as err:
            make()
        assert "cloud_url" not in str(err.value)


@pytest.mark.parametrize("url", ["ftp://h.example/v1", "h.example/v1", 5, None])
def test_a_non_http_endpoint_url_is_still_refused(url):
    with pytest.raises(ConfigError, match=r"must start with http:// or https://"):
        CloudEndpoint(url)


def test_good_endpoint_urls_pass():
    for url in ("https://h.example/v1", "http://127.0.0.1:8000", "http://[::1]:8000/v1",
                "https://u:p@h.example/v1"):
        assert CloudEndpoint(url, carbon_intensity=5).url == url


def test_a_failing_feed_is_logged_without_the_password(caplog):
    """Before: the warning named the endpoint by its raw URL, user:password@ included."""

    def feed() -> float:
        raise RuntimeError("grid API down")

    ep = CloudEndpoint("https://alice:s3cret@h.example/v1", carbon_intensity=feed)
    with caplog.at_level(logging.DEBUG, logger="hybridllm.carbon"):
        assert ep.intensity() is None
        assert ep.intensity() is None  # the debug line of a known outage
    assert "h.example" in caplog.text and "grid API down" in caplog.text
    assert "s3cret" not in caplog.text and "alice" not in caplog.text


def test_an_endpoint_listed_twice_is_named_without_the_password():
    with pytest.raises(ConfigError, match="listed twice") as err:
        CarbonPlacer([CloudEndpoint("https://alice:s3cret@h.example/v1"),
                      CloudEndpoint("https://alice:s3cret@h.example/")], root=_api_root)
    assert "s3cret" not in str(err.value) and "h.example" in str(err.value)
