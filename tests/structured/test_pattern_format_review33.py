"""JSON Schema's ``pattern`` and ``format`` in response_format (review 33).

Before, both were refused (a 400 naming the field): a pydantic model with a ``datetime``, ``date``,
``UUID`` or a constrained string could not be asked for. Now a string's text (escapes read) is held
to the pattern by an NFA over code points, and the served formats are patterns of their own.

Checked here: the regex subset against Python's ``re`` (the same search semantics), the formats
against Python's own parsers, the token masks against brute force (every token fed to a copy of
the matcher) inside pattern strings of every kind (escapes, split UTF-8, length bounds), and
random masked walks that always end in a value whose strings parse as their formats.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import random
import re
import uuid

import numpy as np
import pytest

from hybridllm._structured import ResponseFormatError, TokenIndex, parse_response_format
from hybridllm._structured._regex import FORMATS, Regex

from .test_structured_core_review32 import EOS, INDEX, VOCAB, brute_force, schema_format

S = "response_format.json_schema.schema"


def full(regex: Regex, text: str) -> bool:
    state = regex.start
    for ch in text:
        state = regex.step(state, ord(ch))
        if not state:
            return False
    return regex.accepts(state)


PATTERNS = [
    r"^\d{4}-\d{2}$", r"^[a-z]+(?:-[a-z]+)*$", r"a+b", r"^(foo|bar){2,3}$", r"^\w+@\w+\.com$",
    r"^[^\s]{0,3}$", r"^\$\d+(\.\d\d)?$", r"^a.c$", r"^x{0,5}y?$", r"^[A-Z][a-z]*$",
    r"^[\x41-\x43\u00e9]+$", r"^(a|ab)(c|bcd)$", r"^[-.]+$", r"colou?r", r"^\\d$", r"^a{2,}$",
    r"end\$", r"^[^a-c\d]*$", r"^(?:\.|_)?x+?$", r"^\D\W\S$",
]
ALPHABET = "ab-c.dxyz01239 \n@$\\éABC_foobar"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_regex_subset_searches_as_pythons_re(pattern: str) -> None:
    regex = Regex(pattern)
    rng = random.Random(pattern)
    texts = ["", "ab", "2024-01", "foobar", "a@b.com", "$10.50", "colour", "abcd", "xxxxxy", "éAB"]
    texts += ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 9))) for _ in range(400)]
    # Python's '$' also matches before a final newline and its \\w takes any letter: ECMA-262's
    # do not (end of text; ASCII word characters)
    python = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
    for text in texts:
        assert full(regex, text) == (re.search(python, text, re.ASCII) is not None), (pattern, text)


def test_a_named_group_is_a_group() -> None:
    named, plain = Regex(r"^(?<year>\d\d)-$"), Regex(r"^(\d\d)-$")
    for text in ("12-", "1-", "123-", "ab-", "12"):
        assert full(named, text) == full(plain, text) == (re.fullmatch(r"\d\d-", text) is not None)


def test_length_distances_are_the_fewest_and_most_characters() -> None:
    regex = Regex(r"^(ab|c){1,3}$")
    assert (regex.shortest(regex.start), regex.longest(regex.start)) == (1, 6)
    looped = Regex(r"^a+$")
    assert looped.shortest(looped.start) == 1 and looped.longest(looped.start) == float("inf")


@pytest.mark.parametrize(("pattern", "words"), [
    (r"(a)\1", "backreferences"), (r"a(?=b)", "lookarounds"), (r"\bword", "word boundaries"),
    (r"a^b", "'^'"), (r"a$b", "'$'"), (r"(ab", "unclosed group"), (r"ab)", "unmatched"),
    (r"[a-", "unclosed"), (r"a{2000}", "repeat above"), (r"*a", "nothing to repeat"),
    (r"\p{L}", "escape"), (r"[z-a]", "out of order"), (r"[]", "matches no string"),
    # many optional parts in a row: closures quadratic in the pattern (13 s to compile, before)
    (r"^(a|b?){1000}$", "too complex"), (r"^(x{0,999}y){0,20}$", "too large"),
])
def test_patterns_outside_the_subset_are_refused_naming_the_field(pattern: str, words: str) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
    with pytest.raises(ResponseFormatError) as err:
        parse_response_format(schema_format(schema))
    assert err.value.param == S + ".properties.code.pattern"
    assert words in str(err.value)


@pytest.mark.parametrize(("schema", "param", "words"), [
    ({"type": "string", "format": "ipv6"}, S + ".format", "'ipv6' is not supported"),
    ({"type": "string", "format": "date", "pattern": "^2"}, S + ".format", "both"),
    ({"type": "string", "pattern": r"^\d{4}$", "maxLength": 3}, S + ".maxLength", "matches"),
    ({"type": "string", "format": "uuid", "minLength": 40}, S + ".minLength", "matches"),
    ({"type": "string", "pattern": 7}, S + ".pattern", "must be a string"),
])
def test_impossible_or_unserved_string_rules_are_refused(schema: dict, param: str, words: str) -> None:
    with pytest.raises(ResponseFormatError) as err:
        parse_response_format(schema_format(schema))
    assert err.value.param == param and words in str(err.value)


def _parses_as(fmt: str, value: str) -> bool:
    """Python's own reading of each format (independent of our patterns)."""
    try:
        if fmt == "date":
            datetime.date.fromisoformat(value)
            return len(value) == 10
        if fmt == "date-time":
            return "T" in value and datetime.datetime.fromisoformat(value).tzinfo is not None
        if fmt == "time":
            return datetime.time.fromisoformat(value).tzinfo is not None
        if fmt == "uuid":
            return str(uuid.UUID(value)) == value.lower()
        if fmt == "ipv4":
            ipaddress.IPv4Address(value)
            return True
    except ValueError:
        return False
    raise AssertionError(fmt)


