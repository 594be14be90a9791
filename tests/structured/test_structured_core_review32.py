"""The structured-output core (hybridllm/_structured): the grammar a response_format compiles to,
the byte matcher, and the token masks a vocabulary index gives for it."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hybridllm._structured import (
    ResponseFormatError,
    TokenIndex,
    parse_response_format,
    token_bytes_from_tokenizer,
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "home": {"$ref": "#/$defs/Place"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "color", "home"],
    "additionalProperties": False,
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]}},
}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


def synthetic_vocab(seed: int = 0) -> list[bytes | None]:
    """Every single byte, JSON-shaped pieces and random pieces: a vocabulary with the hard cases
    (tokens that close a string and open the next, split UTF-8, escapes, whitespace runs)."""
    rng = random.Random(seed)
    pieces = [bytes((b,)) for b in range(256)]
    pieces += [s.encode() for s in [
        '{"', '"}', '":', '": "', '", "', '",', ' "', '":"', '{}', '[]', '[{', '}]', '},', '],', '\n',
        '\n  ', '  ', '    ', ' true', 'true', 'false', ' null', 'null', ' {', ' [', '12', '3.5',
        '-0', 'e+', '1e', '\\n', '\\"', '\\u00', 'e9', '"name', 'name', 'age', '"age":', 'red', '"red"',
        'green', 'blu', 'city', ' the', 'The', ' of', 'é', '日本', ', "', '"]', '" }', '":[', 'ab"c',
    ]]
    pieces += ["é".encode()[:1], "日".encode()[1:]]  # partial UTF-8
    alphabet = b'{}[]":,.-+eE0123456789 \n\tabcnrtu\\lsfxyz'
    for _ in range(400):
        pieces.append(bytes(rng.choice(alphabet) for _ in range(rng.randint(2, 6))))
    pieces = list(dict.fromkeys(pieces))
    return [None, *pieces, None]  # a control token at each end: id 0 and the last (eos)


VOCAB = synthetic_vocab()
EOS = len(VOCAB) - 1
INDEX = TokenIndex(VOCAB, [EOS])


def brute_force(matcher) -> np.ndarray:
    want = np.array([bool(t) and matcher.accepts(t) for t in VOCAB])
    if matcher.done:
        want[EOS] = True
    if matcher.finished:
        want[:] = False
        want[EOS] = True
    return want


def sample(grammar, rng: random.Random, index: TokenIndex = INDEX, vocab=VOCAB, limit: int = 400,
           check_masks: bool = True) -> tuple[bytes, bool]:
    """Random masked sampling (uniform over the allowed tokens, biased to end): the output's bytes
    and whether it ended at an end-of-output token."""
    m = grammar.matcher()
    out = b""
    for _ in range(limit):
        mask = index.allowed(m)
        if check_masks:
            np.testing.assert_array_equal(mask, brute_force(m), err_msg=repr(out))
        ids = np.flatnonzero(mask)
        assert len(ids), out
        if EOS in ids and rng.random() < 0.5:
            return out, True
        tid = int(rng.choice(ids))
        if tid == EOS:
            return out, True
        assert index.feed_token(m, tid)
        out += vocab[tid]
    return out, False


@pytest.mark.parametrize("seed", range(3))
def test_json_object_masks_match_brute_force_and_outputs_parse(seed):
    grammar = parse_response_format({"type": "json_object"})
    rng = random.Random(seed)
    ended = 0
    for _ in range(4):
        out, done = sample(grammar, rng)
        if done:
            ended += 1
            assert isinstance(json.loads(out), dict), out
            assert grammar.validate(out.decode("utf-8", "replace"))
    assert ended  # the walk reaches the end at least once in four tries


@pytest.mark.parametrize("seed", range(3))
def test_schema_masks_match_brute_force_and_outputs_validate(seed):
    grammar = parse_response_format(schema_format(PERSON))
    rng = random.Random(100 + seed)
    ended = 0
    for _ in range(3):
        out, done = sample(grammar, rng, limit=600)
        if done:
            ended += 1
            value = json.loads(out)
            jsonschema.validate(value, PERSON)
            assert list(value)[:3] == ["name", "age", "color"]  # the schema's order
    assert ended


def test_validate_agrees_with_json_and_schema():
    g = parse_response_format(schema_format(PERSON))
    ok = {"name": "Ann", "age": 31, "color": "red", "home": {"city": "Oslo"}}
    full = {"name": "Ann", "age": 31, "color": "red", "tags": [True], "home": {"city": "Oslo"}, "note": None}
    for text in (json.dumps(ok), json.dumps(ok, indent=2), json.dumps(full)):
        assert g.validate(text), text
    bad = [
        {**ok, "age": 3.5}, {**ok, "color": "pink"}, {**ok, "name": ""}, {**ok, "name": "x" * 13},
        {**ok, "extra": 1}, {k: v for k, v in ok.items() if k != "home"}, {**ok, "home": {}},
        {**ok, "tags": [True] * 4},
    ]
    for value in bad:
        assert not g.validate(json.dumps(value)), value
    assert not g.validate('{"age": 31, "name": "Ann", "color": "red", "home": {"city": "Oslo"}}')  # order
    assert not g.validate(json.dumps(ok) + "x")
    assert not g.validate(json.dumps(ok)[:-1])
    for ws in (" " * 2, "\t", "\n\n", "\n" + " " * 21, "\r\n"):  # one space, or a newline and an indent
        assert not g.validate("{" + ws + json.dumps(ok)[1:]), repr(ws)
    for ws in (" ", "\n", "\n" + " " * 20, "\n\t\t"):
        assert g.validate("{" + ws + json.dumps(ok)[1:]), repr(ws)


def test_json_object_refuses_non_objects_and_bad_json():
    g = parse_response_format({"type": "json_object"})
    m = g.matcher()
    assert not m.accepts(b" ") and not m.accepts(b"\n")  # the answer starts with its value
    for text in ("[]", "1", '"x"', "{a: 1}", '{"a": 01}', '{"a": 1,}', '{"a": "\x01"}', '{"a": "\\x"}',
                 '{"a": tru}', '{"a": 1.}', '{"a": -}'):
        assert not g.validate(text), text
    for text in ("{}", '{"a": {"b": [1, -2.5e-3, "\\u00e9\\n", true, false, null]}}', '{"a":"é日本"}'):
        assert g.validate(text), text


def test_numbers_may_end_or_go_on():
    g = parse_response_format(schema_format({"type": "integer"}))
    m = g.matcher()
    assert m.feed(b"12") and m.done and not m.finished  # "123" is still possible
    assert not m.accepts(b".")
    mask = INDEX.allowed(m)
    assert mask[EOS] and mask[VOCAB.index(b"3")]
    e = parse_response_format(schema_format({"enum": [1, 12, "a"]}))
    m = e.matcher()
    assert m.feed(b"1") and m.done and m.accepts(b"2") and not m.accepts(b"3")


def test_finished_value_allows_only_the_end():
    g = parse_response_format({"type": "json_object"})
    m = g.matcher()
    assert m.feed(b'{"a": 1}') and m.finished
    mask = INDEX.allowed(m)
    assert np.flatnonzero(mask).tolist() == [EOS]
    assert not m.accepts(b" ")


def test_masks_are_memoised_per_state_and_stay_right():
    g = parse_response_format({"type": "json_object"})
    a, b = g.matcher(), g.matcher()
    assert a.feed(b'{"x": "abc') and b.feed(b'{"y": "zz')
    assert a.key == b.key  # the same place in the grammar
    first, second = INDEX.allowed(a), INDEX.allowed(b)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(second, brute_force(b))
    second[:] = False  # a caller's copy: the memo is untouched
    np.testing.assert_array_equal(INDEX.allowed(a), first)


S = "response_format.json_schema.schema"


@pytest.mark.parametrize("fmt, param, words", [
    ({"type": "xml"}, "response_format.type", "json_object"),
    ({"type": "json_schema"}, "response_format.json_schema", "schema"),
    ({"type": "json_object", "json_schema": {}}, "response_format.json_schema", "only allowed"),
    (schema_format({"type": "string", "pattern": "(a)\\1"}), S + ".pattern", "pattern"),
    (schema_format({"type": "object", "properties": {"d": {"type": "string", "format": "ipv6"}}}),
     S + ".properties.d.format", "format"),
    (schema_format({"type": "number", "minimum": 0.5}), S + ".minimum", "minimum"),
    (schema_format({"type": "object", "required": ["x"]}), S + ".required", "x"),
    (schema_format({"$ref": "#/$defs/N", "$defs": {"N": {"type": "object", "properties": {
        "next": {"$ref": "#/$defs/N"}}}}}), S + ".$defs.N.properties.next.$ref", "recursive"),
    (schema_format({"$ref": "#/$defs/Missing"}), S + ".$ref", "Missing"),
    (schema_format({"type": "strnig"}), S + ".type", "strnig"),
    (schema_format({"type": "string", "maxLength": 2, "minLength": 3}),
     S + ".maxLength", "minLength"),
    (schema_format(False), S, "false"),
    (schema_format({"enum": []}), S + ".enum", "non-empty"),
])
def test_unsupported_formats_are_refused_with_the_field(fmt, param, words):
    with pytest.raises(ResponseFormatError) as err:
        parse_response_format(fmt)
    assert err.value.param == param
    assert words in str(err.value)


def test_text_and_none_are_no_grammar_and_keys_are_stable():
    assert parse_response_format(None) is None
    assert parse_response_format({"type": "text"}) is None
    a = parse_response_format(schema_format(PERSON))
    b = parse_response_format(json.loads(json.dumps(schema_format(PERSON))))
    assert a.key == b.key and a.response_format == b.response_format
    reordered = dict(reversed(list(PERSON["properties"].items())))
    c = parse_response_format(schema_format({**PERSON, "properties": reordered}))
    assert c.key != a.key  # the order is part of the grammar
    assert parse_response_format({"type": "json_object"}).key != a.key


def test_additional_properties_true_takes_other_keys_but_declared_ones_once():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}
    g = parse_response_format(schema_format(schema))
    assert g.validate('{"a": 1, "b": [1, "x"]}')
    assert g.validate('{"zz": 1, "a": 2}')
    assert not g.validate('{"a": 1, "a": 2}')
    assert not g.validate('{"a": "x"}')


def _trained(kind: str) -> Tokenizer:
    corpus = [json.dumps({"name": f"n{i} é日", "age": i, "ok": i % 2 == 0, "list": [i, None]})
              for i in range(200)]
    corpus += ["The cat sat on the mat.\n  Tabs\there \\ \"quoted\""] * 20
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|end|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:  # SentencePiece-like: "▁" for spaces, <0xNN> byte tokens for characters not in it
        vocab = {"<|end|>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
        for c in '{}":,\u2581abcdefghijklmnopqrstuvwxyz\\':
            vocab.setdefault(c, len(vocab))
        vocab["\u2581\""] = len(vocab)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[("\u2581", '"')], byte_fallback=True))
        tok.add_special_tokens(["<|end|>"])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
        return tok
    tok.train_from_iterator(corpus, trainer)
    return tok


@pytest.mark.parametrize("kind", ["bytelevel", "sentencepiece"])
def test_token_bytes_are_what_decoding_gives(kind):
    tok = _trained(kind)
    table = token_bytes_from_tokenizer(tok)
    assert len(table) == tok.get_vocab_size(with_added_tokens=True)
    end = tok.token_to_id("<|end|>")
    assert table[end] is None
    text = '{"name": "Zoë 日本", "age": 7, "x": "a\\"b"}'
    ids = tok.encode(text).ids
    assert b"".join(table[i] for i in ids).decode() == text
    if kind == "bytelevel":
        for i in range(tok.get_vocab_size()):
            if table[i] is not None and i != end:
                piece = table[i]
                try:
                    piece.decode()
                except UnicodeDecodeError:  # a lone part of a character decodes to U+FFFD
                    continue
                assert tok.decode([i]).encode() == piece


def test_masked_sampling_with_a_trained_tokenizer_validates():
    tok = _trained("bytelevel")
    table = token_bytes_from_tokenizer(tok)
    end = tok.token_to_id("<|end|>")
    index = TokenIndex(table, [end])
    grammar = parse_response_format(schema_format(PERSON))
    rng = random.Random(7)
    for _ in range(5):
        m = grammar.matcher()
        ids: list[int] = []
        for _ in range(500):
            allowed = np.flatnonzero(index.allowed(m))
            if end in allowed and rng.random() < 0.7:
                break
            tid = int(rng.choice(allowed))
            if tid == end:
                break
            assert index.feed_token(m, tid)
            ids.append(tid)
        if m.done:
            jsonschema.validate(json.loads(tok.decode(ids)), PERSON)


@pytest.mark.parametrize("seed", range(3))
def test_bounded_strings_masks_match_brute_force(seed):
    # the bounded-string shortcut (plain tokens by their characters, quoted ones by the free
    # string's verdict) against feeding every token, with multi-byte and partial characters about
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "minLength": 3, "maxLength": 5},
        "b": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 3},
        "c": {"type": "string", "minLength": 2}}, "required": ["a", "b", "c"]}
    vocab = [*VOCAB[:-1], "é日".encode(), "日本語".encode(), "é".encode()[1:] + b'"', b'ab"', b'abcdef"}',
             "\u00e9\u00e9\"".encode(), None]
    index = TokenIndex(vocab, [len(vocab) - 1])
    grammar = parse_response_format(schema_format(schema))
    rng = random.Random(seed)
    for _ in range(3):
        m = grammar.matcher()
        out = b""
        for _ in range(200):
            mask = index.allowed(m)
            want = np.array([bool(t) and m.accepts(t) for t in vocab])
            want[-1] = m.done
            np.testing.assert_array_equal(mask, want, err_msg=repr(out))
            ids = np.flatnonzero(mask)
            tid = int(rng.choice(ids))
            if tid == len(vocab) - 1:
                jsonschema.validate(json.loads(out), schema)
                break
            assert index.feed_token(m, tid)
            out += vocab[tid]


def test_the_same_format_is_one_grammar_so_masks_repeat_across_requests():
    # each request parses its own format: equal formats must share the grammar's nodes, or a
    # mask memoised for one request never serves the next (a replica parses the dict it is sent)
    first = parse_response_format(json.loads(json.dumps(schema_format(PERSON))))
    again = parse_response_format(json.loads(json.dumps(schema_format(PERSON))))
    assert first is again
    assert parse_response_format(first.response_format) is first
    a, b = first.matcher(), again.matcher()
    assert a.feed(b'{"name": "x') and b.feed(b'{"name": "x')
    assert a.key == b.key
    other = parse_response_format(schema_format({**PERSON, "required": ["name", "age", "color"]}))
    assert other is not first
