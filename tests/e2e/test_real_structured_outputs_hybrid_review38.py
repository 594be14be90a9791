"""vLLM's ``structured_outputs`` through the library and ``hybridllm serve`` on real models (review
38): the device is SmolLM2-135M on llama.cpp, the cloud ``hybridllm-cloud`` on SmolLM2-135M. A
choice or a regex holds the answer on both routes (the device masks its own tokens; the cloud route
sends vLLM's field, which the cloud engine serves), the cache serves a held answer again only to
the same format, and the official client's ``extra_body`` (``structured_outputs`` or the older
``guided_*``) reaches the device and the cloud through the proxy. Unheld, the same questions get a
sentence, so the checks below fail if the format is dropped on the way. Before: the library said
"Unknown parameter(s) ['structured_outputs']" and the proxy answered 400."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridllm import HybridLLM

from .conftest import running_proxy

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

LABELS = ["positive", "negative"]
REVIEW = "Is this review positive or negative? I love this phone, it is wonderful!"
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
PHONE_ASK = "Write a US phone number for the office."


@pytest.fixture
def device(smollm2_path: Path) -> Iterator[Any]:
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(str(smollm2_path), n_ctx=1024)
    yield backend  # the client closes it
    backend.close()


@pytest.fixture(scope="module")
def proxy(cloud: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_proxy(cloud.url, tmp_path_factory.mktemp("proxy")) as url:
        yield url


def test_the_library_holds_the_device_and_the_cloud_to_a_choice_and_a_regex(cloud: Any, device: Any) -> None:
    with HybridLLM(edge=device, cloud_url=cloud.url, cache=False) as llm:
        for route in ("edge", "cloud"):
            free = llm.chat(REVIEW, route=route, temperature=0, max_tokens=12)
            assert free.route == route and free.text not in LABELS, free.text  # unheld: a sentence
            held = llm.chat(
                REVIEW, route=route, temperature=0, max_tokens=12, structured_outputs={"choice": LABELS}
            )
            assert held.route == route and held.text in LABELS and held.finish_reason == "stop", held.text
            assert held.parsed is None  # plain text, not JSON
            phone = llm.chat(
                PHONE_ASK, route=route, temperature=0, max_tokens=24, structured_outputs={"regex": PHONE}
            )
            assert re.fullmatch(PHONE, phone.text) and phone.finish_reason == "stop", (route, phone.text)
        # sampled and streamed, the cloud's answer holds too
        with llm.stream(
            PHONE_ASK,
            route="cloud",
            temperature=1.0,
            seed=5,
            max_tokens=24,
            structured_outputs={"regex": PHONE},
        ) as s:
            streamed = "".join(c.text for c in s)
        assert re.fullmatch(PHONE, streamed), streamed


def test_the_cache_serves_a_held_answer_only_to_the_same_format(device: Any, tmp_path: Path) -> None:
    from hybridllm.cache import SemanticCache
    from tests.cache.fakes import FakeEmbedder

    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    llm = HybridLLM(edge=device, cache=cache, cache_min_logprob=-100.0)  # forced tokens: low logprobs
    try:
        first = llm.chat(REVIEW, temperature=0, max_tokens=12, structured_outputs={"choice": LABELS})
        again = llm.chat(REVIEW, temperature=0, max_tokens=12, structured_outputs={"choice": LABELS})
        assert first.route == "edge" and again.route == "cache" and again.text == first.text
        other = llm.chat(REVIEW, temperature=0, max_tokens=12, structured_outputs={"choice": ["good", "bad"]})
        assert other.route == "edge" and other.text in ("good", "bad"), other.text
        plain = llm.chat(REVIEW, temperature=0, max_tokens=12)
        assert plain.route == "edge" and plain.text not in LABELS, plain.text
    finally:
        llm.close()
        cache.close()


def _asked(client: Any, question: str, max_tokens: int, **extra: Any) -> tuple[str, str]:
    """The proxy's answer to ``question`` with ``extra`` in the body, and the route it took."""
    raw = client.chat.completions.with_raw_response.create(
        model="hybridllm",
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=max_tokens,
        extra_body=extra,
    )
    return raw.parse().choices[0].message.content, raw.headers["x-hybridllm-route"]


def test_hybridllm_serve_takes_the_official_clients_vllm_fields(proxy: str) -> None:
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=300)
    text, route = _asked(
        client, REVIEW, 12, structured_outputs={"choice": LABELS}, hybridllm={"route": "edge"}
    )
    assert route == "edge" and text in LABELS, text
    text, route = _asked(client, PHONE_ASK, 24, guided_regex=PHONE, hybridllm={"route": "cloud"})
    assert route == "cloud" and re.fullmatch(PHONE, text), text
    stream = client.chat.completions.create(
        model="hybridllm",
        messages=[{"role": "user", "content": PHONE_ASK}],
        temperature=0,
        max_tokens=24,
        stream=True,
        extra_body={"structured_outputs": {"regex": PHONE}, "hybridllm": {"route": "edge"}},
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert re.fullmatch(PHONE, streamed), streamed
    # what cannot be served is the client's 400, naming the field, before any model runs
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="hybridllm",
            messages=[{"role": "user", "content": REVIEW}],
            max_tokens=4,
            extra_body={"structured_outputs": {"regex": "(ab"}},
        )
    assert info.value.body["param"] == "structured_outputs.regex", info.value.body