FORMAT_CASES = {
    "date": (["2024-02-29", "1999-12-31"], ["2024-13-01", "2024-1-01", "24-01-01", "2024-01-32"]),
    "date-time": (["2024-05-01T12:30:00Z", "2024-05-01T23:59:59.123+02:00"],
                  ["2024-05-01 12:30:00Z", "2024-05-01T12:30:00", "2024-05-01T24:00:00Z"]),
    "time": (["12:30:00Z", "08:05:09.5-05:30"], ["12:30Z", "25:00:00Z", "12:30:00"]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000", "xyz"]),
    "ipv4": (["192.168.0.1", "0.0.0.0", "255.255.255.255"], ["256.1.1.1", "1.2.3", "01.2.3.4x"]),
    "duration": (["P3Y6M4DT12H30M5S", "PT0.5S", "P2W", "P1D"], ["P", "PT", "P1H", "3D"]),
    "email": (["a.b+c@example.co.uk", "x@y.io"], ["a@b", "@b.com", "a b@c.com", "a@-b.com"]),
    "hostname": (["example.com", "a-1.b"], ["-a.com", "a..b", "a_b.com"]),
    "uri": (["https://example.com/a?b=c", "mailto:x@y.io"], ["example.com", "http://a b", ""]),
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_CASES))
def test_each_served_format_takes_its_values_and_refuses_others(fmt: str) -> None:
    assert set(FORMAT_CASES) == set(FORMATS)
    grammar = parse_response_format(schema_format({"type": "string", "format": fmt}))
    good, bad = FORMAT_CASES[fmt]
    for value in good:
        for ascii_only in (False, True):  # raw, and every character as the escape a writer may use
            text = json.dumps(value, ensure_ascii=ascii_only)
            assert grammar.validate(text), (fmt, text)
        # ASCII written as \\u escapes is JSON, but no writer's: refused (see below)
        assert not grammar.validate('"' + "".join(f"\\u{ord(c):04x}" for c in value) + '"'), value
        if fmt in ("date", "date-time", "time", "uuid", "ipv4"):
            assert _parses_as(fmt, value)
    for value in bad:
        assert not grammar.validate(json.dumps(value)), (fmt, value)
        if fmt in ("date", "date-time", "time", "uuid", "ipv4"):
            assert not _parses_as(fmt, value) or fmt in ("time", "date-time"), value


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "string", "maxLength": 9},
                                    {"type": "string", "pattern": "^[^0-9]*$"}])
