"""The `hybridllm` command: chat, ask, models, and the router / cache / serve groups.

Every error a user can cause is a HybridLLMError: it is printed on one line and the command exits
with status 1 (2 for usage errors, 130 on Ctrl-C). Set HYBRIDLLM_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ._cli_options import WholeNameParser
from ._cpus import usable_cpus
from ._exceptions import CloudError, ContextWindowExceededError, HybridLLMError
from ._types import MAX_STOP

# Command groups that live beside the code they drive; each module has register(subparsers).
_GROUPS = ("hybridllm.router._cli", "hybridllm.cache._cli", "hybridllm._serve_cli")


class _UsageError(HybridLLMError):
    """A command line that cannot work, found after parsing: exit status 2, like argparse's own."""


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
    p.add_argument("--model", default=None,
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
    p.add_argument("--seed", type=_sampling_value("seed", int), default=None,
                   help="sampling seed, for repeatable answers "
                        f"({_setting('seed', 'none: a new draw each time')})")
    p.add_argument("--stop", action="append", default=None, type=_stop_string,
                   help=f"stop string, repeatable up to {MAX_STOP} times (default: none)")
    p.add_argument("--threads", type=_threads, default=None,
                   help=f"CPU threads ({_setting('n_threads', 'all cores')})")
    p.add_argument("--backend", choices=("llama_cpp", "onnx"), default=None,
                   help="edge runtime: llama_cpp (GGUF) or onnx (ONNX Runtime GenAI) "
                        f"({_setting('edge_backend')})")


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling options, checked together (the --stop strings too) before anything loads."""
    from ._types import GenerationParams

    options = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
               "top_k": args.top_k, "min_p": args.min_p, "repeat_penalty": args.repeat_penalty,
               "seed": args.seed, "stop": tuple(args.stop) if args.stop else None}
    if args.stop and len(args.stop) > MAX_STOP:  # a usage error naming the option, as the others
        raise _UsageError(f"argument --stop: at most {MAX_STOP} stop strings, got {len(args.stop)}.")
    GenerationParams.from_kwargs(**options)
    return options


def _client(args: argparse.Namespace) -> Any:
    from ._client import HybridLLM
    from ._config import load_config
    from ._progress import ProgressBar

    # --model wins; otherwise the settings' own order (environment, config.toml, the default)
    # decides, so edge_model in config.toml is honoured
    model = args.model or load_config().edge_model
    backend = {"edge_backend": args.backend} if getattr(args, "backend", None) else {}
    return HybridLLM(edge_model=args.model, n_threads=args.threads,
                     progress=ProgressBar(f"Preparing {model}"), **backend)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


def _style(text: str, code: str, stream: Any = None) -> str:
    """``text`` in an ANSI style when ``stream`` (default stdout) is a terminal that takes colour:
    never into a pipe or file, nor under NO_COLOR (https://no-color.org) or TERM=dumb."""
    stream = sys.stdout if stream is None else stream
    if not _isatty(stream) or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


def _note(text: str) -> None:
    """A status line for the person at the terminal: dim, on stderr, so stdout holds only answers."""
    print(_style(text, "2", sys.stderr), file=sys.stderr, flush=True)


def _text(value: str) -> str:
    """Text from argv or stdin as well-formed Unicode: bytes that are not UTF-8 (which Python keeps
    as lone surrogates) become U+FFFD instead of failing the request."""
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte
        return value.encode("utf-8", "replace").decode("utf-8")


def _decode_stdin_leniently() -> None:
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="surrogateescape")  # _text() then turns the bad bytes into U+FFFD
        except (ValueError, OSError):
            pass


def trace_line(c: Any) -> str:
    tps = f"{c.tokens_per_s:.0f} tok/s" if c.tokens_per_s else "- tok/s"
    ttft = f"TTFT {c.ttft_ms:.0f} ms" if c.ttft_ms is not None else "TTFT -"
    return (f"[{c.route} · {c.model} · {ttft} · {tps} · {c.usage.completion_tokens} tokens · "
            f"{c.reason}]")


def _prompt(args: argparse.Namespace) -> str:
    """The prompt: the argument, or stdin when it is ``-`` or left out (``echo q | hybridllm ask``)."""
    if args.prompt is not None and args.prompt != "-":
        # refused here, before the models load, as an empty stdin is (exit 2): `ask ""` used to
        # build the client first and then fail in it with exit 1
        if not args.prompt.strip():
            raise _UsageError('the prompt is empty: hybridllm ask "PROMPT".')
        return _text(args.prompt)
    if sys.stdin is None or sys.stdin.isatty():
        raise _UsageError("ask needs a prompt: hybridllm ask \"PROMPT\", or pipe it in "
                          "(echo PROMPT | hybridllm ask).")
    _decode_stdin_leniently()
    text = _text(sys.stdin.read()).strip()
    if not text:
        raise _UsageError("the prompt read from stdin is empty.")
    return text


def _messages(args: argparse.Namespace, prompt: str) -> Any:
    if not args.system:
        return prompt
    return [{"role": "system", "content": _text(args.system)}, {"role": "user", "content": prompt}]


def cmd_ask(args: argparse.Namespace) -> int:
    sampling = _sampling(args)
    messages = _messages(args, _prompt(args))
    with _client(args) as llm:
        if args.json:
            print(json.dumps(llm.chat(messages, **sampling).to_dict()))
            return 0
        stream = llm.stream(messages, **sampling)
        shown = False
        try:
            for chunk in stream:
                print(chunk.text, end="", flush=True)
                shown = shown or bool(chunk.text)
        except (KeyboardInterrupt, HybridLLMError):
            if shown:  # end the partial answer's line, so "interrupted" or the error is not glued to it
                print(flush=True)
            raise
        print()
        if stream.completion is not None:
            _note(trace_line(stream.completion))
    return 0


CHAT_HELP = ("/reset clears the conversation, /exit (or Ctrl-D) quits, /help shows this; "
             "Ctrl-C stops an answer.")
_COMMAND = re.compile(r"/[A-Za-z?]+")


def _fit(llm: Any, history: list[dict[str, str]], base: int, max_tokens: int | None, *,
         cloud_failed: bool = False) -> int:
    """Drop the oldest turns (never the system prompt nor the new question) until the conversation
    leaves room for the answer in the device model's context; how many messages went. With a cloud
    configured a long conversation goes there whole, so nothing is dropped unless the cloud could
    not take it (``cloud_failed``): then the device answers what fits."""
    if llm.cloud is not None and not cloud_failed:
        return 0
    from .backends.base import call_guarded

    edge = llm.edge
    # a closed backend, or a custom one whose property or tokenizer fails, raises here as the
    # request itself would (an EdgeError naming the backend): the chat shows it on one line and
    # goes on, instead of ending on an "internal error"
    limit = call_guarded(lambda: getattr(edge, "context_length", None), edge, "edge")
    if not limit or not callable(getattr(edge, "tokenize", None)):
        return 0
    room = min(max_tokens or llm.config.max_tokens, limit // 2)
    dropped = 0
    while (len(history) - base > 1
           and len(call_guarded(edge.tokenize, edge, "edge", history)) + room > limit):
        del history[base]  # the oldest user turn, then its answer
        if len(history) - base > 1 and history[base]["role"] == "assistant":
            del history[base]
            dropped += 1
        dropped += 1
    return dropped


def _answer(llm: Any, history: list[dict[str, str]], sampling: dict[str, Any], parts: list[str],
            **options: Any) -> Any:
    """Stream one answer to stdout, collecting its text in ``parts``; the finished stream."""
    stream = llm.stream(history, **sampling, **options)
    for chunk in stream:
        parts.append(chunk.text)
        print(chunk.text, end="", flush=True)
    return stream


def cmd_chat(args: argparse.Namespace) -> int:
    sampling = _sampling(args)
    if sys.stdin is None:  # started with stdin closed (`<&-`, a service): input() could never work
        raise _UsageError("chat reads its questions from stdin, which is closed; run it on a "
                          "terminal, pipe the questions in, or use hybridllm ask \"PROMPT\".")
    interactive = sys.stdin is not None and sys.stdin.isatty()
    _decode_stdin_leniently()
    with _client(args) as llm:
        history: list[dict[str, str]] = []
        if args.system:
            history.append({"role": "system", "content": _text(args.system)})
        base = len(history)
        failed = False
        # the prompt goes where the person looks: with stdout redirected (`hybridllm chat > out`)
        # input() would write it into the file between the answers, so stderr takes it there
        to = sys.stdout if _isatty(sys.stdout) else sys.stderr
        prompt = _style("you> ", "1", to)
        if interactive and to is sys.stdout:
            try:
                import readline  # noqa: F401 - line editing and the arrow keys' history for input()
            except ImportError:
                pass
            else:  # readline must be told which bytes of the prompt take no room on the line
                prompt = re.sub(r"(\x1b\[[0-9;]*m)", "\x01\\1\x02", prompt)
        if interactive:
            _note(f"hybridllm chat with {llm.edge.model}. {CHAT_HELP}")
        interrupted = False  # Ctrl-C at the prompt: a second one in a row quits
        while True:
            try:
                if interactive and to is not sys.stdout:
                    print(prompt, end="", file=to, flush=True)
                line = input(prompt) if interactive and to is sys.stdout else input()
            except EOFError:
                if interactive:
                    print(file=to)
                return 1 if failed else 0
            except KeyboardInterrupt:
                if interrupted or not interactive:
                    raise
                interrupted = True
                print(file=to)
                _note("(press Ctrl-C again, Ctrl-D or type /exit to quit)")
                continue
            interrupted = False
            text = _text(line).strip()
            if not text:
                continue
            if _COMMAND.fullmatch(text.split()[0]):
                command = text.split()[0].lower()
                if command in ("/exit", "/quit", "/bye"):
                    return 1 if failed else 0
                if command == "/reset":
                    del history[base:]
                    _note("(conversation cleared)")
                elif command in ("/help", "/?"):
                    print(CHAT_HELP)
                else:
                    _note(f"unknown command {command}; {CHAT_HELP}")
                    failed = failed or not interactive  # a piped question refused, not answered: exit 1
                continue
            history.append({"role": "user", "content": text})
            parts: list[str] = []
            try:
                try:
                    dropped = _fit(llm, history, base, sampling["max_tokens"])
                    if dropped:
                        _note(f"(the conversation outgrew the model's context: dropped its {dropped} "
                              "oldest messages; /reset starts afresh)")
                    stream = _answer(llm, history, sampling, parts)
                except (ContextWindowExceededError, CloudError) as exc:
                    # too long for the device, and the cloud could not take it (unavailable, failed,
                    # budget spent: a CloudError with the prompt's numbers; privacy): the device
                    # answers the most recent turns instead
                    too_long = not isinstance(exc, CloudError) or exc.context_length is not None
                    dropped = 0
                    if too_long:
                        dropped = _fit(llm, history, base, sampling["max_tokens"], cloud_failed=True)
                    if not dropped:
                        raise
                    if parts:  # the cloud's broken-off start: the device's answer replaces it
                        print(flush=True)
                        parts.clear()
                    _note(f"(the conversation is too long for the device model and the cloud could not "
                          f"take it: dropped its {dropped} oldest messages and the device answers; "
                          "/reset starts afresh)")
                    stream = _answer(llm, history, sampling, parts, route="edge")
            except KeyboardInterrupt:  # stop this answer, keep the session
                print(flush=True)
                if not interactive:  # a piped chat ends, as Ctrl-C at its next read would (130),
                    raise            # rather than going on to the next question
                if not parts:
                    history.pop()
                    _note("(stopped before the answer began; the question is not kept)")
                    continue
                # the conversation goes on from what was shown: the question and the part answered
                history.append({"role": "assistant", "content": "".join(parts)})
                _note("(stopped; the partial answer stays in the conversation, /reset clears it)")
                continue
            except HybridLLMError as exc:
                if parts:
                    print(flush=True)
                print(f"error: {exc}", file=sys.stderr, flush=True)
                history.pop()
                failed = not interactive  # a script learns of it from the exit status
                continue
            print()
            done = stream.completion
            if done is not None:
                history.append({"role": "assistant", "content": done.text})
                _note(trace_line(done))


def cmd_models_list(args: argparse.Namespace) -> int:
    from .models.remove import disk_usage, human_size
    from .models.store import UNVERIFIED, load_catalog, pull_state

    rows: list[dict[str, Any]] = []
    for spec in load_catalog().values():
        size = spec.total_size
        state = pull_state(spec.id)
        rows.append({"id": spec.id, "kind": spec.kind, "architecture": spec.architecture,
                     "chat_format": spec.chat_format, "license": spec.license,
                     "size_mb": round(size / 1e6, 1) if size else None, "package": spec.package,
                     "pulled": state == "yes", "state": state, "disk_bytes": disk_usage(spec.id),
                     "description": spec.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    w = max([len("ID"), *(len(str(r["id"])) for r in rows)]) + 2  # the longest id sets the column
    pw = len(UNVERIFIED) + 1
    print(f"{'ID':<{w}}{'KIND':<11}{'ARCH':<9}{'SIZE':>9}  {'PULLED':<{pw}}{'ON DISK':>10}  LICENSE")
    for r in rows:
        shown = f"{r['size_mb']} MB" if r["size_mb"] else "-"
        disk = human_size(r["disk_bytes"]) if r["disk_bytes"] else "-"
        print(f"{r['id']:<{w}}{r['kind']:<11}{r['architecture']:<9}{shown:>9}  "
              f"{r['state']:<{pw}}{disk:>10}  {r['license']}")
    total = sum(r["disk_bytes"] for r in rows)
    # the total's size sits under ON DISK; `hybridllm models remove ID` frees a model's share
    print(f"{'total':<{w}}{'on disk':<{11 + 9 + 9 + 2 + pw}}{human_size(total) if total else '-':>10}")
    unverified = [r["id"] for r in rows if r["state"] == UNVERIFIED]
    if unverified:  # a data dir copied from elsewhere: its files are there, just not hashed here yet
        _note(f"unverified: {', '.join(unverified)}: the files are in place (a data dir copied from "
              "elsewhere?) but not yet checked here against the catalog's sha256; `hybridllm models "
              "verify ID` checks one now, and its first use does too.")
    return 0


def cmd_models_remove(args: argparse.Namespace) -> int:
    from .models.remove import RemoveIncompleteError, disk_usage, human_size, plan, remove

    ids = list(dict.fromkeys(args.ids))
    plans = {mid: plan(mid) for mid in ids}  # an unknown id is refused here, before anything goes
    for mid in ids:
        if not plans[mid]:
            print(f"{mid}: nothing on disk")
    todo = [mid for mid in ids if plans[mid]]
    if not todo:
        return 0
    if not args.yes:
        if not sys.stdin or not sys.stdin.isatty():
            raise _UsageError(f"not on a terminal, so nothing was asked or removed; pass --yes to "
                              f"remove {' '.join(todo)} without asking.")
        for mid in todo:
            for e in plans[mid]:
                print(f"  {e.path}  {human_size(e.bytes)}", file=sys.stderr)
        total = sum(e.bytes for mid in todo for e in plans[mid])
        count = sum(len(plans[mid]) for mid in todo)
        print(f"Remove {count} path(s) of {', '.join(todo)}, {human_size(total)}? [y/N] ",
              end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed", file=sys.stderr)
            return 1
    failed = False
    for mid in todo:
        def waiting(mid: str = mid) -> None:
            print(f"waiting for a pull or prepare of {mid} in another process ...", file=sys.stderr)

        before = disk_usage(mid)
        try:
            gone = remove(mid, on_wait=waiting)
        except RemoveIncompleteError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        freed = before - disk_usage(mid)
        print(f"removed {mid}: {len(gone)} path{'s' if len(gone) != 1 else ''}, {human_size(freed)}")
    return 1 if failed else 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    from ._progress import ProgressBar
    from .models.store import pull

    path = pull(args.id, progress=ProgressBar(f"Pulling {args.id}"), force=args.force)
    print(path)
    return 0


def cmd_models_path(args: argparse.Namespace) -> int:
    from ._progress import ProgressBar
    from .models.store import pull

    print(pull(args.id, progress=ProgressBar(f"Pulling {args.id}")))
    return 0


def cmd_models_verify(args: argparse.Namespace) -> int:
    from .models.store import verify

    results = verify(args.id)
    w = max([len("ID"), *(len(r.id) for r in results)]) + 2
    for r in results:
        print(f"{r.id:<{w}}{r.status:<9}{r.detail}")
    return 1 if any(r.status == "corrupt" for r in results) else 0


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from ._progress import ProgressBar
    from .models.catalog import get_spec

    spec = get_spec(args.id)
    if args.backend == "onnx":
        from .models.onnx_prepare import cli_prepare

        return cli_prepare(args.id, precision=args.precision, force=args.force)
    if spec.kind != "embedding":
        from .models.store import pull

        print(pull(args.id, progress=ProgressBar(f"Pulling {args.id}")))
        return 0
    try:
        from .cache._cli import prepare_embedder
    except ImportError as exc:
        raise HybridLLMError(f"The embedder export is not available in this install ({exc}).") from exc
    prepare_embedder(ProgressBar(f"Preparing {args.id}"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = WholeNameParser(prog="hybridllm", description=(
        "Hybrid cloud-edge LLM SDK: answer on the device, route hard questions to the cloud."))
    from . import __version__

    parser.add_argument("--version", action="version", version=f"hybridllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    system = "system prompt (default: none, so the model's own default system prompt, if it has one)"
    p = sub.add_parser("chat", help="interactive chat that streams answers", epilog=SETTINGS_EPILOG)
    _add_sampling(p)
    p.add_argument("--system", default=None, type=_system_prompt, help=system)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("ask", help="answer one prompt and exit", epilog=SETTINGS_EPILOG)
    p.add_argument("prompt", nargs="?", default=None,
                   help="the question; - or left out: read it from stdin")
    p.add_argument("--json", action="store_true",
                   help="print the Completion as one JSON object (default: the answer as it streams)")
    _add_sampling(p)
    p.add_argument("--system", default=None, type=_system_prompt, help=system)
    p.set_defaults(func=cmd_ask)

    models = sub.add_parser("models", help="list, pull, verify, remove the embedded models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    p = msub.add_parser("list", help="the catalog and what is pulled")
    p.add_argument("--json", action="store_true", help="print the catalog as one JSON array")
    p.set_defaults(func=cmd_models_list)
    p = msub.add_parser("pull", help="materialize a model into the data dir (sha256-verified)")
    p.add_argument("id", help="catalog id (hybridllm models list)")
    p.add_argument("--force", action="store_true", help="copy again even if already verified")
    p.set_defaults(func=cmd_models_pull)
    p = msub.add_parser("path", help="print a model's local path (pulling it if needed)")
    p.add_argument("id", help="catalog id (hybridllm models list)")
    p.set_defaults(func=cmd_models_path)
    p = msub.add_parser("verify", help="re-hash pulled files against the catalog")
    p.add_argument("id", nargs="?", default=None, help="catalog id (default: every model in the catalog)")
    p.set_defaults(func=cmd_models_verify)
    p = msub.add_parser("prepare", help="pull a model and build its run-time form (ONNX export)")
    p.add_argument("id", help="catalog id (hybridllm models list)")
    p.add_argument("--backend", choices=("llama_cpp", "onnx"), default="llama_cpp",
                   help="onnx: build the ONNX Runtime GenAI folder, needs the [export] extra "
                   "(default llama_cpp: the GGUF file)")
    p.add_argument("--precision", choices=("int4", "int8", "fp32"), default="int4",
                   help="ONNX weights (default int4)")
    p.add_argument("--force", action="store_true", help="build again even if prepared")
    p.set_defaults(func=cmd_models_prepare)
    p = msub.add_parser("remove", aliases=["rm"],
                        help="delete a model's pulled files and prepared forms from the data dir")
    p.add_argument("ids", nargs="+", metavar="ID", help="catalog id (hybridllm models list)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask (needed when not on a terminal)")
    p.set_defaults(func=cmd_models_remove)

    for module in _GROUPS:
        try:
            register: Callable[[Any], None] = importlib.import_module(module).register
        except (ImportError, AttributeError):
            continue  # an optional group that is not part of this install
        register(sub)
    return parser


def _lenient_stdout() -> None:
    """An answer may hold any character: a stdout whose encoding cannot write one (a Latin-1 locale,
    a file redirected on Windows, cp1252) shows it escaped (\\xe9), as Python's stderr does, rather
    than failing the command with an internal error after part of the answer."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    if encoding in ("", "utf8") or getattr(sys.stdout, "errors", None) != "strict":
        return
    try:
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # a stand-in stdout
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _lenient_stdout()
    try:
        try:
            return _main(argv)
        finally:  # --help's SystemExit too
            if sys.stdout is not None:
                # what is still buffered goes now, while a closed pipe can be caught, rather than
                # at interpreter exit ("Exception ignored ... BrokenPipeError", exit status 120)
                sys.stdout.flush()
    except BrokenPipeError:  # `hybridllm ... | head -1`: the reader has what it wanted
        _drop_stdout()
        return 0
    except OSError as exc:  # the output could not be written: `> /dev/full`, a full disk
        if not _no_room(exc) or os.environ.get("HYBRIDLLM_DEBUG"):
            raise
        _drop_stdout()  # what is still buffered would fail again at exit ("Exception ignored")
        where = f"cannot write {exc.filename}" if exc.filename else "cannot write the output"
        print(f"error: {where}: {exc.strerror}", file=sys.stderr)
        return 1


def _no_room(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for want of room or a working device (a full disk,
    a quota, a dead terminal): the user's to fix, not an internal error to report."""
    return isinstance(exc, OSError) and exc.errno in {
        errno.ENOSPC, errno.EFBIG, errno.EIO, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's own flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # a stand-in stdout (tests) has no descriptor
        pass


def _check_config_option(args: argparse.Namespace) -> None:
    """A --config file that is not there is a usage error (exit 2) for every command that takes it,
    as it was for `serve` only (`config show` exited 1); an empty one is too (it was ignored, and
    the default file read instead)."""
    config = getattr(args, "config", None)
    if config is None:
        return
    from pathlib import Path

    if not config.strip():
        raise _UsageError(f"argument --config: expected a TOML settings file, got {config!r}.")
    if not Path(config).expanduser().exists():
        raise _UsageError(f"argument --config: {config} does not exist.")


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        # a usage error as `hybridllm models` without its ACTION is: one line on stderr, exit 2
        # (the help used to go to stdout, with exit 2, so `hybridllm | less` paged an "error")
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser.error(f"a command is required: {', '.join(commands.choices)}")
    try:
        _check_config_option(args)
        return int(args.func(args) or 0)
    except _UsageError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except HybridLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed by its reader: main() says nothing
        raise
    except Exception as exc:  # never a traceback for the user; HYBRIDLLM_DEBUG shows it
        # a full disk is no bug: main() says so on one line (before: "internal error ... report it")
        if _no_room(exc) or os.environ.get("HYBRIDLLM_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} "
              "(set HYBRIDLLM_DEBUG=1 for the traceback and please report it)", file=sys.stderr)
        return 1


# the top-level modules the [server] extra brings (pyproject.toml); the cloud server needs them all
SERVER_MODULES = ("torch", "fastapi", "uvicorn", "gguf", "safetensors", "prometheus_client", "jinja2")


def server_extra_hint(missing: str | None) -> str:
    """What to install when the cloud server's [server] extra is missing, in one sentence or two."""
    from . import __version__

    return (f"the cloud server needs the [server] extra (torch, FastAPI), and this install lacks "
            f"{missing!r}. Install it with: pip install 'hybridllm[server]' "
            f"(or the wheel, 'dist/hybridllm-{__version__}-py3-none-any.whl[server]').")


def missing_server_module() -> str | None:
    """The first module of the [server] extra that is not installed, or None; found without
    importing anything (torch takes seconds to import)."""
    from importlib.util import find_spec

    return next((name for name in SERVER_MODULES if find_spec(name) is None), None)


def cloud_main() -> int:
    """``hybridllm-cloud``: the cloud server's command. Its modules need the [server] extra (torch,
    FastAPI); without it, say so on one line instead of an import traceback."""
    try:
        from cloud_server.__main__ import main as cloud
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("hybridllm", "cloud_server") or os.environ.get(
            "HYBRIDLLM_DEBUG"
        ):
            raise
        print(f"hybridllm-cloud: error: {server_extra_hint(exc.name)}", file=sys.stderr)
        return 1
    return cloud()


if __name__ == "__main__":
    # `python -m hybridllm.cli` runs this file as __main__, a second copy of the module: run the
    # one the command groups import (hybridllm.cli), so the _UsageError they raise is the class
    # its main() catches (else `serve --config missing.toml` exited 1 instead of 2)
    from hybridllm.cli import main as _main_of_the_package

    sys.exit(_main_of_the_package())
