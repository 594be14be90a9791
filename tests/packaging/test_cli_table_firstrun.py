"""The README's command table, as a new user reads it: every option a `hybridllm` command takes is
in its row, and every option a row shows exists. Fast: only the argument parser is built."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from hybridllm.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
# groups documented in their own sections (Router, Semantic cache), not in the table's rows
ELSEWHERE = {"router", "cache"}


def _rows() -> dict[tuple[str, ...], str]:
    """Each table row's command words (``("models", "pull")``) -> the usage text in its first cell."""
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## The command line\n")
    section = text[start : text.index("\n#", start + 1)]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `hybridllm "):
            continue
        usage = line.split("`")[1]
        words = tuple(re.match(r"hybridllm((?: [a-z]+)*)", usage).group(1).split())
        if words and words[0] not in ELSEWHERE:
            rows[words] = usage
    return rows


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every leaf command of ``parser`` with its own parser (aliases once)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    seen = set()
    for name, sub in subs[0].choices.items():
        if id(sub) not in seen and not (not path and name in ELSEWHERE):
            seen.add(id(sub))
            yield from _commands(sub, (*path, name))


def _options(usage: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage))


def test_every_option_of_every_command_is_in_its_row_and_every_row_option_exists() -> None:
    rows = _rows()
    commands = dict(_commands(build_parser()))
    assert sorted(commands) == sorted(rows), "a command without a README row, or a row without a command"
    for words, parser in commands.items():
        usage = rows[words]
        documented = _options(usage)
        if "[same options]" in usage:  # `ask`: chat's options
            documented |= _options(rows[("chat",)])
        takes = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        name = "hybridllm " + " ".join(words)
        assert takes - documented == set(), f"{name}: options missing from the README row"
        assert documented - takes == set(), f"{name}: the README row shows options it does not take"


def test_every_choice_a_row_lists_is_accepted() -> None:
    """`--backend llama_cpp|onnx`, `--precision int4|int8|fp32`: each value a row lists parses."""
    rows = _rows()
    parser = build_parser()
    for words, usage in rows.items():
        for option, values in re.findall(r"\[(--[a-z-]+) ([a-z0-9_]+(?:\\\|[a-z0-9_]+)+)\]", usage):
            for value in values.split("\\|"):
                positional = ["x"] if words[:1] == ("models",) and words[1:] != ("list",) else []
                try:
                    args = parser.parse_args([*words, *positional, option, value])
                except SystemExit:
                    raise AssertionError(f"{usage}: {option} {value} is refused") from None
                assert args.func, (usage, option, value)
