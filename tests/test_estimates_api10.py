"""One "about 4 characters a token" estimate for text where no tokenizer is at hand
(hybridllm._types.estimate_text_tokens): ceil(characters / 4), so a non-empty text counts at least
one token. Before, four sites each had their own: the proxy rounded up, the pipeline and the cloud
client rounded a streamed piece down (at least 1: a 7-character piece counted 1 token, not 2), and
estimate_tokens rounded each message down. The cloud client's site is checked over real HTTP by
tests/test_stop_usage_api9.py and tests/test_stop_refused_cloud.py (their counts moved with it)."""

from __future__ import annotations

import pytest

from hybridllm import Decision, HybridLLM
from hybridllm._exceptions import CloudUnavailableError
from hybridllm._types import estimate_text_tokens, estimate_tokens
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend


@pytest.mark.parametrize(("text", "tokens"), [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2),
                                              ("abcdefg", 2), ("abcdefgh", 2), ("abcdefghi", 3)])
def test_the_text_estimate_rounds_up(text, tokens):
    assert estimate_text_tokens(text) == tokens


def test_a_prompts_estimate_is_each_messages_text_plus_four():
    msgs = [{"role": "system", "content": "abcde"}, {"role": "user", "content": "hi"}]
    assert estimate_tokens(msgs) == (2 + 4) + (1 + 4)  # was (1 + 4) + (0 + 4)
    assert estimate_tokens([{"role": "user", "content": ""}]) == 4


class CloudRouter:
    def decide(self, messages, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("cloud", "test: cloud", messages_for_cloud=list(messages))

    def should_escalate(self, mean_logprob: float) -> bool:
        return False


class SevenThenBreak(FakeBackend):
    """Streams one 7-character piece, then the connection drops (no count of its own comes)."""

    def stream(self, messages, params):
        yield Delta("abcdefg")
        raise CloudUnavailableError("connection reset mid-stream")


def test_a_broken_cloud_calls_streamed_piece_is_counted_rounded_up():
    edge = FakeBackend(reply=lambda m: "rest")
    with HybridLLM(edge=edge, cloud=SevenThenBreak(), policy=CloudRouter(), cache=False,
                   max_cloud_tokens_per_day=10_000) as llm:
        c = llm.chat("a question")
        s = llm.stats()
    assert c.route == "cloud->edge" and c.text.startswith("abcdefg")
    prompt = edge.count_tokens([{"role": "user", "content": "a question"}])
    assert s["budget"]["tokens_day"] == prompt + 2  # ceil(7 / 4); was 7 // 4 = 1
    assert s["cloud_tokens"] == prompt + 2
