"""bench.tools's scoring (review 36): a call is right only when it is the one call, names the expected
function and holds the expected values; the tasks' expected calls fit the tools' own schemas."""

from __future__ import annotations

import pytest

from bench.tools import CALLS, TOOLS, right_call


@pytest.mark.parametrize(
    ("calls", "right"),
    [
        ([("get_weather", '{"city": " paris "}')], True),  # case and spaces around a string
        ([("get_weather", '{"city": "Paris", "unit": "celsius"}')], True),  # more arguments: fine
        ([("get_weather", '{"city": "Lyon"}')], False),
        ([("add", '{"city": "Paris"}')], False),  # another function
        ([("get_weather", '{"city": "Paris"}')] * 2, False),  # one call, not two
        ([], False),
        ([("get_weather", '"Paris"')], False),  # arguments not an object
        ([("get_weather", "{not json")], False),
    ],
)
def test_a_weather_call_is_scored(calls, right) -> None:
    assert right_call(calls, "get_weather", {"city": "Paris"}) is right


def test_numbers_are_compared_by_value_and_bools_are_not_numbers() -> None:
    assert right_call([("add", '{"a": 17.0, "b": 25}')], "add", {"a": 17, "b": 25})
    assert not right_call([("add", '{"a": "17", "b": 25}')], "add", {"a": 17, "b": 25})
    assert not right_call([("add", '{"a": true, "b": 25}')], "add", {"a": 1, "b": 25})


def test_every_task_expects_a_listed_function_and_its_required_arguments() -> None:
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for _, name, expected in CALLS:
        assert name in tools
        assert set(tools[name]["required"]) <= set(expected) <= set(tools[name]["properties"])
