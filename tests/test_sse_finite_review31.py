"""Server-sent events carry no bare NaN or Infinity (review 31).

Before, ``sse_event`` wrote its payload with ``json.dumps``' default ``allow_nan=True``: a NaN or
infinite number in a chunk (a replica's energy figure in ``usage``, a logprob that reached the
writer unfloored) went out as ``NaN`` / ``-Infinity``, which no strict JSON parser (JavaScript's
``JSON.parse``, Go's, Rust's serde_json) accepts. Now it goes out as null, as the proxy's finished
answers have it (``hybridllm._finite``); the cloud's own logprobs keep their -9999.0 floor.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx

from hybridllm.wire.responses import ChunkWriter, error_event, sse_event


def _strict(event: str) -> Any:
    """The payload of one ``data:`` frame, parsed as a strict JSON client does."""
    assert event.startswith("data: ") and event.endswith("\n\n"), event

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(event[len("data: "):-2], parse_constant=refuse)


def test_non_finite_numbers_in_chunks_go_out_as_null():
    writer = ChunkWriter(id="c1", created=1, model="m", chat=True, include_usage=True)
    logprobs = {"content": [{"token": "a", "logprob": float("-inf"), "bytes": [97],
                             "top_logprobs": [{"token": "b", "logprob": float("nan"), "bytes": [98]}]}]}
    text = _strict(writer.text("a", logprobs))
    entry = text["choices"][0]["logprobs"]["content"][0]
    assert entry["logprob"] is None and entry["top_logprobs"][0]["logprob"] is None
    assert entry["token"] == "a" and text["choices"][0]["delta"] == {"content": "a"}
    energy = {"joules": float("nan"), "source": "nvml", "joules_per_output_token": float("inf")}
    usage = _strict(writer.usage({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                                  "energy": energy}))
    assert usage["usage"]["energy"] == {"joules": None, "source": "nvml", "joules_per_output_token": None}
    assert usage["usage"]["total_tokens"] == 4
    finish = _strict(writer.finish("stop", hybridllm={"score": float("-inf"), "route": "edge"}))
    assert finish["hybridllm"] == {"score": None, "route": "edge"}
    legacy = ChunkWriter(id="c2", created=1, model="m", chat=False, include_usage=False)
    lp = {"tokens": ["a"], "token_logprobs": [float("-inf")], "top_logprobs": [{"a": float("nan")}],
          "text_offset": [0]}
    choice = _strict(legacy.text("a", lp))["choices"][0]
    assert choice["logprobs"]["token_logprobs"] == [None]
    assert choice["logprobs"]["top_logprobs"] == [{"a": None}]
    body = {"error": {"message": "x", "type": "server_error", "param": None, "code": float("nan")}}
    assert _strict(error_event(body).removesuffix("data: [DONE]\n\n"))["error"]["code"] is None


def test_frames_are_unchanged_otherwise():
    """Finite numbers, text and the compact ASCII framing as before."""
    frame = sse_event({"a": 1.5, "b": -9999.0, "c": "é\u2028", "d": [1, None, True]})
    assert frame == 'data: {"a":1.5,"b":-9999.0,"c":"\\u00e9\\u2028","d":[1,null,true]}\n\n'


def test_a_replicas_nan_energy_reaches_the_stream_as_null():
    """The cloud server with a replica's energy report (``energy="remote"``, as the cluster's
    front end): a NaN figure on the last output made the usage chunk carry ``NaN``."""
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine, FakeOutput
    from tests.cloud_server.api.helpers import ThreadServer

    @dataclasses.dataclass
    class ReplicaOutput(FakeOutput):
        energy: dict | None = None

    class NanReplica(FakeEngine):
        async def _run(self, request_id, ids, params):  # type: ignore[no-untyped-def]
            async for out in super()._run(request_id, ids, params):
                report = {"joules": float("nan"), "source": "nvml", "joules_per_output_token": float("nan")}
                yield ReplicaOutput(**dataclasses.asdict(out), energy=report if out.finished else None)

    server = ThreadServer(create_app(NanReplica, energy="remote")).start()
    try:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=10) as r:
            assert r.status_code == 200
            frames = [line for line in r.iter_lines() if line.startswith("data: ")]
    finally:
        server.stop()
    assert frames[-1] == "data: [DONE]"
    payloads = [_strict(f + "\n\n") for f in frames[:-1]]
    usage = payloads[-1]["usage"]
    assert usage["completion_tokens"] == 3
    # review 31 later: a report that is no number of joules is left out (usage_of), streamed or not
    assert "energy" not in usage
