"""One duration formatter (hybridllm._durations.duration) for the progress bar's time left, the
budget's "room again in ...", and the cloud's "refused ... when asked ... ago". Before, each had its
own: the budget said "60 s" for 59.6 s, "60 min" for 59 min 50 s and "1.5 h"; the cloud said
"1 days" and dropped all but one unit; the progress bar said "1 h 00 min"."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from hybridllm import GenerationParams
from hybridllm._durations import duration
from hybridllm._progress import ProgressBar
from hybridllm.router.budget import Budget


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (-5, "0 s"), (0.2, "1 s"), (45, "45 s"), (59.4, "59 s"), (59.6, "1 min"),
    (65, "1 min 05 s"), (150, "2 min 30 s"), (3000, "50 min"), (3590, "59 min 50 s"),
    (3599.6, "1 h"), (3660, "1 h 01 min"), (5400, "1 h 30 min"), (7199, "2 h"), (85_680, "23 h 48 min"),
    (86_400, "1 day"), (90_000, "1 day 1 h"), (2 * 86_400 + 4 * 3600, "2 days 4 h"),
    (float("inf"), "an unknown time"),
])
def test_durations_read_in_two_units_rounded_to_what_is_shown(seconds, text):
    assert duration(seconds) == text


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(("wait_s", "wait"), [(3590, "59 min 50 s"), (59.6, "1 min"), (1800, "30 min")])
def test_the_budget_says_its_wait_in_the_same_words(wait_s, wait):
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=1, clock=clock)
    b.record(1)
    clock.t += 3600 - wait_s  # the call leaves the hour's window in wait_s
    # was "60 min" (59 min 50 s rounded to whole minutes) and "60 s" (59.6 s to whole seconds)
    assert b.exhausted() == f"budget spent: 1/1 cloud calls this hour (sliding window: room again in {wait})"


def test_the_budget_says_a_day_and_its_hours():
    clock = Clock()
    b = Budget(max_cloud_calls_per_day=1, clock=clock)
    b.record(1)
    clock.t += 5400  # 22 h 30 min left: was "22.5 h"
    assert b.exhausted().endswith("(sliding window: room again in 22 h 30 min)")


def test_the_progress_bar_leaves_out_a_zero_minor_unit(monkeypatch):
    clock = {"t": 100.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])
    class Terminal(io.StringIO):
        def isatty(self) -> bool:  # redrawn in place, every call
            return True

    out = Terminal()
    bar = ProgressBar("work", unit="items", scale=1, stream=out, quiet_for=0.0)
    bar(0, 3700)
    clock["t"] += 100.0
    bar(100, 3700)  # 1 item/s: 3600 s left
    assert out.getvalue().split("\r")[-1].rstrip().endswith("1 items/s, 1 h left")  # was "1 h 00 min left"


def test_the_cloud_says_how_long_ago_a_field_was_refused_over_real_http(tmp_path, monkeypatch, caplog):
    import threading
    from http.server import ThreadingHTTPServer

    from hybridllm.backends.cloud import CloudBackend
    from hybridllm.backends.refusals import FILE_NAME
    from tests.backends.test_cloud_hosted import _Handler

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.hits = []  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
        url = f"http://127.0.0.1:{httpd.server_address[1]}/openai"
        model = f"gpt-ago-{time.monotonic_ns()}"  # said once per process and model: a fresh name
        msgs, params = [{"role": "user", "content": "hi"}], GenerationParams(max_tokens=8)
        first = CloudBackend(base_url=url, model=model, max_retries=0, remember_refusals=True)
        assert "".join(d.text for d in first.stream(msgs, params)) == "fine"  # learns: top_k refused
        # as if another process had learned it a day and 2 hours ago
        path = tmp_path / FILE_NAME
        kept = json.loads(path.read_text())
        for entry in kept["entries"].values():
            entry["at"] -= 26 * 3600
        path.write_text(json.dumps(kept))
        httpd.hits.clear()
        cloud = CloudBackend(base_url=url, model=model, max_retries=0, remember_refusals=True)
        with caplog.at_level(logging.WARNING, logger="hybridllm"):
            text = "".join(d.text for d in cloud.stream(msgs, params))
        assert text == "fine"
        assert [("top_k" in body) for _, body in httpd.hits] == [False]  # recalled, not asked again
        assert "refused top_k when asked 1 day 2 h ago" in caplog.text  # was "1 days ago"
    finally:
        httpd.shutdown()
        httpd.server_close()
