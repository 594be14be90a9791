"""A cloud answer cut by the cloud's content filter (OpenAI's and Azure's finish_reason
"content_filter") says so and is not cached. Before, the client read any finish reason other
than "length" as "stop": the cut answer was reported whole, stored in the semantic cache and
served again as whole to the same and similar questions."""

from __future__ import annotations

import json

import httpx
import pytest

from hybridllm import HybridLLM
from hybridllm._types import Decision, GenerationParams
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

MSGS = [{"role": "user", "content": "Tell me a story"}]


def stream_body(reason):
    events = [{"choices": [{"delta": {"content": "Once upon"}, "finish_reason": None}]},
              {"choices": [{"delta": {}, "finish_reason": reason}]},
              {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def cloud_answering(reason, *, stream=True):
    def answer(request):
        if stream:
            return httpx.Response(200, text=stream_body(reason),
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"choices": [{"message": {"content": "Once upon"},
                                                      "finish_reason": reason}],
                                         "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    return CloudBackend(base_url="http://cloud.test", model="m", transport=httpx.MockTransport(answer),
                        backoff_base_s=0.0)


@pytest.mark.parametrize("stream", [True, False], ids=["event stream", "json body"])
@pytest.mark.parametrize("reason, read", [("content_filter", "content_filter"), ("length", "length"),
                                          ("stop", "stop"), ("tool_calls", "stop")])
def test_the_clouds_finish_reason_is_kept_where_it_tells_a_cut(reason, read, stream):
    out = cloud_answering(reason, stream=stream).generate(MSGS, GenerationParams(max_tokens=16))
    assert (out.text, out.finish_reason) == ("Once upon", read)


def test_a_json_answer_without_a_finish_reason_is_whole():
    out = cloud_answering(None, stream=False).generate(MSGS, GenerationParams(max_tokens=16))
    assert out.finish_reason == "stop"


class Cache:
    def __init__(self):
        self.puts = []

    def embed_query(self, msgs):
        return None

    def get(self, msgs, **kw):
        return None

    def put(self, msgs, text, **kw):
        self.puts.append(text)
        return "id"

    def close(self):
        pass


class ToCloud:
    """A router that sends everything to the cloud (a forced route would skip the cache)."""

    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("cloud", "score 0.9", 0.9, msgs)

    def should_escalate(self, lp):
        return False


@pytest.mark.parametrize("reason, stored", [("content_filter", False), ("stop", True)])
def test_a_filtered_cloud_answer_is_not_cached(reason, stored):
    cache = Cache()
    with HybridLLM(edge=FakeBackend(model="edge"), cloud=cloud_answering(reason), cache=cache,
                   policy=ToCloud()) as llm:
        c = llm.chat(MSGS)
    assert (c.route, c.finish_reason, c.text) == ("cloud", reason, "Once upon")
    assert cache.puts == (["Once upon"] if stored else [])
