"""The README as a new user follows it: every command line it shows parses, every module it runs
with ``python -m`` exists and takes the options shown, every ``HYBRIDLLM_*`` variable it names is
read by the code, every setting and default of its Configuration table is the code's, every repo
path it names exists, every ``](#anchor)`` lands on a heading, and every option has ``--help`` text.

Fast: argument parsers only (``python -m`` modules in one subprocess whose ``parse_args`` stops
before anything runs). The command table's rows are held by tests/packaging/test_cli_table_firstrun.py
and the install steps by tests/packaging/test_readme_install.py; this file covers the rest."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import glob
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("hybridllm", "cloud_server", "bench")
COMMAND = re.compile(r"^(hybridllm-cloud|hybridllm|python -m [\w.]+)(?= |$)")
# options without --help text in files outside this change's (hybridllm/cache/); reported
KNOWN_BARE: set[str] = set()  # options allowed to have no help text (none now)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # ID, N, URL: a value the reader fills in


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def readme_commands(text: str) -> list[str]:
    """Every ``hybridllm ...``, ``hybridllm-cloud ...`` and ``python -m X ...`` the README shows, in
    inline code or in a shell block (continuation lines joined, ``$ `` prompts and comments cut)."""
    found = [" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", text)]
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang not in ("", "bash", "sh", "console"):
            continue
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            line = line.strip().removeprefix("$ ")
            found.append(re.split(r"\s+#\s", line)[0].strip().rstrip("&").strip())
    return sorted({c for c in found if COMMAND.match(c)})


def _words(command: str) -> list[str]:
    words = shlex.split(re.sub(r"<\w+>", "x", command))
    return [("1" if PLACEHOLDER.match(w) else w) for w in words]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {}


def _leaf(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    for word in words:
        parser = _subparsers(parser).get(word, parser)
    return parser


def _options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from cloud_server.__main__ import build_parser as cloud_parser
    from hybridllm.cli import build_parser

    return {"hybridllm": build_parser(), "hybridllm-cloud": cloud_parser()}


def _exact(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and its subcommands without abbreviations: the README must name whole options."""
    parser.allow_abbrev = False
    for sub in _subparsers(parser).values():
        _exact(sub)
    return parser


def _usage_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The parser's usage error for ``argv``, or None. A missing required argument is not one: the
    README names commands in prose (`hybridllm-cloud serve --replicas N`) without every option."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code and "arguments are required" not in err.getvalue():
                return err.getvalue().strip().splitlines()[-1]
    return None


# -- command lines -----------------------------------------------------------------------------------


def test_every_hybridllm_command_line_in_the_readme_parses() -> None:
    """`hybridllm ...` and `hybridllm-cloud ...` as shown: concrete lines parse (options, choices,
    value types); usage lines (`[--json]`) show only options their command takes."""
    parsers = {name: _exact(parser) for name, parser in _parsers().items()}
    commands = [c for c in readme_commands(_readme()) if not c.startswith("python -m")]
    assert len(commands) > 20, commands
    problems = []
    for command in commands:
        words = _words(command.replace("\\|", "|"))
        parser = parsers[words[0]]
        if "[" in command:  # usage syntax: every option shown exists on that (sub)command
            shown = _options(command)
            leaf = _leaf(parser, words[1:])
            takes = {o for a in leaf._actions for o in a.option_strings}
            if shown - takes:
                problems.append(f"{command}: {sorted(shown - takes)} not taken by {leaf.prog}")
        elif "..." not in command and len(words) > 1:
            error = _usage_error(parser, words[1:])
            if error:
                problems.append(f"{command}: {error}")
    assert not problems, "\n".join(problems)


