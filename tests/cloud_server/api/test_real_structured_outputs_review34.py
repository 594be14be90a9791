"""vLLM's structured output fields on the real server (SmolLM2, loopback) through the official
client, as a vLLM user sends them (``extra_body``): ``structured_outputs`` choice, regex and json,
and the older ``guided_choice``; streamed and not, chat and completions. Before, each was a 400."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import served_smollm2

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


@pytest.fixture(scope="module")
def client(smollm2_path: Path) -> Iterator[object]:
    with served_smollm2(smollm2_path, MODEL, "--max-model-len", "1024") as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=300)


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_a_choice_answers_with_one_label_exactly(client) -> None:
    labels = ["positive", "negative"]
    for review in ("I love this phone, it is wonderful!", "Terrible. It broke on day one."):
        for extra in ({"structured_outputs": {"choice": labels}}, {"guided_choice": labels}):
            r = client.chat.completions.create(
                model=MODEL, max_tokens=10, temperature=0, extra_body=extra,
                messages=_ask(f"Is this review positive or negative? {review}"))
            assert r.choices[0].message.content in labels, r.choices[0].message.content
            assert r.choices[0].finish_reason == "stop"
    # unconstrained, the same question gets a sentence, not a label
    r = client.chat.completions.create(model=MODEL, max_tokens=30, temperature=0,
                                       messages=_ask("Is this review positive or negative? I love it!"))
    assert r.choices[0].message.content not in labels


def test_a_regex_holds_the_answer_streamed_or_not(client) -> None:
    ask = _ask("Write a US phone number for the office.")
    extra = {"structured_outputs": {"regex": PHONE}}
    r = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=30, temperature=0,
                                       extra_body=extra)
    text = r.choices[0].message.content
    assert re.fullmatch(PHONE, text) and r.choices[0].finish_reason == "stop", text
    stream = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=30, temperature=0,
                                            extra_body=extra, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    c = client.completions.create(model=MODEL, prompt="Office phone:", max_tokens=30, temperature=0.8,
                                  seed=3, extra_body=extra)
    assert re.fullmatch(PHONE, c.choices[0].text), c.choices[0].text


def test_json_gives_a_value_of_the_schema(client) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    r = client.chat.completions.create(model=MODEL, max_tokens=80, temperature=0,
                                       messages=_ask("Give the capital of France and its population."),
                                       extra_body={"structured_outputs": {"json": schema}})
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"city", "population"} and isinstance(value["population"], int), value


def test_a_pattern_that_cannot_be_served_is_a_400_naming_it(client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=_ask("hi"), max_tokens=5,
                                       extra_body={"structured_outputs": {"regex": r"(\w)\1"}})
    assert err.value.body["param"] == "structured_outputs.regex"
    assert "backreferences" in err.value.body["message"]
