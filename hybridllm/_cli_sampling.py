"""The options `hybridllm chat` and `hybridllm ask` share: model, sampling, threads, backend, system."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ._cli_options import given
from ._cli_terminal import _UsageError
from ._cpus import usable_cpus
from ._types import MAX_STOP


def _sampling_value(name: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, then check it by the request's own rules, so a bad
    value is a usage error before any model is copied or loaded."""

    def parse(text: str) -> Any:
        from ._exceptions import InvalidRequestError
        from ._types import GenerationParams

        value = convert(text)  # a ValueError: argparse says "invalid int value: 'x'"
        try:
            GenerationParams(**{name: value})
        except InvalidRequestError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    parse.__name__ = getattr(convert, "__name__", name)
    return parse


def _stop_string(text: str) -> str:
    """An argparse type for --stop: an empty one would end every answer before it began."""
    if not text:
        raise argparse.ArgumentTypeError("a stop string cannot be empty")
    return text


def _system_prompt(text: str) -> str:
    """An argparse type for --system: a blank one (`--system "  "`, an unset "$VAR") was sent as a
    system prompt of spaces, or silently dropped when empty; leave the option out for none."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"the system prompt is blank ({text!r}); leave --system out "
                                         "for none")
    return text


def _threads(text: str) -> int:
    """An argparse type for --threads: a whole number of CPU threads that llama.cpp takes, so a bad
    one is a usage error naming the option, not an error about n_threads after parsing."""
    from .backends.llama_cpp import _MAX_THREADS

    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= _MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of CPU threads from 1 to {_MAX_THREADS}, got {text!r} (leave "
            f"--threads out for all {usable_cpus()} cores this process may use)")
    return value


MAX_SCHEMA_BYTES = 1 << 20  # far past any schema a model can follow; a wrong file named, not read whole


def _json_file(path: str, holding: str) -> Any:
    """The JSON in a --json-schema or --tools FILE; a usage error (ArgumentTypeError) that says what
    to give when it cannot be read, is over MAX_SCHEMA_BYTES or is not JSON (``holding``: what the
    file should hold)."""
    import json

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCHEMA_BYTES + 1)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r} ({exc.strerror or exc}); give the path "
                                         f"of a JSON file holding {holding}") from None
    if len(data) > MAX_SCHEMA_BYTES:
        raise argparse.ArgumentTypeError(f"{path!r} is over {MAX_SCHEMA_BYTES >> 20} MiB: give a JSON file "
                                         f"holding {holding}")
    try:
        return json.loads(data)
    except ValueError as exc:  # bad JSON, or bytes that are no UTF-8 text
        raise argparse.ArgumentTypeError(f"{path!r} is not JSON ({exc}); it must hold {holding}") from None


def _json_schema(path: str) -> dict[str, Any]:
    """An argparse type for --json-schema: the file's JSON Schema as OpenAI's response_format,
    checked by the request's rules (what the grammar core does not support is named), so a bad
    file is a usage error before any model loads. The file holds a schema, or OpenAI's
    ``json_schema`` object ({"name", "schema", ...}), or a whole response_format."""
    import re
    from pathlib import Path

    from ._exceptions import InvalidRequestError
    from ._types import GenerationParams

    doc = _json_file(path, "one JSON Schema object, such as {\"type\": \"object\", ...}")
    if not isinstance(doc, dict):
        kind = {"list": "array", "str": "string", "NoneType": "null", "bool": "boolean"}.get(
            type(doc).__name__, "number")
        raise argparse.ArgumentTypeError(f"{path!r} holds a JSON {kind}, not a JSON "
                                         "Schema object ({\"type\": \"object\", ...})")
    if doc.get("type") == "json_schema" and "json_schema" in doc:  # a whole response_format
        fmt = doc
    elif "schema" in doc and "name" in doc:  # OpenAI's json_schema object
        fmt = {"type": "json_schema", "json_schema": doc}
    else:  # a bare schema, named after its file (OpenAI's names: letters, digits, _ and -)
        name = re.sub(r"[^A-Za-z0-9_-]", "_", Path(path).stem)[:64] or "schema"
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": doc}}
    try:
        GenerationParams(response_format=fmt)
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(f"{path!r}: {exc}") from None
    return fmt


def _tools_file(path: str) -> list[dict[str, Any]]:
    """An argparse type for ask's --tools: the file's tools, checked by the request's rules, so a bad
    file is a usage error before any model loads. The file holds OpenAI's ``tools`` array, an object
    with one (``{"tools": [...]}``), or bare functions (``{"name", "description", "parameters"}``)."""
    from ._exceptions import InvalidRequestError
    from ._types import GenerationParams

    doc = _json_file(path, "the tools (OpenAI's tools array)")
    tools = doc.get("tools") if isinstance(doc, dict) and "tools" in doc else doc
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list) or not tools:
        raise argparse.ArgumentTypeError(
            f"{path!r} must hold a JSON array of tools ([{{\"type\": \"function\", \"function\": "
            "{\"name\": ..., \"parameters\": {...}}}]), {\"tools\": [...]}, or functions "
            "({\"name\": ..., \"parameters\": {...}})")
    tools = [{"type": "function", "function": t} if isinstance(t, dict) and "type" not in t
             and "name" in t else t for t in tools]
    try:
        GenerationParams(tools=tuple(tools))
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(f"{path!r}: {exc}") from None
    return tools


def _tool_choice(text: str | None) -> str | dict[str, Any] | None:
    """--tool-choice: auto, none, required, or a tool's name (that function must be called)."""
    if text is None or text in ("auto", "none", "required"):
        return text
    return {"type": "function", "function": {"name": text}}


