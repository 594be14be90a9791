"""A per-call keyword an OpenAI client takes and this one takes elsewhere says what to do instead
(review 40): ``chat(model=...)``, the openai habit, was told only that 'model' is unknown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hybridllm import HybridLLM, InvalidRequestError
from hybridllm.backends.fake import FakeBackend


@pytest.fixture
def llm() -> Iterator[HybridLLM]:
    client = HybridLLM(edge=FakeBackend(), cache=False)
    yield client
    client.close()


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("model", "HybridLLM(edge_model=..., cloud_model=...)"),
        ("stream", "client.stream("),
        ("n", "call chat() again"),
        ("max_completion_tokens", "'max_tokens'"),
    ],
)
def test_an_openai_keyword_names_this_clients_way(llm: HybridLLM, option: str, says: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        llm.chat("hi", **{option: 1})
    assert says in str(err.value)
    assert "did you mean" not in str(err.value)  # not a typo's hint ('model' read as 'min_p'?)


def test_a_typo_still_gets_the_closest_name(llm: HybridLLM) -> None:
    with pytest.raises(InvalidRequestError, match="did you mean 'max_tokens'"):
        llm.chat("hi", max_token=3)
