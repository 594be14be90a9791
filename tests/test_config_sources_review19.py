"""Settings that were read wrong or not at all (review 19, SDK settings follow-ups): a cloud URL with
a space or two URLs in one list item, a config file that is not a regular file of a few KiB, a
number of seconds past a float's range, a switch in the environment with spaces around it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from hybridllm._config import HybridLLMConfig, load_config
from hybridllm._durations import duration
from hybridllm._exceptions import ConfigError
from hybridllm.backends.circuit import check_setting, check_url


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("HYBRIDLLM_"):
            monkeypatch.delenv(name)


# --- cloud_url -------------------------------------------------------------------------------------

@pytest.mark.parametrize("given", [["https://x.example "], [" https://x.example\n"], ("https://x.example\t",)])
def test_spaces_around_a_list_item_are_stripped_as_around_a_comma_separated_one(given):
    # before: kept, and httpx asked the host "x.example%20" (never resolves) or refused the tab
    assert HybridLLMConfig(cloud_url=given).cloud_url == ["https://x.example"]
    assert load_config(cloud_url=given).cloud_url == ["https://x.example"]


@pytest.mark.parametrize("given", [["https://a,https://b"], ["https://u:pw@a/v1, http://b/v1"]])
def test_two_urls_in_one_list_item_are_a_config_error_naming_the_setting(given):
    # before: one URL whose host was "a,https" (or "a" with the path "/v1,https://b/v1")
    with pytest.raises(ConfigError, match=r"^cloud_url holds several URLs joined by commas") as err:
        load_config(cloud_url=given)
    assert "pw" not in str(err.value)  # a password is still masked


def test_the_same_urls_as_one_string_or_in_the_environment_are_two(monkeypatch):
    assert load_config(cloud_url="https://a, https://b").cloud_url == ["https://a", "https://b"]
    monkeypatch.setenv("HYBRIDLLM_CLOUD_URL", " https://a ,https://b ")
    assert load_config().cloud_url == ["https://a", "https://b"]


@pytest.mark.parametrize("url", ["https://x .example/v1", "https://x.example/v 1", "https://a,b.example/v1"])
def test_a_space_inside_a_url_or_a_comma_in_its_host_is_a_config_error(url):
    with pytest.raises(ConfigError, match=r"^cloud_url has a (space|comma)"):
        load_config(cloud_url=[url])
    with pytest.raises(ConfigError, match=r"^base_url has a (space|comma)"):
        check_url("base_url", url)  # the cloud client's own constructor: the same rule


def test_a_comma_in_a_query_string_is_still_a_url():
    assert load_config(cloud_url=["https://a/v1?x=1,2"]).cloud_url == ["https://a/v1?x=1,2"]


# --- the config file -------------------------------------------------------------------------------

def test_a_config_file_over_the_limit_is_a_config_error_naming_it(tmp_path):
    # before: read whole (a 2 GB file, into memory); valid TOML (comments), so it even loaded
    path = tmp_path / "config.toml"
    path.write_text("# a comment\n" * ((1 << 20) // 12 + 1) + "n_ctx = 2048\n")  # just over 1 MiB
    with pytest.raises(ConfigError, match="over 1 MiB") as err:
        load_config(path)
    assert str(path) in str(err.value)
    path.write_text("# a comment\n" * 1000 + "n_ctx = 2048\n")  # a large but plausible one
    assert load_config(path).n_ctx == 2048


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_a_config_error_not_a_wait_for_ever(tmp_path, monkeypatch):
    path = tmp_path / "config.fifo"
    os.mkfifo(path)
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(path))
    got = []
    t = threading.Thread(target=lambda: got.append(_outcome(load_config)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # before: open() waited for a writer; give it one so the thread ends
        with open(path, "w"):
            pass
        t.join(10)
        pytest.fail("load_config waited on the FIFO for a writer")
    assert got and isinstance(got[0], ConfigError) and "not a regular file" in str(got[0]), got


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_dev_zero_is_a_config_error_not_all_the_memory():
    # in a child with 1 GiB of address space at most: before, it read /dev/zero until MemoryError
    code = ("import os\nfrom hybridllm._config import load_config\n"
            "try:\n    load_config('/dev/zero')\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)\n")

    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDLLM_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=limit, env=env)
    assert out.stdout.startswith("ConfigError Config file /dev/zero is not a regular file"), (
        out.stdout, out.stderr[-500:])


def test_dev_null_still_means_no_config_file(monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_CONFIG", os.devnull)
    assert load_config().n_ctx == HybridLLMConfig().n_ctx


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001  # what the test inspects
        return exc


# --- seconds past a float's range ------------------------------------------------------------------

@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["huge", "-huge"])
def test_duration_of_an_int_past_a_float_reads_as_unknown_not_overflow(value):
    assert duration(value) == "an unknown time"  # before: OverflowError
    assert " days " in duration(10**300)  # an int a float holds still counts


@pytest.mark.parametrize("name", ["cloud_read_timeout_s", "cloud_connect_timeout_s",
                                  "cloud_breaker_cooldown_s"])
def test_cloud_seconds_past_a_float_are_a_config_error_naming_the_setting(name):
    # before: accepted (10**400 < inf), then each call failed with OverflowError
    with pytest.raises(ConfigError, match=rf"^{name} must be .*past a float's range"):
        load_config(**{name: 10**400})
    with pytest.raises(ConfigError, match="breaker_cooldown_s"):
        check_setting("breaker_cooldown_s", 10**5000, "seconds>=0")  # too long even to print


@pytest.mark.parametrize(("env", "value", "message"), [
    ("1e309", None, None),  # inf: no bound, as documented for these two
    ("nan", ConfigError, "must be positive"),
    ("-1", ConfigError, "must be positive"),
])
def test_seconds_in_the_environment(monkeypatch, env, value, message):
    monkeypatch.setenv("HYBRIDLLM_EDGE_WAIT_TIMEOUT_S", env)
    if value is None:
        assert load_config().edge_wait_timeout_s == float("inf")
        return
    with pytest.raises(value, match=message) as err:
        load_config()
    assert "HYBRIDLLM_EDGE_WAIT_TIMEOUT_S" in str(err.value)


# --- switches in the environment -------------------------------------------------------------------

@pytest.mark.parametrize(("name", "raw", "want"), [
    ("cache", " 0 ", False), ("cascade", "\ttrue\n", True), ("cache", " On", True),
    ("n_threads", " none ", None), ("n_ctx", " 4096 ", 4096),
])
def test_spaces_around_a_switch_or_none_are_ignored_as_around_a_number(monkeypatch, name, raw, want):
    # before: HYBRIDLLM_CACHE=" 0 " was "not a valid bool" while HYBRIDLLM_N_CTX=" 4096 " was read
    monkeypatch.setenv(f"HYBRIDLLM_{name.upper()}", raw)
    assert getattr(load_config(), name) == want


def test_a_text_setting_is_kept_as_given(monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_NAMESPACE", " team a ")
    assert load_config().namespace == " team a "


@pytest.mark.parametrize("name", ["cache_ttl_s", "edge_wait_timeout_s", "max_cloud_usd_per_day",
                                  "cloud_joules_per_token"])
def test_other_seconds_or_numbers_past_a_float_are_a_config_error_naming_them(name, tmp_path):
    # before: cache_ttl_s=10**400 was kept and the cache failed with OverflowError when it purged
    with pytest.raises(ConfigError, match=rf"^{name} must be a number, got an integer past"):
        load_config(**{name: 10**400})
    path = tmp_path / "config.toml"  # TOML's integers are Python's: as large as written
    path.write_text(f"{name} = 1{'0' * 400}\n")
    with pytest.raises(ConfigError, match=rf"{name} must be a number, got an integer past"):
        load_config(path)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc here")
def test_files_that_are_refused_leave_no_descriptor_open(tmp_path):
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (2 << 20))
    before = len(os.listdir("/proc/self/fd"))
    for path in [tmp_path, big, "/dev/zero"] * 20:
        with pytest.raises(ConfigError, match=str(path)):
            load_config(path)
    assert len(os.listdir("/proc/self/fd")) == before
