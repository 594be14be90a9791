"""An auto answer's tool calls held to their tools' schemas (review 37): with ``tools`` and
``tool_choice`` "auto" the answer's text is free, and from the moment a call of a listed tool
begins (``{"name": "<tool>"`` at the start, after a ```json line, after a ``<tool_call>`` tag or
an earlier call) its object is held to ``{"name", "arguments": <the tool's parameters>}``; free
again once it closes. Before, only forced calls ("required", a named function) were held: an
auto call could come out with a string for an integer, a missing key, or an unknown one.

Fast: the core's matcher, the token index, the device loop (a fake ONNX model with a scripted
answer) and the engine's row masks; the real models are in the e2e and api tool tests."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hybridllm import GenerationParams
from hybridllm._structured import CallsMatcher, TokenIndex, ToolCallsGrammar, parse_grammar
from hybridllm._tool_plan import ToolPlan


def _fn(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


ADD = _fn("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])
ADD_MANY = _fn("add_many", {"xs": {"type": "array", "items": {"type": "integer"}}}, ["xs"])
WEATHER = _fn("get_weather", {"city": {"type": "string"}}, ["city"])
TOOLS = [ADD, ADD_MANY, WEATHER]


def _hold(tools: list[dict[str, Any]] = TOOLS) -> ToolCallsGrammar:
    grammar = ToolPlan(tools, "auto").grammar()
    assert isinstance(grammar, ToolCallsGrammar)
    return grammar


def _fed(pieces: list[str], grammar: ToolCallsGrammar | None = None) -> list[tuple[bool, bool]]:
    """(accepted, held after it) for each piece fed in turn."""
    m = (grammar or _hold()).matcher()
    return [(m.feed(p.encode()), m.held is not None) for p in pieces]


# ---- the core: when a call is held ------------------------------------------------------------


@pytest.mark.parametrize("lead", ["", "\n ", "```json\n", "<tool_call>\n", "Let me check. <tool_call>"])
def test_a_call_is_held_once_a_listed_tools_name_is_out(lead: str) -> None:
    steps = _fed([lead + '{"name": "ad', 'd"', ', "arguments": {"a": 1', ', "b": 2}', "}", "\n"])
    assert [held for _, held in steps] == [False, True, True, True, False, False]
    assert all(ok for ok, _ in steps)


def test_inside_a_call_the_tools_schema_rules() -> None:
    m = _hold().matcher()
    assert m.feed(b'{"name": "add", "arguments": {"a": ')
    assert not m.accepts(b'"1"')  # a string for an integer
    assert not m.accepts(b'1, "c"')  # a key the tool does not take
    assert not m.accepts(b"1}")  # b is required
    assert not m.done  # the answer may not end inside a call
    assert m.feed(b'1, "b": 2}}') and m.done and m.held is None


def test_the_name_must_be_whole_and_listed() -> None:
    # "add" is held as add, not taken for the start of add_many; "add_many" as add_many
    m = _hold().matcher()
    assert m.feed(b'{"name": "add_many"') and m.held is not None
    assert m.feed(b', "arguments": {"xs": [1, 2]}}') and m.held is None
    # an unlisted name, or JSON that is no call, stays free text: never bent into a call
    for text in ['{"name": "Ada", "age": 36}', '{"city": "Paris"}', '{"name": "addition"}']:
        assert _fed([text]) == [(True, False)], text


def test_a_call_begun_off_the_schema_is_left_as_written() -> None:
    # the name and a wrong key in one piece: the grammar cannot take it, the text stays free
    assert _fed(['{"name": "add", "args": {"a": 1}}', "trailing text"]) == [(True, False), (True, False)]


def test_bare_calls_are_held_only_where_a_call_may_start() -> None:
    # mid-text, a bare object is text; after a tag, or after an earlier call, it is a call
    assert _fed(['Try {"name": "add", "arguments": {}}']) == [(True, False)]
    two = _fed(['{"name": "add", "arguments": {"a": 1, "b": 2}}', '\n{"name": "get_weather"', ", "])
    assert [held for _, held in two] == [False, True, True]
    tagged = _fed(
        [
            'text <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n',
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": ',
            '"x"}}',
        ]
    )
    assert tagged == [(True, False), (True, True), (True, False)]


def test_a_copy_moves_alone() -> None:
    m = _hold().matcher()
    m.feed(b'{"name": "add", "arguments": {"a": 1')
    c = m.copy()
    assert c.feed(b', "b": 2}}') and c.held is None
    assert m.held is not None and m.key != c.key
    assert m.feed(b', "b": 3}}')


def test_the_hold_travels_as_its_dict() -> None:
    hold = _hold()
    back = parse_grammar(json.loads(json.dumps(hold.response_format)))
    assert isinstance(back, ToolCallsGrammar) and back.key == hold.key and back.names == hold.names
    assert isinstance(back.matcher(), CallsMatcher)


def test_a_replica_reads_the_hold_from_its_dict() -> None:
    # a cluster front end sends the grammar as its dict; the replica's SamplingParams parse it
    pytest.importorskip("torch")
    from cloud_server.engine.sampling_params import SamplingParams

    params = SamplingParams(response_format=json.loads(json.dumps(_hold().response_format)))
    assert isinstance(params.response_format, ToolCallsGrammar)
    assert params.response_format.key == _hold().key


def test_a_tool_whose_schema_cannot_be_held_leaves_auto_unheld() -> None:
    odd = {
        "type": "function",
        "function": {
            "name": "odd",
            "parameters": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        },
    }
    assert ToolPlan([ADD, odd], "auto").grammar() is None  # read as written, as before: no 400
    assert ToolPlan([ADD], "required").grammar() is not None


# ---- the token index: free text is never masked -----------------------------------------------

CHARS = [chr(c).encode() for c in range(32, 127)] + [b"\n", b"<tool_call>", b"</tool_call>"]
VOCAB: list[bytes | None] = [*CHARS, None, None]  # ..., a control token, the end of text
CONTROL, EOS = len(CHARS), len(CHARS) + 1


def _index() -> TokenIndex:
    return TokenIndex(VOCAB, [EOS])


def _ids(text: str) -> list[int]:
    return [CHARS.index(ch.encode()) for ch in text]


def test_free_text_allows_every_token_and_a_call_its_grammar() -> None:
    index, m = _index(), _hold().matcher()
    assert index.allowed(m) is index.free and index.free.all()
    assert not index.free.flags.writeable  # shared: a caller cannot spoil it
    assert index.feed_token(m, CONTROL) and index.feed_token(m, EOS)  # free: anything, the end too
    for t in _ids('{"name": "add", "arguments": {"a": '):
        assert index.feed_token(m, t)
    allowed = index.allowed(m)
    assert allowed[_ids("7")[0]] and not allowed[_ids('"')[0]] and not allowed[EOS]
    assert not index.feed_token(m, EOS)  # inside a call: no end
    for t in _ids('7, "b": 8}}'):
        assert index.feed_token(m, t)
    assert index.allowed(m) is index.free


def test_a_marker_the_grammar_never_draws_still_shows_in_free_text() -> None:
    # the cloud engine's vocabulary gives Qwen's <tool_call> no bytes (a template marker: never a
    # grammar's token) while its answer text shows it: the index reads the marker's text
    vocab = list(VOCAB)
    tag = CHARS.index(b"<tool_call>")
    vocab[tag] = None
    ids = [*_ids("Sure. "), tag, *_ids('\n{"name": "add"')]
    for shown, held in (({tag: b"<tool_call>"}, True), (None, False)):
        index, m = TokenIndex(vocab, [EOS], shown=shown), _hold().matcher()
        assert all(index.feed_token(m, t) for t in ids)
        assert (m.held is not None) is held


def test_the_engine_index_reads_the_tokenizers_markers() -> None:
    pytest.importorskip("torch")
    from cloud_server.engine.structured import build_index

    tag = CHARS.index(b"<tool_call>")
    vocab = [b if i != tag else None for i, b in enumerate(VOCAB)]
    tokenizer = SimpleNamespace(
        structured_token_bytes=lambda: vocab,
        marker_bytes=lambda: {tag: b"<tool_call>", 10_000: b"<past the head>"},
    )
    index = build_index(tokenizer, len(vocab), [EOS])
    m = _hold().matcher()
    for t in [*_ids("Ok "), tag, *_ids('{"name": "add"')]:
        index.feed_token(m, t)
    assert m.held is not None


# ---- the device loop: a fake ONNX model writes an off-schema call -----------------------------


def _scripted_onnx(script: str) -> Any:
    """An OnnxBackend whose model wants to write ``script`` (then end): the next character of it
    gets the top logit; below it, digits, then the rest (a model's second choices)."""
    from hybridllm.backends.onnx import OnnxBackend
    from hybridllm.backends.structured import DeviceFormats
    from hybridllm.prompts import PromptFormat

    backend = OnnxBackend.__new__(OnnxBackend)
    backend._model = object()
    backend._lock = threading.Lock()
    backend._n_ctx = 4096
    backend._eos_ids = {EOS}
    backend._formats = DeviceFormats(lambda: (VOCAB, {EOS}))
    backend.prompt_format = PromptFormat(chat_template=None, bos_token="", eos_token="")
    backend.tokenize = lambda messages, prefix="", tools=None: [0]  # type: ignore[method-assign]
    backend._tok = SimpleNamespace(
        create_stream=lambda: SimpleNamespace(decode=lambda t: (VOCAB[t] or b"").decode())
    )
    base = np.zeros(len(VOCAB), dtype=np.float32)
    base[_ids("0123456789")] = 2.0
    base[_ids("}")] = 1.0

    def logits(seq: list[int], closed_message: str = "") -> np.ndarray:
        done = len(seq) - 1
        row = base.copy()
        row[_ids(script[done])[0] if done < len(script) else EOS] = 10.0
        return row

    backend._logits = logits  # type: ignore[method-assign]
    return backend


MSGS = [{"role": "user", "content": "add 1 and 2"}]


def test_the_device_holds_an_auto_call_to_its_tools_schema() -> None:
    # the model writes a string for an integer: held, the quote is refused and a digit comes
    script = '{"name": "add", "arguments": {"a": "1", "b": 2}}'
    backend = _scripted_onnx(script)
    unheld = backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=80))
    assert unheld.text == script  # no tools: the model's text as it wrote it
    out = backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=80, tools=[ADD]))
    call = json.loads(out.text)
    assert call["name"] == "add" and isinstance(call["arguments"]["a"], int), out.text
    assert _hold([ADD]).call.validate(out.text)
    assert not _hold([ADD]).call.validate(unheld.text)  # (the check can tell them apart)


