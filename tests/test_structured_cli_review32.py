"""Structured output from the CLI and ``Completion.parsed`` (review 32): `hybridllm ask` / `chat`
take --json-object and --json-schema FILE (OpenAI's response_format json_object / json_schema; ask's
--json still prints the Completion as JSON); a bad schema file is a usage error (exit 2) saying what
is wrong and what to do, before any model loads. ``chat()`` (sync and async) sets
``Completion.parsed`` to the answer read as JSON when a format was asked for. Fast: fakes only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, cli
from hybridllm._cli_sampling import _sampling
from hybridllm.cli import build_parser

from .test_response_format_review32 import SCHEMA, Recording

pytest.importorskip("hybridllm._structured")
PERSON = SCHEMA["json_schema"]["schema"]


def test_the_cli_options_give_the_response_format(tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    args = build_parser().parse_args(["ask", "--json-schema", str(schema), "who?"])
    fmt = _sampling(args)["response_format"]
    assert fmt == {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    # OpenAI's json_schema object, and a whole response_format, are taken as they are
    named = tmp_path / "named.json"
    named.write_text(json.dumps({"name": "who", "schema": PERSON, "strict": True}))
    fmt = _sampling(build_parser().parse_args(["chat", "--json-schema", str(named)]))["response_format"]
    assert fmt["json_schema"]["name"] == "who" and fmt["json_schema"]["strict"] is True
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(SCHEMA))
    assert _sampling(build_parser().parse_args(["chat", "--json-schema", str(whole)]))[
        "response_format"]["json_schema"]["name"] == "person"
    assert _sampling(build_parser().parse_args(["chat", "--json-object"]))["response_format"] == {
        "type": "json_object"}
    plain = _sampling(build_parser().parse_args(["ask", "--json", "who?"]))
    assert plain["response_format"] is None  # ask's --json is the Completion printed as JSON, as before


@pytest.mark.parametrize(("content", "says"), [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ("[1, 2]", "holds a JSON array, not a JSON Schema object"),
    (json.dumps({"type": "object", "properties": {"mail": {"type": "string", "format": "ipv6"}}}),
     "properties.mail.format"),
])
def test_a_bad_schema_file_is_a_usage_error_saying_what_to_do(tmp_path: Path, content: str | None, says: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["ask", "--json-schema", str(path), "who?"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--json-schema" in err and says in err, err


def test_json_object_and_json_schema_exclude_each_other(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(PERSON))
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["ask", "--json-object", "--json-schema", str(path), "who?"])
    assert info.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_ask_sends_the_format_to_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    edge = Recording()
    monkeypatch.setattr("hybridllm._client.HybridLLM", lambda **_: HybridLLM(edge=edge, cache=False))
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    assert cli.main(["ask", "--json-schema", str(path), "who?"]) == 0
    assert json.loads(capsys.readouterr().out) == {"name": "Ada", "age": 36}
    assert edge.params[-1].response_format["json_schema"]["schema"] == PERSON
    assert cli.main(["ask", "--json-object", "--json", "who?"]) == 0
    assert json.loads(json.loads(capsys.readouterr().out)["text"]) == {"name": "Ada", "age": 36}
    assert edge.params[-1].response_format == {"type": "json_object"}


def test_chat_sets_parsed_when_a_format_was_asked() -> None:
    with HybridLLM(edge=Recording(), cache=False) as llm:
        assert llm.chat("who?", response_format=SCHEMA).parsed == {"name": "Ada", "age": 36}
        assert llm.chat("who?").parsed is None  # plain text: nothing parsed
        cut = llm.chat("who?", response_format={"type": "json_object"}, max_tokens=1)
        assert cut.finish_reason == "length" and cut.parsed is None  # no JSON: None, no error
        assert "parsed" not in llm.chat("who?", response_format=SCHEMA).to_dict()

    async def main() -> None:
        async with AsyncHybridLLM(edge=Recording(), cache=False) as llm:
            assert (await llm.chat("who?", response_format=SCHEMA)).parsed == {"name": "Ada", "age": 36}
            assert (await llm.chat("who?")).parsed is None

    asyncio.run(main())
