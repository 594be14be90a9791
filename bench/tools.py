"""Function calling on the device: our tools path against llama-cpp-python's own, on one GGUF.

    python -m bench.tools [--json] [--model ID_OR_GGUF] [--threads 2] [--max-tokens 96]

Two sides on the same GGUF, greedy, taking turns task by task:
``ours`` is ``HybridLLM(edge=LlamaCppBackend(model)).chat(task, tools=TOOLS)``: the model's own chat
template lists the tools (Qwen2.5's Hermes format), its answer is read as calls by
``hybridllm._tool_answers.ToolCallReader``, and a forced ``tool_choice`` holds the tokens to the call's
grammar (``hybridllm._structured``). ``llama_cpp`` is llama-cpp-python's
``create_chat_completion(tools=..., tool_choice=...)`` with its ``chatml-function-calling`` chat
format (its own prompt describing the functions, and a grammar for a named function's arguments).
Four passes: ``auto`` on tasks that need one call and on tasks that need none (small talk: text
expected), ``named`` (the expected function forced), and ``bounded``: auto, with three tools whose
parameters bound their values (an hour 0-23, an enum of units, a date format, a party of 1-12)
and requests that tempt a model past them ("Set an alarm at 25:00", "for 30 people", "in
Kelvin", "tomorrow"); a call is right there when it names the expected tool and its arguments
fit the tool's schema (jsonschema's check, formats included), whatever values it chose. Elsewhere
a call is right when it names the expected function and its arguments hold the expected values
(strings compared case-blind, numbers by value); an answer to small talk is right when it calls
nothing. Reported per side and pass: right answers (of the tasks), answers whose arguments parse
as a JSON object, and mean seconds a task;
``*_right_ratio`` (ours / llama_cpp, > 1: ours is right more often) and ``*_speed_ratio``
(llama_cpp's seconds / ours, > 1: ours is faster). The tasks are ours (hand-written; no public
tool-calling data is in ../shared): a small, easy set that shows the two paths side by side, not
a leaderboard. llama.cpp's OpenMP threads spin while they wait: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from hybridllm._cli_options import positive_int


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = [
    _fn("get_weather", "Get the current weather in a city", {"city": {"type": "string"}}, ["city"]),
    _fn("add", "Add two integers", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
    _fn("convert_currency", "Convert an amount of money from one currency to another",
        {"amount": {"type": "number"}, "from_currency": {"type": "string", "description": "ISO code"},
         "to_currency": {"type": "string", "description": "ISO code"}},
        ["amount", "from_currency", "to_currency"]),
]
# (the question, the function it needs, the argument values the call must hold)
CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("What's the weather like in Paris today?", "get_weather", {"city": "Paris"}),
    ("Is it raining in Tokyo right now?", "get_weather", {"city": "Tokyo"}),
    ("Tell me the current weather in Buenos Aires.", "get_weather", {"city": "Buenos Aires"}),
    ("What is 1234 plus 4321?", "add", {"a": 1234, "b": 4321}),
    ("Add 17 and 25.", "add", {"a": 17, "b": 25}),
    ("What is 300 plus 45?", "add", {"a": 300, "b": 45}),
    ("Convert 100 US dollars to euros.", "convert_currency",
     {"amount": 100, "from_currency": "USD", "to_currency": "EUR"}),
    ("How many Japanese yen is 50 British pounds?", "convert_currency",
     {"amount": 50, "from_currency": "GBP", "to_currency": "JPY"}),
]
SMALL_TALK = [
    "Write a haiku about the sea.",
    "Say hello in French.",
    "What is a good name for a cat?",
    "Tell me a short joke.",
]


# tools whose parameters bound their values (a range, an enum, a date format), and requests that
# tempt a model past the bounds or into JSON that does not parse ("06" is no JSON number)
BOUNDED_TOOLS = [
    _fn("set_alarm", "Set an alarm", {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                      "minute": {"type": "integer", "minimum": 0, "maximum": 59}},
        ["hour", "minute"]),
    _fn("get_forecast", "Get the weather forecast for a city",
        {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        ["city", "unit"]),
    _fn("book_table", "Book a restaurant table",
        {"people": {"type": "integer", "minimum": 1, "maximum": 12},
         "date": {"type": "string", "format": "date"}},
        ["people", "date"]),
]
BOUNDED: list[tuple[str, str]] = [
    ("Set an alarm at 25:00", "set_alarm"),
    ("Set an alarm for 06:05 tomorrow.", "set_alarm"),
    ("Wake me up at 7:30 in the evening.", "set_alarm"),
    ("What's the forecast for Paris in Kelvin?", "get_forecast"),
    ("Forecast for Oslo, please.", "get_forecast"),
    ("Book a table for 30 people on 2026-12-24.", "book_table"),
    ("Book a table for two tomorrow.", "book_table"),
    ("Book a table for four on December 11, 2026.", "book_table"),
]


def valid_call(calls: list[tuple[str, str]], name: str) -> bool:
    """The answer's one call names ``name`` and its arguments fit the tool's schema (jsonschema's
    check, formats included: not the grammar's own)."""
    import jsonschema

    if len(calls) != 1 or calls[0][0] != name:
        return False
    args = _object(calls[0][1])
    schema = next(t["function"]["parameters"] for t in BOUNDED_TOOLS if t["function"]["name"] == name)
    if args is None:
        return False
    try:
        jsonschema.validate(args, schema, format_checker=jsonschema.FormatChecker())
    except jsonschema.ValidationError:
        return False
    return True


PASSES = ("auto", "small_talk", "named", "bounded")


def right_call(calls: list[tuple[str, str]], name: str, expected: dict[str, Any]) -> bool:
    """The answer's one call names ``name`` and its arguments hold the expected values."""
    if len(calls) != 1 or calls[0][0] != name:
        return False
    args = _object(calls[0][1])
    if args is None:
        return False
    for key, want in expected.items():
        got = args.get(key)
        if isinstance(want, str):
            if not isinstance(got, str) or got.strip().casefold() != want.casefold():
                return False
        elif not isinstance(got, int | float) or isinstance(got, bool) or float(got) != float(want):
            return False
    return True


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.tools", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct",
                    help="catalog id or .gguf path of a model whose chat template lists tools")
    ap.add_argument("--threads", type=positive_int, default=2, help="llama.cpp threads (both sides)")
    ap.add_argument("--max-tokens", type=positive_int, default=96, help="answer bound (both sides)")
    args = ap.parse_args(argv)

    from llama_cpp import Llama

    from hybridllm import HybridLLM
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.models import resolve_gguf

    _, path, _ = resolve_gguf(args.model)
    edge = LlamaCppBackend(str(path), n_ctx=4096, n_threads=args.threads)
    if not edge.calls_tools():
        edge.close()
        sys.exit(f"bench.tools: {args.model}'s chat template lists no tools; pick a model whose does "
                 "(qwen2.5-coder-0.5b-instruct).")
    peer = Llama(model_path=str(path), n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads,
                 chat_format="chatml-function-calling", verbose=False)
    settings = {"temperature": 0.0, "max_tokens": args.max_tokens}
    peer_tools: Any = TOOLS  # (llama-cpp-python types them as its TypedDicts)

    Calls = list[tuple[str, str]]

    def ours(question: str, choice: Any, tools: list[dict[str, Any]] = TOOLS) -> tuple[Calls, float]:
        start = time.perf_counter()
        c = llm.chat(question, tools=tools, tool_choice=choice, **settings)
        return [(t.function.name, t.function.arguments) for t in c.tool_calls], time.perf_counter() - start

    def theirs(question: str, choice: Any, tools: Any = peer_tools) -> tuple[Calls, float]:
        start = time.perf_counter()
        r: Any = peer.create_chat_completion(messages=[{"role": "user", "content": question}],
                                             tools=tools, tool_choice=choice or "auto", temperature=0.0,
                                             max_tokens=args.max_tokens)
        calls = r["choices"][0]["message"].get("tool_calls") or []
        made = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        return made, time.perf_counter() - start

    sides = {"ours": ours, "llama_cpp": theirs}
    tally: dict[str, dict[str, list[float]]] = {
        f"{side}_{what}": {"right": [], "parsed": [], "s": []} for side in sides
        for what in PASSES}
    missed: dict[str, list[str]] = {key: [] for key in tally}  # what each side got wrong, and its calls

    def record(key: str, question: str, right: bool, calls: list[tuple[str, str]], seconds: float) -> None:
        tally[key]["right"].append(float(right))
        tally[key]["parsed"].append(float(bool(calls) and all(_object(a) is not None for _, a in calls)))
        tally[key]["s"].append(seconds)
        if not right:
            missed[key].append(f"{question} -> {', '.join(f'{n}({a})' for n, a in calls) or 'text'}")

    with HybridLLM(edge=edge, cache=False) as llm:
        ours("Warm up: what is 1 plus 1?", None)  # (both models' first run pays its load)
        theirs("Warm up: what is 1 plus 1?", None)
        for question, name, expected in CALLS:
            for side, ask in sides.items():  # turns, task by task
                calls, s = ask(question, None)
                record(f"{side}_auto", question, right_call(calls, name, expected), calls, s)
                calls, s = ask(question, {"type": "function", "function": {"name": name}})
                record(f"{side}_named", question, right_call(calls, name, expected), calls, s)
        for question in SMALL_TALK:
            for side, ask in sides.items():
                calls, s = ask(question, None)
                record(f"{side}_small_talk", question, not calls, calls, s)
        for question, name in BOUNDED:
            for side, ask in sides.items():
                calls, s = ask(question, None, BOUNDED_TOOLS)
                record(f"{side}_bounded", question, valid_call(calls, name), calls, s)
    peer.close()

    out: dict[str, Any] = {"model": args.model, "threads": args.threads, "tasks": len(CALLS),
                           "small_talk": len(SMALL_TALK), "bounded": len(BOUNDED)}
    for key, t in tally.items():
        out[f"{key}_right"] = sum(t["right"])
        out[f"{key}_parsed"] = sum(t["parsed"])
        out[f"{key}_s"] = round(sum(t["s"]) / len(t["s"]), 3)
        out[f"{key}_missed"] = missed[key]
    for what in PASSES:
        mine, peer_right = out[f"ours_{what}_right"], out[f"llama_cpp_{what}_right"]
        out[f"{what}_right_ratio"] = round(mine / peer_right, 3) if peer_right else None
        out[f"{what}_speed_ratio"] = round(out[f"llama_cpp_{what}_s"] / out[f"ours_{what}_s"], 3)
    if args.json:
        print(json.dumps(out))
        return
    for key, value in out.items():
        print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