def _setting(name: str, none: str = "none") -> str:
    """How --help states a default the settings can change: an option left out takes the setting
    (see SETTINGS_EPILOG), and only without one the built-in value, read from the settings' own
    definition so the help cannot drift from it (``none`` says what None means)."""
    import dataclasses

    from ._config import HybridLLMConfig

    builtin = next(f.default for f in dataclasses.fields(HybridLLMConfig) if f.name == name)
    return f"default: the {name} setting, else {none if builtin is None else builtin}"


# shown under `hybridllm chat --help` and `hybridllm ask --help`
SETTINGS_EPILOG = ("An option left out takes its setting from the environment (HYBRIDLLM_<NAME>, "
                   "e.g. HYBRIDLLM_MAX_TOKENS) or config.toml (`hybridllm config show` prints them); "
                   "the value after 'else' is the built-in one.")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    # a blank --model (an unset "$MODEL") was taken as left out: the default model's name shown
    # while loading, then "Unknown model ''" (exit 1) after the settings were read
    p.add_argument("--model", default=None, type=given("an edge model id or .gguf path"),
                   help="edge model: catalog id, path to a .gguf file, or (--backend onnx) a "
                        f"prepared folder ({_setting('edge_model')})")
    p.add_argument("--max-tokens", type=_sampling_value("max_tokens", int), default=None,
                   help=f"most tokens to generate ({_setting('max_tokens')})")
    p.add_argument("--temperature", type=_sampling_value("temperature", float), default=None,
                   help=f"0 = greedy ({_setting('temperature')})")
    p.add_argument("--top-p", type=_sampling_value("top_p", float), default=None,
                   help=f"nucleus sampling, 1 = off ({_setting('top_p')})")
    p.add_argument("--top-k", type=_sampling_value("top_k", int), default=None,
                   help=f"sample from the k likeliest, 0 = off ({_setting('top_k')})")
    p.add_argument("--min-p", type=_sampling_value("min_p", float), default=None,
                   help=f"drop tokens below min_p x the top one, 0 = off ({_setting('min_p')})")
    p.add_argument("--repeat-penalty", type=_sampling_value("repeat_penalty", float), default=None,
                   help=f"1 = off ({_setting('repeat_penalty')})")
    p.add_argument("--presence-penalty", type=_sampling_value("presence_penalty", float), default=None,
                   help="-2..2: lower a token's odds once it is in the answer, 0 = off "
                   f"({_setting('presence_penalty')})")
    p.add_argument("--frequency-penalty", type=_sampling_value("frequency_penalty", float),
                   default=None, help="-2..2: lower a token's odds for each time it is in the answer, "
                                      f"0 = off ({_setting('frequency_penalty')})")
    p.add_argument("--seed", type=_sampling_value("seed", int), default=None,
                   help="sampling seed, for repeatable answers "
                        f"({_setting('seed', 'none: a new draw each time')})")
    p.add_argument("--stop", action="append", default=None, type=_stop_string,
                   help=f"stop string, repeatable up to {MAX_STOP} times (default: none)")
    structured = p.add_mutually_exclusive_group()
    structured.add_argument("--json-object", action="store_true", default=False,
                            help="answer with one JSON object (OpenAI's response_format json_object; "
                                 "default: plain text)")
    structured.add_argument("--json-schema", type=_json_schema, default=None, metavar="FILE",
                            help="answer with JSON that FILE's JSON Schema describes (response_format "
                                 "json_schema; FILE holds the schema, or OpenAI's whole json_schema "
                                 "object with name and schema; default: plain text)")
    structured.add_argument("--choice", action="append", default=None, type=given("a choice"),
                            metavar="TEXT", help="answer with one of the --choice texts exactly, as "
                                                 "plain text; repeat it for each (vLLM's structured_outputs "
                                                 "choice; default: plain text)")
    structured.add_argument("--regex", type=_regex, default=None, metavar="PATTERN",
                            help="answer with plain text the whole of which matches PATTERN (vLLM's "
                                 "structured_outputs regex; default: plain text)")
    p.add_argument("--threads", type=_threads, default=None,
                   help=f"CPU threads ({_setting('n_threads', 'all cores')})")
    p.add_argument("--backend", choices=("llama_cpp", "onnx"), default=None,
                   help="edge runtime: llama_cpp (GGUF) or onnx (ONNX Runtime GenAI) "
                        f"({_setting('edge_backend')})")


