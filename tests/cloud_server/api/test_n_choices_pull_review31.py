"""``n`` past the batch size on an engine that runs its requests only as they are read (review 31).

``FakeEngine``'s stream holds a batch slot until it ends or is closed, as any engine behind the
API's ``Engine`` protocol may. Choice k > max_num_seqs needs a slot an earlier choice frees; the
first version admitted the choices (waiting for each first output) before reading any further,
and kept a finished choice's stream open until the whole response ended: n = 9 on 8 slots hung
(the fuzzer's n = 62 request timed out). Now the admitted choices run on while the others are
admitted, and each choice's stream is closed as soon as it ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine
from .helpers import ThreadServer, sse_payloads

SLOTS = 2


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ThreadServer, FakeEngine]]:
    engine = FakeEngine(max_num_seqs=SLOTS, max_waiting=64, max_model_len=512, step_s=0.0005)
    srv = ThreadServer(create_app(lambda: engine)).start()
    yield srv, engine
    srv.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_n_past_the_batch_is_answered_whole(served: tuple[ThreadServer, FakeEngine], path: str,
                                            stream: bool) -> None:
    srv, engine = served
    n = 3 * SLOTS + 1
    body: dict = {"model": "fake-model", "n": n, "max_tokens": 6, "stream": stream}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    r = httpx.post(srv.url + path, json=body, timeout=15.0)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [p for p in sse_payloads(r.text.splitlines()) if p != "[DONE]"]
        finished = {c["choices"][0]["index"] for c in chunks
                    if c["choices"] and c["choices"][0].get("finish_reason")}
        assert finished == set(range(n))
    else:
        choices = r.json()["choices"]
        assert [c["index"] for c in choices] == list(range(n))
        assert all(c["finish_reason"] == "length" for c in choices)
    # every slot back once the response is out (no stream left holding one)
    assert engine.num_running == 0 and engine.num_waiting == 0
    assert engine.num_free_blocks == engine.num_total_blocks
