"""vLLM's ``structured_outputs`` in the library and on the cloud route (review 38): ``chat(...,
structured_outputs={"choice": [...]} | {"regex": ...} | {"json": schema})`` is read into the
request's one format slot (a json one is OpenAI's json_schema, a regex or choice one its own
form), keys the cache apart, reaches the device, and on the cloud route goes as vLLM's
``structured_outputs`` (a regex or choice has no OpenAI form) or as ``response_format`` (json).
A cloud that does not know the field says so and what to do
(tests/test_proxy_response_format_review32.py). Before: "Unknown parameter(s)
['structured_outputs']". Fast: fakes and a mock cloud; the real runs are in
tests/e2e/test_real_structured_outputs_hybrid_review38.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybridllm import GenerationParams, HybridLLM, InvalidRequestError

from ._proxy_posting import posting
from .test_proxy_response_format_review32 import MSGS, _mock_cloud
from .test_response_format_review32 import Recording

pytest.importorskip("hybridllm._structured")

CHOICE = {"choice": ["positive", "negative"]}
PHONE = {"regex": r"\(\d{3}\) \d{3}-\d{4}"}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_each_kind_is_read_into_the_format_slot() -> None:
    choice = GenerationParams(structured_outputs=CHOICE)
    assert choice.response_format == {"type": "choice", "choice": ["positive", "negative"]}
    assert choice.structured_outputs is None and not choice.parses_json
    regex = GenerationParams.from_kwargs(structured_outputs=PHONE)
    assert regex.response_format == {"type": "regex", "regex": PHONE["regex"]} and not regex.parses_json
    js = GenerationParams(structured_outputs={"json": SCHEMA})
    assert js.response_format["type"] == "json_schema" and js.parses_json
    assert js.response_format["json_schema"]["schema"] == SCHEMA
    # a copy keeps it (the form is taken back in), and equals the same format asked either way
    assert dataclasses.replace(choice, max_tokens=4).response_format == choice.response_format
    assert GenerationParams(response_format=choice.response_format) == choice


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"regex": "(ab"}, "structured_outputs.regex"),
        ({"choice": []}, "structured_outputs.choice"),
        ({"grammar": "root ::= x"}, "structured_outputs.grammar"),
        ({"regex": "a", "choice": ["a"]}, "structured_outputs"),
        ("yes|no", "structured_outputs"),
    ],
)
def test_what_cannot_be_served_is_a_request_error_naming_the_field(value: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        GenerationParams(structured_outputs=value)
    assert getattr(info.value, "param", None) == param, info.value
    assert not str(info.value).startswith(f"{param}: {param}"), info.value  # said once


def test_it_cannot_stand_beside_a_response_format_or_tools() -> None:
    with pytest.raises(InvalidRequestError, match="structured_outputs and response_format"):
        GenerationParams(structured_outputs=CHOICE, response_format={"type": "json_object"})
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(InvalidRequestError, match="tools cannot be combined"):
        GenerationParams(structured_outputs=CHOICE, tools=[tool])


def test_the_format_keys_the_cache_apart() -> None:
    plain = GenerationParams(temperature=0.0).cache_key()
    assert "structured_outputs" not in plain and "response_format" not in plain  # old files still hit
    two = GenerationParams(temperature=0.0, structured_outputs=CHOICE).cache_key()
    three = GenerationParams(temperature=0.0, structured_outputs={"choice": ["a", "b", "c"]}).cache_key()
    regex = GenerationParams(temperature=0.0, structured_outputs=PHONE).cache_key()
    assert len({json.dumps(k, sort_keys=True) for k in (plain, two, three, regex)}) == 4


def test_a_cached_answer_is_served_only_where_the_format_allows_it() -> None:
    from hybridllm.cache.semantic import _format_check

    check = _format_check(GenerationParams(structured_outputs=CHOICE).cache_key())
    assert check is not None and check("positive") and not check("maybe")
    check = _format_check(GenerationParams(structured_outputs=PHONE).cache_key())
    assert check is not None and check("(555) 123-4567") and not check("555-1234")


def test_the_device_is_given_the_format_and_a_text_answer_is_not_parsed() -> None:
    edge = Recording()
    with HybridLLM(edge=edge, cache=False) as llm:
        done = llm.chat(MSGS, structured_outputs=CHOICE)
        assert edge.params[-1].response_format == {"type": "choice", "choice": ["positive", "negative"]}
        assert done.parsed is None  # plain text: nothing read as JSON
        done = llm.chat(MSGS, structured_outputs={"json": SCHEMA})
        assert done.parsed == {"name": "Ada", "age": 36}  # the fake's JSON, read as asked


def test_the_cloud_route_sends_vllm_fields_for_text_formats_and_response_format_for_json() -> None:
    bodies: list[dict] = []
    with HybridLLM(edge=Recording(), cloud=_mock_cloud(bodies), cache=False) as llm:
        llm.chat(MSGS, route="cloud", structured_outputs=CHOICE)
        assert bodies[-1]["structured_outputs"] == CHOICE and "response_format" not in bodies[-1]
        llm.chat(MSGS, route="cloud", structured_outputs=PHONE)
        assert bodies[-1]["structured_outputs"] == PHONE
        llm.chat(MSGS, route="cloud", structured_outputs={"json": SCHEMA})
        assert bodies[-1]["response_format"]["json_schema"]["schema"] == SCHEMA
        assert "structured_outputs" not in bodies[-1]


def test_serve_reads_the_vllm_fields_into_the_clients_format() -> None:
    edge = Recording()
    with posting(edge, MSGS) as (post, http):
        for fields, kept in [
            ({"structured_outputs": CHOICE}, {"type": "choice", "choice": CHOICE["choice"]}),
            ({"guided_choice": ["a", "b"]}, {"type": "choice", "choice": ["a", "b"]}),
            ({"guided_regex": PHONE["regex"]}, {"type": "regex", "regex": PHONE["regex"]}),
        ]:
            r = post(**fields)
            assert r.status_code == 200, r.text
            assert edge.params[-1].response_format == kept
        r = post(guided_json=SCHEMA)
        assert r.status_code == 200 and edge.params[-1].response_format["json_schema"]["schema"] == SCHEMA
        served = len(edge.params)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        for fields, param in [
            ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs.regex"),
            ({"guided_regex": "(ab"}, "guided_regex"),
            ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
            (
                {"structured_outputs": CHOICE, "response_format": {"type": "json_object"}},
                "structured_outputs",
            ),
            ({"structured_outputs": CHOICE, "tools": [tool]}, "structured_outputs"),
            ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar"),
        ]:
            r = post(**fields)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (fields, r.text)
        assert len(edge.params) == served  # refused at the door: no model ran
        doc = http.get("/openapi.json").json()
    assert "guided_regex" in json.dumps(doc)  # the document lists the fields


def test_the_cli_takes_choice_and_regex(capsys: pytest.CaptureFixture[str]) -> None:
    from hybridllm._cli_sampling import _sampling
    from hybridllm.cli import build_parser

    args = build_parser().parse_args(["ask", "--choice", "yes", "--choice", "no", "ok?"])
    assert _sampling(args)["response_format"] == {"type": "choice", "choice": ["yes", "no"]}
    args = build_parser().parse_args(["chat", "--regex", r"\d+"])
    assert _sampling(args)["response_format"] == {"type": "regex", "regex": r"\d+"}
    for argv, says in [
        (["ask", "--regex", "(ab", "q"], "argument --regex: an unclosed group"),
        (["ask", "--regex", "a", "--choice", "b", "q"], "not allowed with"),
        (["ask", "--json-object", "--choice", "b", "q"], "not allowed with"),
        (["ask", "--choice", " ", "q"], "argument --choice"),
    ]:
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(argv)
        assert info.value.code == 2 and says in capsys.readouterr().err, argv
