"""bench.tools's bounded pass (review 37): a call is right when it is the one call, names the
expected tool and its arguments fit that tool's schema by jsonschema's check (ranges, enums, the
date format, required keys); values the schema allows are right whatever they are."""

from __future__ import annotations

import pytest

pytest.importorskip("jsonschema")

from bench.tools import BOUNDED, BOUNDED_TOOLS, valid_call  # noqa: E402


@pytest.mark.parametrize(
    ("name", "arguments", "right"),
    [
        ("set_alarm", '{"hour": 23, "minute": 0}', True),
        ("set_alarm", '{"hour": 25, "minute": 0}', False),  # past the maximum
        ("set_alarm", '{"hour": 6, "minute": 5.5}', False),  # not an integer
        ("set_alarm", '{"hour": 06, "minute": 05}', False),  # no JSON number
        ("set_alarm", '{"hour": 6}', False),  # minute required
        ("get_forecast", '{"city": "Paris", "unit": "celsius"}', True),
        ("get_forecast", '{"city": "Paris", "unit": "kelvin"}', False),  # not in the enum
        ("book_table", '{"people": 2, "date": "2026-12-24"}', True),
        ("book_table", '{"people": 2, "date": "tomorrow"}', False),  # not a date
        ("book_table", '{"people": 30, "date": "2026-12-24"}', False),  # a party of 1-12
    ],
)
def test_a_bounded_call_is_scored_by_its_schema(name: str, arguments: str, right: bool) -> None:
    assert valid_call([(name, arguments)], name) is right


def test_a_bounded_call_must_be_the_one_call_of_the_expected_tool() -> None:
    good = ("set_alarm", '{"hour": 7, "minute": 30}')
    assert valid_call([good], "set_alarm")
    assert not valid_call([good, good], "set_alarm")
    assert not valid_call([], "set_alarm")
    assert not valid_call([good], "book_table")


def test_every_bounded_task_names_a_bounded_tool_and_every_tool_is_asked_for() -> None:
    names = {t["function"]["name"] for t in BOUNDED_TOOLS}
    assert {name for _, name in BOUNDED} == names
    for tool in BOUNDED_TOOLS:  # each tool bounds a value: the pass is about bounds
        props = tool["function"]["parameters"]["properties"].values()
        assert any({"minimum", "maximum", "enum", "format"} & set(p) for p in props), tool