@pytest.mark.parametrize(
    "script", ['Hello! {"name": "Ada"} is JSON.', '{"name": "Ada", "age": 36}', "No tool needed: 2 + 2 = 4."]
)
def test_the_device_leaves_text_that_is_no_call_as_written(script: str) -> None:
    backend = _scripted_onnx(script)
    out = backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=80, tools=TOOLS))
    assert out.text == script


def test_the_llama_processor_leaves_free_text_alone() -> None:
    from hybridllm.backends.structured import DeviceFormats

    constraint = DeviceFormats(lambda: (VOCAB, {EOS})).start(GenerationParams(tools=[ADD]))
    constraint.bind()
    scores = np.arange(len(VOCAB), dtype=np.float32)
    assert constraint.free and constraint.allowed(len(VOCAB)) is None
    constraint.logits_processor()(None, scores)
    assert np.array_equal(scores, np.arange(len(VOCAB)))  # untouched
    for t in _ids('{"name": "add", "arguments": {"a": '):
        constraint.feed(t)
    constraint.logits_processor()(None, scores)
    constraint.check()
    assert np.isfinite(scores[_ids("5")[0]]) and not np.isfinite(scores[_ids('"')[0]])
    assert not constraint.finished


# ---- the engine: rows of free text get no mask ------------------------------------------------


