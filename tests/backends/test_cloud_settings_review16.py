"""The cloud client's numbers have one rule (``circuit.check_setting``) for the settings and for
the constructors, and the message names the value as the user wrote it (helper-f1); a 429's
``retry-after-ms`` (OpenAI's, Azure's) is read, and wins over Retry-After."""

from __future__ import annotations

import math

import httpx
import pytest

from hybridllm import CloudRateLimitError, ConfigError, GenerationParams
from hybridllm._config import load_config
from hybridllm.backends import cloud_retry
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=4, temperature=0)
# (config key, CloudBackend argument)
NAMES = [("cloud_connect_timeout_s", "connect_timeout_s"), ("cloud_read_timeout_s", "read_timeout_s"),
         ("cloud_stall_timeout_s", "stall_timeout_s"), ("cloud_max_retries", "max_retries"),
         ("cloud_breaker_threshold", "breaker_threshold"),
         ("cloud_breaker_cooldown_s", "breaker_cooldown_s")]
VALUES = [math.inf, math.nan, True, "10", -1, 0, 2.5, 3, None]


def _outcome(make):
    try:
        make()
    except ConfigError as exc:
        return str(exc)
    return "ok"


@pytest.mark.parametrize("key, arg", NAMES)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_config_and_the_constructor_take_and_refuse_the_same_values(key, arg, value):
    """Before: the config took cloud_breaker_threshold=True, inf or 2.5 and cloud_max_retries=nan
    (the client then failed naming breaker_threshold, or `config show` printed them), "10" was
    "Invalid settings: '<' not supported..." there, and the constructor took stall_timeout_s=nan
    or True and raised a TypeError for "10"."""
    if value is None and key != "cloud_stall_timeout_s":
        return  # None is "not given" to load_config: the default
    by_config = _outcome(lambda: load_config(**{key: value}))
    by_hand = _outcome(lambda: CloudBackend(base_url="http://cloud.test", model="m", **{arg: value}))
    assert (by_config == "ok") == (by_hand == "ok"), (by_config, by_hand)
    if by_config != "ok":  # one message, naming the key or the argument
        assert by_config.startswith(f"{key} must be ") and by_hand.startswith(f"{arg} must be ")
        assert by_config.removeprefix(key) == by_hand.removeprefix(arg)


@pytest.mark.parametrize("key, value", [
    ("cloud_breaker_threshold", True), ("cloud_breaker_threshold", math.inf),
    ("cloud_breaker_threshold", 2.5), ("cloud_max_retries", math.nan), ("cloud_max_retries", True),
    ("cloud_breaker_cooldown_s", True), ("cloud_connect_timeout_s", True),
    ("cloud_stall_timeout_s", True),
])
def test_the_config_refuses_what_the_client_would(key, value):
    with pytest.raises(ConfigError, match=f"^{key} must be "):
        load_config(**{key: value})


@pytest.mark.parametrize("key", ["cloud_connect_timeout_s", "cloud_breaker_threshold",
                                 "cloud_max_retries", "cloud_breaker_cooldown_s"])
def test_a_string_is_refused_naming_the_setting(key):
    """Before: 'Invalid settings: '<' not supported between instances of 'str' and 'int'.'"""
    with pytest.raises(ConfigError, match=f"^{key} must be .*got '10'"):
        load_config(**{key: "10"})


@pytest.mark.parametrize("arg, value", [("stall_timeout_s", math.nan), ("stall_timeout_s", "10"),
                                        ("stall_timeout_s", True)])
def test_the_constructor_refuses_a_stall_timeout_the_config_refuses(arg, value):
    """Before: nan and True were taken (a NaN bound on the wait for each event), "10" a TypeError."""
    with pytest.raises(ConfigError, match=f"^{arg} must be "):
        CloudBackend(base_url="http://cloud.test", model="m", **{arg: value})


def _limited(headers):
    def handler(request):
        return httpx.Response(429, json={"error": {"message": "slow down"}}, headers=headers)

    return CloudBackend(base_url="http://cloud.test", model="m", max_retries=0,
                        transport=httpx.MockTransport(handler))