def test_router_and_cache_rows_show_their_commands_options() -> None:
    """The Router and Semantic cache tables (which the command table's test leaves to them): a row
    shows no option its command lacks, and every option the command takes is in the row or named
    elsewhere in its section (`router train`'s tuning options are listed after the table)."""
    text = _readme()
    parser = _parsers()["hybridllm"]
    seen = set()
    for title, group in (("Router", "router"), ("Semantic cache", "cache")):
        section = _section(text, title)
        for usage in re.findall(rf"^\| `(hybridllm {group} [a-z]+[^`]*)` \|", section, re.M):
            action = usage.split()[2]
            seen.add((group, action))
            leaf = _subparsers(_subparsers(parser)[group])[action]
            takes = {o for a in leaf._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
            shown = _options(usage)
            assert shown - takes == set(), f"{usage}: options `hybridllm {group} {action}` does not take"
            named = set(re.findall(r"`(--[a-z][a-z-]*)`", section)) | shown
            assert takes - named == set(), f"hybridllm {group} {action}: options the README never names"
    groups = {(g, a) for g in ("router", "cache") for a in _subparsers(_subparsers(parser)[g])}
    assert seen == groups, f"rows without a command or commands without a row: {seen ^ groups}"


_PARSE_ONLY = r"""
import argparse, json, os, runpy, sys
sys.path.insert(0, os.getcwd())
class Parsed(Exception):
    pass
_parse = argparse.ArgumentParser.parse_args
import re
def bare(parser):
    for action in parser._actions:
        name = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from bare(sub)
        elif not action.help and action.help is not argparse.SUPPRESS:
            yield name
        else:
            said = re.search(r"\(default:? (-?[0-9.]+)[;,)]", action.help or "")
            value = action.default
            if said and isinstance(value, (int, float)) and not isinstance(value, bool):
                if float(said.group(1)) != value:
                    yield f"{name}: its help says default {said.group(1)}, the parser {value}"
def parse_args(self, args=None, namespace=None):
    if sys.argv[1:] != ["--help"]:  # --help: only what the help would show, nothing printed
        _parse(self, args, namespace)
    raise Parsed(sorted(set(bare(self))))
argparse.ArgumentParser.parse_args = parse_args
_init = argparse.ArgumentParser.__init__
def init(self, *args, **kwargs):  # the README must name whole options, not prefixes
    _init(self, *args, **{**kwargs, "allow_abbrev": False})
argparse.ArgumentParser.__init__ = init
result = {}
for line in sys.stdin.read().splitlines():
    argv = json.loads(line)
    sys.argv = list(argv)
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=False)
        result[line] = "ran without parsing its arguments"
    except Parsed as exc:
        result[line] = exc.args[0]
    except SystemExit as exc:
        result[line] = f"exit {exc.code}"
    except BaseException as exc:
        result[line] = repr(exc)
print(json.dumps(result))
"""


def parse_module_commands(argvs: list[list[str]]) -> dict[str, str | list[str]]:
    """Run each ``python -m argv[0] argv[1:]`` up to its ``parse_args`` only (``[X, "--help"]``: not
    even that): the options its ``--help`` leaves without a text (a list, empty when all have one),
    or what failed (a string)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PARSE_ONLY], input="\n".join(json.dumps(a) for a in argvs),
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_python_m_command_in_the_readme_runs_our_module_with_options_it_takes() -> None:
    """`python -m bench.serving --json`, `python -m hybridllm.demo --cloud-model ...`: the module
    is ours, exists, parses its arguments with argparse (so `--help` works), takes what is shown,
    and its `--help` (and every benchmark's) says what each option does."""
    argvs = []
    for command in readme_commands(_readme()):
        if not command.startswith("python -m "):
            continue
        words = _words(command)[2:]
        if words[0].split(".")[0] not in OUR_PACKAGES or words[0] == "bench.NAME":
            continue
        path = ROOT.joinpath(*words[0].split("."))
        source = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__main__.py"
        assert source.is_file(), f"{command}: no module {words[0]}"
        assert "parse_args(" in source.read_text(), f"{command}: {source} parses no arguments (no --help)"
        argvs.append(words)
    assert len(argvs) > 15, argvs
    # every benchmark's --help, also those the README names only in its Performance table
    benches = [p.stem for p in (ROOT / "bench").glob("*.py") if "parse_args(" in p.read_text()]
    argvs += [[f"bench.{name}", "--help"] for name in benches]
    results = parse_module_commands(argvs)
    failed = {argv: result for argv, result in results.items() if isinstance(result, str)}
    assert not failed, failed
    bare = {option for result in results.values() for option in result} - KNOWN_BARE
    assert not bare, f"options without --help text, or whose help states another default: {sorted(bare)}"


def test_every_bench_module_named_in_the_performance_table_exists() -> None:
    table = _section(_readme(), "Performance")
    names = set(re.findall(r"^\| `(bench\.\w+)`", table, re.M))
    assert len(names) > 5, names
    for name in names:
        assert (ROOT / "bench" / f"{name.split('.')[1]}.py").is_file(), name


# -- --help texts ------------------------------------------------------------------------------------


def test_every_option_of_every_command_has_help_text() -> None:
    """`--help` tells what each option and argument does (none is a bare name), and a default it
    states (`(default 16)`) is the parser's."""
    bare = []

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in {id(p): p for p in action.choices.values()}.values():
                    walk(sub)
            elif not action.help and action.help is not argparse.SUPPRESS:
                bare.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
            elif said := re.search(r"\(default:? (-?[0-9.]+)[;,)]", action.help or ""):
                value = action.default
                if isinstance(value, int | float) and not isinstance(value, bool) and float(said[1]) != value:
                    bare.append(f"{parser.prog} {action.option_strings}: help says {said[1]}, not {value}")

    for parser in _parsers().values():
        walk(parser)
    assert set(bare) - KNOWN_BARE == set(), bare


# -- environment variables, settings and defaults ----------------------------------------------------


def _code_strings() -> set[str]:
    """Every string constant naming a HYBRIDLLM_ variable in our code, docstrings and other bare
    expressions aside."""
    strings: set[str] = set()
    files = [p for pkg in OUR_PACKAGES for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "tests" / "conftest.py"]
    for path in files:
        source = path.read_text()
        if "HYBRIDLLM_" not in source:
            continue
        tree = ast.parse(source)
        bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        strings |= {
            n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare
        }
    return strings


def test_every_hybridllm_variable_the_readme_names_is_read_by_the_code() -> None:
    """A variable is read under its exact name: as a string in our code, or as HYBRIDLLM_<SETTING>
    for a setting the config reads from the environment."""
    from hybridllm._config import HybridLLMConfig

    named = set(re.findall(r"\bHYBRIDLLM_[A-Z0-9_]*[A-Z0-9]\b", _readme()))
    assert len(named) > 10, named
    settings = {f"HYBRIDLLM_{f.name.upper()}" for f in dataclasses.fields(HybridLLMConfig)}
    strings = _code_strings()
    unread = {v for v in named - settings if not any(re.search(rf"\b{v}\b", s) for s in strings)}
    assert not unread, f"the README names variables no code reads: {sorted(unread)}"


def _default(text: str):
    """The Configuration table's default as a value, or ... for prose (`all cores`)."""
    text = text.strip()
    if text == "none":
        return None
    if text in ("on", "true"):
        return True
    if text in ("off", "false"):
        return False
    if m := re.fullmatch(r"`([^`]+)`", text):
        return m.group(1)
    if m := re.fullmatch(r"(\d+) days", text):
        return int(m.group(1)) * 86400
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return float(text)
    return ...


def test_the_configuration_table_lists_every_setting_with_the_codes_default() -> None:
    from hybridllm._config import HybridLLMConfig

    section = _section(_readme(), "Configuration")
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                for f in dataclasses.fields(HybridLLMConfig)}
    listed = {}
    for names, values in re.findall(r"^\| (`\w+`(?:, `\w+`)*) \| ([^|]*) \|", section, re.M):
        names = re.findall(r"`(\w+)`", names)
        values = values.split(",") if len(names) > 1 and "," in values else [values] * len(names)
        assert len(values) == len(names), (names, values)
        listed.update(zip(names, values, strict=True))
    assert sorted(listed) == sorted(defaults), "settings missing from the table, or not settings"
    checked = 0
    for name, text in listed.items():
        want = _default(text)
        if want is ...:
            continue
        got = defaults[name]
        checked += 1
        if want is None:
            assert got in (None, []), f"{name}: README says none, the code {got!r}"
        elif isinstance(want, float) and not isinstance(got, bool):
            assert got == pytest.approx(want), f"{name}: README {text.strip()}, the code {got!r}"
        else:
            assert got == want, f"{name}: README {text.strip()}, the code {got!r}"
    assert checked > 25, checked


# -- paths and links ---------------------------------------------------------------------------------


def test_every_repo_path_the_readme_names_exists() -> None:
    """`hybridllm/cache/prepare.py`, `tests/cloud_server/engine/test_fuzz_*_batching8.py`: every path
    into the checkout is there (a glob matches something), and a source file is named by its path
    from the checkout's root (`cache/prepare.py` was not)."""
    missing = []
    for span in set(re.findall(r"`([^`\s]+)`", _readme())):
        path = span.rstrip(".,:;").split("::")[0]
        into_checkout = re.match(r"(hybridllm|cloud_server|bench|tests|notebooks)/", path)
        source_file = "/" in path and re.search(r"\.(py|cpp|ipynb)$", path) and path[0] not in "~/.<$"
        if not (into_checkout or source_file):  # a source file is named from the checkout's root
            continue
        pattern = re.sub(r"\{[^}]*\}|<[^>]*>", "*", path)
        if not glob.glob(str(ROOT / pattern)):
            missing.append(span)
    assert not missing, missing


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_anchor_link_lands_on_a_heading() -> None:
    text = _readme()
    outside_code = re.sub(r"```.*?```", "", text, flags=re.S)
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", outside_code, re.M):
        slug, n = _slug(heading), 1
        while slug in anchors:  # GitHub numbers repeated headings: -1, -2, ...
            slug, n = f"{_slug(heading)}-{n}", n + 1
        anchors.add(slug)
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert len(links) > 10, links
    assert {link for link in links if link not in anchors} == set()