def _row(matcher: Any, drafts: list[int] = ()) -> Any:  # type: ignore[assignment]
    seq = SimpleNamespace(matcher=matcher, token_ids=[0, *drafts], num_tokens=1 + len(drafts))
    return SimpleNamespace(seq=seq, num_outputs=1 + len(drafts), num_lookahead=len(drafts))


def test_engine_rows_are_masked_only_inside_a_call() -> None:
    pytest.importorskip("torch")
    from cloud_server.engine.structured import row_masks

    index = _index()
    free = _hold().matcher()
    assert row_masks([_row(free)], index, "cpu") is None  # nothing to mask this step
    held = _hold().matcher()
    held.feed(b'{"name": "add", "arguments": {"a": ')
    masks = row_masks([_row(free), _row(held)], index, "cpu")
    assert masks[0] is None and bool(masks[1][_ids("3")[0]]) and not bool(masks[1][_ids('"')[0]])
    # a draft that begins a call: the rows after it are masked
    drafts = _ids('{"name": "add", "arguments": {"a": ')
    masks = row_masks([_row(_hold().matcher(), drafts)], index, "cpu")
    assert masks[0] is None and masks[-1] is not None and not bool(masks[-1][_ids('"')[0]])


def test_an_engine_without_token_bytes_drops_the_hold_but_refuses_a_format() -> None:
    # its tokenizer cannot give token bytes: a response_format is a 400 there, as before, while
    # an auto tools request is answered unheld (its calls read as written), not refused
    pytest.importorskip("torch")
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.exceptions import InvalidRequestError as EngineRequestError

    engine = SimpleNamespace(spec=SimpleNamespace(draft=None), tokenizer=object(), max_model_len=64)
    auto = SamplingParams(response_format=_hold(), max_tokens=8)
    hold = auto.response_format
    LLMEngine.check_request(engine, [1, 2], auto)  # type: ignore[arg-type]
    served = LLMEngine._served(engine, auto)  # type: ignore[arg-type]
    assert served.response_format is None and served.max_tokens == 8
    assert auto.response_format is hold  # the caller's params (maybe shared by prompts) unchanged
    schema = SamplingParams(response_format={"type": "json_object"}, max_tokens=8)
    with pytest.raises(EngineRequestError, match="token's bytes"):
        LLMEngine.check_request(engine, [1, 2], schema)  # type: ignore[arg-type]