def test_a_u_escape_writes_only_what_json_writers_escape(schema: dict) -> None:
    # before, '"\\u0041"' was as good as '"A"', and a model let into such escapes wasted its
    # tokens on them (SmolLM2 wrote a date as "12\\u00391\\u002d1..." and ran out of tokens)
    grammar = parse_response_format(schema_format(schema))
    for text in ['"\\u0041"', '"a\\u0020b"', '"\\u007e"']:
        assert not grammar.validate(text), text
    for text in ['"\\u00e9"', '"\\u000a\\u0022\\u005c"', '"\\u007f"', '"\\u65e5"', '"A\\/"', '"\\n\\t"']:
        assert grammar.validate(text), text
        assert json.loads(text) == json.loads(text)  # (and it is JSON)
    m = grammar.matcher()
    assert m.feed(b'"\\u00') and not m.copy().feed(b"3") and not m.copy().feed(b"4") and m.copy().feed(b"e")


def sample_checked(grammar, rng: random.Random, index: TokenIndex, vocab, limit: int = 500):
    """A masked random walk, each step's mask checked against brute force (bias toward a quote,
    so strings end): the output and whether it reached the end."""
    m = grammar.matcher()
    out = b""
    quoting = np.array([bool(t) and b'"' in t for t in vocab])
    for _ in range(limit):
        mask = index.allowed(m)
        np.testing.assert_array_equal(mask, brute_force(m), err_msg=repr(out))
        ids = np.flatnonzero(mask)
        assert len(ids), ("a dead end", out)
        if mask[EOS]:
            return out, True
        closing = np.flatnonzero(mask & quoting)
        pick = closing if len(closing) and rng.random() < 0.3 else ids
        tid = int(rng.choice(pick))
        assert index.feed_token(m, tid)
        out += vocab[tid]
    return out, False


PATTERNED = {
    "type": "object",
    "properties": {
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "id": {"type": "string", "format": "uuid"},
        "ip": {"type": "string", "format": "ipv4"},
        "code": {"type": "string", "pattern": r"^[A-Z]{2,3}-\d+$", "minLength": 5, "maxLength": 6},
        "word": {"type": "string", "pattern": r"^(é|e)+[a-c]?$", "maxLength": 4},
        "tag": {"type": "string", "pattern": "x"},  # a search: anything around an x
    },
    "required": ["day", "at", "id", "ip", "code", "word", "tag"],
}


def walked_values(schema: dict, seed: int, limit: int) -> list:
    """The values three masked walks (masks checked by brute force) ended with; at least one."""
    grammar = parse_response_format(schema_format(schema))
    rng = random.Random(seed)
    walks = [sample_checked(grammar, rng, INDEX, VOCAB, limit=limit) for _ in range(3)]
    values = [json.loads(out) for out, done in walks if done]
    assert values  # the walk reaches the end at least once in three tries
    return values


@pytest.mark.parametrize("seed", range(4))
def test_pattern_masks_match_brute_force_and_walks_end_in_valid_values(seed: int) -> None:
    for value in walked_values(PATTERNED, seed, limit=900):
        for fmt, key in (("date", "day"), ("date-time", "at"), ("uuid", "id"), ("ipv4", "ip")):
            assert _parses_as(fmt, value[key]), (key, value[key])
        assert re.fullmatch(r"[A-Z]{2,3}-\d+", value["code"]) and 5 <= len(value["code"]) <= 6
        assert re.fullmatch(r"(é|e)+[a-c]?", value["word"]) and len(value["word"]) <= 4
        assert "x" in value["tag"]