@pytest.mark.parametrize("headers, wait", [
    ({"retry-after-ms": "1500"}, 1.5),  # OpenAI's and Azure's header alone
    ({"retry-after-ms": "250", "retry-after": "1"}, 0.25),  # both: the finer one wins
    ({"retry-after-ms": "90000", "retry-after": "1"}, 90.0),
    ({"retry-after-ms": "soon", "retry-after": "2"}, 2.0),  # not a number: Retry-After decides
    ({"retry-after-ms": "nan", "retry-after": "2"}, 2.0),
    ({"retry-after-ms": "-5", "retry-after": "2"}, 2.0),
    ({"retry-after-ms": "inf"}, None),
    ({"retry-after": "3"}, 3.0),
])
def test_retry_after_ms_is_read(monkeypatch, headers, wait):
    """Before: only Retry-After was read, so a 429 with retry-after-ms alone had no wait (retried
    at once, the next request sent to the endpoint that asked to wait)."""
    async def no_sleep(seconds):
        pass

    monkeypatch.setattr(cloud_retry, "_sleep", no_sleep)
    with pytest.raises(CloudRateLimitError) as err:
        list(_limited(headers).stream(MSGS, P))
    assert err.value.retry_after_s == (None if wait is None else pytest.approx(wait))


def test_a_long_retry_after_ms_leaves_the_endpoint_alone_for_it_bounded(monkeypatch):
    """Bounded like Retry-After: an endpoint is left alone for COOL_MAX_S at most."""
    async def no_sleep(seconds):
        pass

    monkeypatch.setattr(cloud_retry, "_sleep", no_sleep)
    cloud = _limited({"retry-after-ms": str(10**9)})
    with pytest.raises(CloudRateLimitError):
        list(cloud.stream(MSGS, P))
    assert cloud.rate_limited() and not cloud.is_available()
    assert cloud_retry.COOL_MAX_S - 5 < cloud.retry_after_s() <= cloud_retry.COOL_MAX_S


@pytest.mark.parametrize("url, problem", [
    ("http://localhost:99999/v1", "is not a valid URL"),  # before: an ExceptionGroup per request
    ("http://[::1/v1", "is not a valid URL"),  # before: ValueError per request
    ("http://localhost:abc/v1", "is not a valid URL"),  # before: httpx.InvalidURL per request
    ("http://", "has no host"),  # before: "cannot reach http:/v1 (UnsupportedProtocol)"
    ("https:///v1", "has no host"),
    ("ftp://h/v1", "must start with http"),
])
def test_a_url_no_request_can_go_to_is_refused_by_both(url, problem):
    with pytest.raises(ConfigError, match=f"^cloud_url {problem}"):
        load_config(cloud_url=[url])
    with pytest.raises(ConfigError, match=f"^base_url {problem}"):
        CloudBackend(base_url=url, model="m")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "https://user:p%40ss@h.example/v1",
                                 "http://[::1]:8080", "http://h"])
def test_good_urls_still_load(url):
    assert load_config(cloud_url=[url]).cloud_url == [url]
    CloudBackend(base_url=url, model="m")


@pytest.mark.parametrize("headers", [{"retry-after": "86400"}, {"retry-after-ms": "86400000"}])
def test_the_wait_said_is_the_wait_kept(monkeypatch, headers):
    """A Retry-After of a day: the endpoint is asked again after COOL_MAX_S (5 minutes); before,
    the first error said 86400 s while the next, a moment later, said 299 s."""
    async def no_sleep(seconds):
        pass

    monkeypatch.setattr(cloud_retry, "_sleep", no_sleep)
    cloud = _limited(headers)
    with pytest.raises(CloudRateLimitError) as first:
        list(cloud.stream(MSGS, P))
    with pytest.raises(CloudRateLimitError) as second:
        list(cloud.stream(MSGS, P))
    assert first.value.retry_after_s == cloud_retry.COOL_MAX_S
    assert cloud_retry.COOL_MAX_S - 5 < second.value.retry_after_s <= first.value.retry_after_s