def _regex(text: str) -> str:
    """An argparse type for --regex: a pattern the grammar core serves (else a usage error naming
    what to change, before any model loads)."""
    from ._exceptions import InvalidRequestError
    from ._types import GenerationParams

    try:
        GenerationParams(structured_outputs={"regex": text})
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("structured_outputs.regex: ")) from None
    return text


def _response_format(args: argparse.Namespace) -> dict[str, Any] | None:
    """--json-object, --json-schema FILE, --choice TEXT... or --regex PATTERN as the request's
    format (OpenAI's response_format, or a choice or regex in its own form); None for plain text."""
    if getattr(args, "json_schema", None) is not None:
        return args.json_schema  # type: ignore[no-any-return]
    if getattr(args, "choice", None):
        return {"type": "choice", "choice": list(args.choice)}
    if getattr(args, "regex", None) is not None:
        return {"type": "regex", "regex": args.regex}
    return {"type": "json_object"} if getattr(args, "json_object", False) else None


def add_tools(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tools", type=_tools_file, default=None, metavar="FILE",
                   help="tools the model may call, from FILE (OpenAI's tools array as JSON); calls "
                        "print as name({arguments}) lines (default: no tools)")
    p.add_argument("--tool-choice", default=None, metavar="auto|none|required|NAME",
                   type=given("auto, none, required or the name of a tool in the --tools file"),
                   help="with --tools: auto (the default), none, required, or the name of the tool "
                        "to call")


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling options, checked together (the --stop strings too) before anything loads."""
    from ._exceptions import InvalidRequestError
    from ._types import GenerationParams

    tools = getattr(args, "tools", None)
    choice = getattr(args, "tool_choice", None)
    if choice is not None and tools is None:
        raise _UsageError("argument --tool-choice: it needs --tools FILE.")
    options = {"tools": tools, "tool_choice": _tool_choice(choice)} if tools is not None else {}
    options |= {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "top_k": args.top_k, "min_p": args.min_p, "repeat_penalty": args.repeat_penalty,
                "presence_penalty": args.presence_penalty, "frequency_penalty": args.frequency_penalty,
                "seed": args.seed, "stop": tuple(args.stop) if args.stop else None,
                "response_format": _response_format(args)}
    if args.stop and len(args.stop) > MAX_STOP:  # a usage error naming the option, as the others
        raise _UsageError(f"argument --stop: at most {MAX_STOP} stop strings, got {len(args.stop)}.")
    if tools is not None:
        _check_tool_options(args, tools, choice)
    try:
        GenerationParams.from_kwargs(**options)
    except InvalidRequestError as exc:  # options that clash: a usage error (exit 2), as each one's own
        raise _UsageError(str(exc)) from None
    return options


# the option that set the answer's format, by the argparse name it is stored under
_FORMAT_OPTIONS = {"json_object": "--json-object", "json_schema": "--json-schema", "choice": "--choice",
                   "regex": "--regex"}


def _check_tool_options(args: argparse.Namespace, tools: list[dict[str, Any]], choice: str | None) -> None:
    """--tools with a --tool-choice naming no tool in the file, or with a format option, said in the
    options' own terms as a usage error (exit 2) before anything loads. The request's rules said it
    in the library's (`Invalid 'tool_choice': no function named ... in 'tools'`, `tools cannot be
    combined with response_format ... tool_choice='none'`), as an error of the run, exit 1."""
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    if choice not in (None, "auto", "none", "required") and choice not in names:
        raise _UsageError(f"argument --tool-choice: the --tools file has no tool named {choice!r} (its "
                          f"tools: {', '.join(map(str, names))}); name one of them, or give auto, none "
                          "or required.")
    formats = [name for attr, name in _FORMAT_OPTIONS.items() if getattr(args, attr, None)]
    if formats and choice != "none":
        raise _UsageError(f"--tools cannot be combined with {formats[0]}: a tool call's arguments follow "
                          f"the tool's own parameters schema; leave one of them out, or add --tool-choice "
                          f"none for an answer in the {formats[0]} format.")