def test_pydantic_models_with_dates_uuids_and_patterns_are_served() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Event(pydantic.BaseModel):
        name: str = pydantic.Field(pattern=r"^[A-Z][a-z]+$", max_length=12)
        day: datetime.date
        starts: datetime.datetime
        ref: uuid.UUID

    grammar = parse_response_format(schema_format(Event.model_json_schema()))
    good = Event(name="Launch", day=datetime.date(2025, 3, 1),
                 starts=datetime.datetime(2025, 3, 1, 9, 30, tzinfo=datetime.UTC),
                 ref=uuid.UUID("123e4567-e89b-12d3-a456-426614174000"))
    text = good.model_dump_json()
    assert grammar.validate(text.replace("+00:00", "Z")) or grammar.validate(text)
    assert not grammar.validate(text.replace("Launch", "launch"))
    assert not grammar.validate(text.replace("2025-03-01", "2025-3-1", 1))


# -- integers within minimum / maximum ------------------------------------------------------------

RANGES = [(0, None), (1, 5), (18, None), (None, 0), (-5, 5), (None, -3), (-120, -7), (0, 0), (7, 7),
          (100, 999), (95, 1234), (None, None), (-1000, 250), (3, 10**12)]


@pytest.mark.parametrize(("lo", "hi"), RANGES)
def test_an_integer_range_takes_exactly_the_integers_in_it_as_json_writes_them(lo, hi) -> None:
    from hybridllm._structured._regex import integer_range

    regex = Regex(integer_range(lo, hi))
    rng = random.Random(f"{lo},{hi}")
    numbers = [rng.randint(-3000, 3000) for _ in range(1500)]
    numbers += [rng.randint(-10**13, 10**13) for _ in range(300)]
    numbers += [b + d for b in (lo, hi) if b is not None for d in (-1, 0, 1)]
    for number in numbers:
        within = (lo is None or number >= lo) and (hi is None or number <= hi)
        assert full(regex, str(number)) == within, number
    for text in ("-0", "007", "01", "", "-", "1.0", "+1", "1e3"):
        assert not full(regex, text), text


@pytest.mark.parametrize(("schema", "inside", "outside"), [
    ({"type": "integer", "minimum": 1, "maximum": 5}, [1, 3, 5], [0, 6, -1]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, [1, 9], [0, 10]),
    ({"type": "integer", "minimum": 0.5, "maximum": 2.5}, [1, 2], [0, 3]),  # the integers between
    ({"type": "integer", "exclusiveMinimum": -3.5, "maximum": -1}, [-3, -1], [-4, 0]),
    ({"type": ["integer", "null"], "minimum": 10}, [10, 10**20, None], [9, -10]),
])
def test_integer_bounds_hold(schema: dict, inside: list, outside: list) -> None:
    grammar = parse_response_format(schema_format(schema))
    for value in inside:
        assert grammar.validate(json.dumps(value)), value
    for value in outside:
        assert not grammar.validate(json.dumps(value)), value
    assert not grammar.validate("1.5") and not grammar.validate("-0")


@pytest.mark.parametrize(("schema", "param", "words"), [
    ({"type": "number", "minimum": 0.5}, S + ".minimum", "not a whole number"),
    ({"maximum": 2.5}, S + ".maximum", "not a whole number"),  # no type: read as a number
    ({"type": "number", "exclusiveMinimum": 3, "maximum": 3}, S + ".exclusiveMinimum", "No number"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, S + ".maximum", "No integer"),
    ({"type": "integer", "exclusiveMinimum": True}, S + ".exclusiveMinimum", "boolean form"),
    ({"type": "integer", "maximum": 1e40}, S + ".maximum", "1e30"),
    ({"type": "integer", "multipleOf": 2}, S + ".multipleOf", "multipleOf"),
])
def test_bounds_that_cannot_be_served_are_refused(schema: dict, param: str, words: str) -> None:
    with pytest.raises(ResponseFormatError) as err:
        parse_response_format(schema_format(schema))
    assert err.value.param == param and words in str(err.value)


RANGED = {"type": "object", "properties": {
    "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    "delta": {"type": "integer", "minimum": -20, "exclusiveMaximum": -2},
    "big": {"type": "integer", "minimum": 1000},
    "list": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3},
    "score": {"type": "number", "minimum": 0, "maximum": 1},
    "debt": {"type": "number", "exclusiveMaximum": 0, "minimum": -3},
}, "required": ["stars", "delta", "big", "list", "score", "debt"]}


@pytest.mark.parametrize("seed", range(3))
def test_ranged_integer_masks_match_brute_force_and_walks_stay_in_range(seed: int) -> None:
    for value in walked_values(RANGED, seed, limit=600):
        assert 1 <= value["stars"] <= 5 and -20 <= value["delta"] < -2 and value["big"] >= 1000, value
        assert all(isinstance(x, int) and 0 <= x <= 99 for x in value["list"]), value
        assert 0 <= value["score"] <= 1 and -3 <= value["debt"] < 0, value


NUMBER_RANGES = [((0, True), (1, True)), ((0, False), (1, False)), ((1, True), (5, True)),
                 ((-5, True), (5, False)), (None, (0, True)), (None, (0, False)), ((0, True), None),
                 ((0, False), None), ((-3, False), (-1, True)), ((2, True), (2, True)), (None, None),
                 ((-10, True), None), (None, (-2, False)), ((7, False), (8, False))]


@pytest.mark.parametrize(("lo", "hi"), NUMBER_RANGES)
def test_a_number_range_takes_exactly_the_numbers_in_it(lo, hi) -> None:
    from fractions import Fraction

    from hybridllm._structured._regex import number_range

    regex = Regex(number_range(lo, hi))
    rng = random.Random(f"{lo},{hi}")
    for _ in range(2000):
        text = str(rng.choice([0, 0, 1, 2, 3, 5, 7, 8, 9, 10, 11, 100, rng.randint(0, 5000)]))
        if rng.random() < 0.6:
            text += "." + "".join(rng.choice("0000123456789") for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.5:
            text = "-" + text
        x = Fraction(text)
        within = (lo is None or (x >= lo[0] if lo[1] else x > lo[0])) and (
            hi is None or (x <= hi[0] if hi[1] else x < hi[0]))
        if text.startswith("-") and x == 0:
            within = False  # '-0' forms are not written
        assert full(regex, text) == within, text
    for text in ("1e3", "01", ".5", "1.", "+1"):
        assert not full(regex, text), text


def test_a_bounded_integer_may_end_the_answer_and_a_pydantic_rating_is_served() -> None:
    grammar = parse_response_format(schema_format({"type": "integer", "minimum": 10, "maximum": 12}))
    m = grammar.matcher()
    assert m.feed(b"1") and not m.done and m.feed(b"1") and m.done  # "1" is no answer, "11" is
    pydantic = pytest.importorskip("pydantic")

    class Review(pydantic.BaseModel):
        stars: int = pydantic.Field(ge=1, le=5)
        votes: int = pydantic.Field(gt=0)

    grammar = parse_response_format(schema_format(Review.model_json_schema()))
    assert grammar.validate('{"stars": 4, "votes": 12}')
    assert not grammar.validate('{"stars": 6, "votes": 12}')
    assert not grammar.validate('{"stars": 4, "votes": 0}')


def test_a_prepared_schema_of_many_patterns_keeps_them_all(monkeypatch) -> None:
    # 20 patterns, more than the 16 an index keeps by default: prepared once, none rebuilt while
    # its masks are computed (before, the least recent were dropped and rebuilt at each string)
    from hybridllm._structured import _index

    props = {f"p{i}": {"type": "string", "pattern": f"^{chr(97 + i)}+$"} for i in range(20)}
    grammar = parse_response_format(schema_format(
        {"type": "object", "properties": props, "required": list(props)}))
    assert len(grammar.regexes()) == 20
    index = TokenIndex(VOCAB, [EOS])
    index.prepare(grammar)
    builds = []
    real = _index.TokenIndex._pattern_groups

    def counted(self, regex, raw=False):
        with self._lock:
            if (regex, raw) not in self._groups:
                builds.append(regex.pattern)
        return real(self, regex, raw)

    monkeypatch.setattr(_index.TokenIndex, "_pattern_groups", counted)
    m = grammar.matcher()
    text = "{" + ", ".join(f'"p{i}": "{chr(97 + i) * 2}"' for i in range(20)) + "}"
    for byte in text.encode():
        index.allowed(m)
        assert m.feed(bytes((byte,)))
    assert m.done and builds == []
