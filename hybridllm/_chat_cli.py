"""`hybridllm ask` (one prompt) and `hybridllm chat` (a conversation): the commands that answer."""

from __future__ import annotations

import argparse
import io
import re
import sys
from typing import Any

from ._cli_sampling import _sampling
from ._cli_terminal import _decode_stdin_leniently, _isatty, _note, _style, _text, _UsageError, trace_line
from ._exceptions import CloudError, ConfigError, ContextWindowExceededError, HybridLLMError
from ._finite import finite_json


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
    text = _text(_read_stdin()).strip()
    if not text:
        raise _UsageError("the prompt read from stdin is empty.")
    return text


# The most `ask` reads from stdin: the request body that `hybridllm serve` and the cloud server take
# by default (4 MiB, wire.body.DEFAULT_MAX_BODY_BYTES, not imported: it needs pydantic). That is over
# 100 bytes a token for the largest context in the catalog (32,768 tokens), so a longer prompt
# could never be answered; reading on only filled memory (`hybridllm ask < /dev/zero` until killed).
MAX_STDIN_BYTES = 4 * 2**20


def _read_stdin() -> str:
    """stdin's text, read up to MAX_STDIN_BYTES (a usage error past it), decoded as stdin decodes
    (its encoding, universal newlines), bytes it cannot decode kept for _text() to replace."""
    raw = getattr(sys.stdin, "buffer", None)
    if not isinstance(raw, (io.BufferedIOBase, io.RawIOBase)):  # a stand-in stdin (StringIO)
        _decode_stdin_leniently()
        return str(sys.stdin.read())
    data = raw.read(MAX_STDIN_BYTES + 1) or b""
    if len(data) > MAX_STDIN_BYTES:
        raise _UsageError(f"the prompt read from stdin is over {MAX_STDIN_BYTES >> 20} MiB, the most ask "
                          "reads: the servers' default request limit, and far past the catalog models' "
                          "contexts (32,768 tokens at most); send only the part that matters "
                          "(head -c, split).")
    encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
    return io.TextIOWrapper(io.BytesIO(data), encoding=encoding, errors="surrogateescape").read()


def _messages(args: argparse.Namespace, prompt: str) -> Any:
    if not args.system:
        return prompt
    return [{"role": "system", "content": _text(args.system)}, {"role": "user", "content": prompt}]


def cmd_ask(args: argparse.Namespace) -> int:
    sampling = _sampling(args)
    messages = _messages(args, _prompt(args))
    with _client(args) as llm:
        _check_tools(llm, sampling)
        if args.json:
            print(finite_json(llm.chat(messages, **sampling).to_dict()))  # NaN: null
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
        if shown or stream.completion is None or not stream.completion.tool_calls:
            print()
        if stream.completion is not None:
            for call in stream.completion.tool_calls:  # what to run, one line each: name({arguments})
                print(f"{call.function.name}({call.function.arguments})", flush=True)
            _note(trace_line(stream.completion))
    return 0


def _check_tools(llm: Any, sampling: dict[str, Any]) -> None:
    """``--tools`` with no model here to call them: said in the CLI's terms (the library's error
    names its keyword arguments, ``cloud_url=`` and ``edge_model``). Asked once the model is loaded,
    since its chat template tells whether it reads tools."""
    if sampling.get("tools") is None or sampling.get("tool_choice") == "none" or llm.cloud is not None:
        return
    if llm._core._edge_calls_tools():  # the client's own probe, asked once
        return
    raise ConfigError(f"--tools needs a model that calls tools, and the device model ({llm.edge.model}) "
                      "has no tool format in its chat template: pass --model "
                      "qwen2.5-coder-0.5b-instruct, set a cloud that calls them (HYBRIDLLM_CLOUD_URL, "
                      "or cloud_url in config.toml), or add --tool-choice none for a text answer.")


CHAT_HELP = ("/reset clears the conversation, /exit (or Ctrl-D) quits, /help shows this; "
             "Ctrl-C stops an answer; a line that starts with // is sent with one / less "
             "(//tmp is what? sends /tmp is what?).")
_COMMAND = re.compile(r"/[A-Za-z?]+")


def _fit(llm: Any, history: list[dict[str, str]], base: int, max_tokens: int | None, *,
         cloud_failed: bool = False) -> int:
    """Drop the oldest turns (never the system prompt nor the new question) until the conversation
    leaves room for the answer in the device model's context; how many messages went. With a cloud
    configured a long conversation goes there whole, so nothing is dropped unless the cloud could
    not take it (``cloud_failed``): then the device answers what fits. A new question past the
    context on its own drops nothing (0): the device refuses it and the conversation stays."""
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
    trial = history[:]
    dropped = 0
    while (len(trial) - base > 1
           and len(call_guarded(edge.tokenize, edge, "edge", trial)) + room > limit):
        del trial[base]  # the oldest user turn, then its answer
        if len(trial) - base > 1 and trial[base]["role"] == "assistant":
            del trial[base]
            dropped += 1
        dropped += 1
    # a question past the context on its own (a long paste) fails whatever goes: the conversation
    # is kept, not dropped for nothing before the device refuses the question
    if dropped and len(call_guarded(edge.tokenize, edge, "edge", trial)) >= limit:
        return 0
    history[:] = trial
    return dropped


def _answer(llm: Any, history: list[dict[str, str]], sampling: dict[str, Any], parts: list[str],
            **options: Any) -> Any:
    """Stream one answer to stdout, collecting its text in ``parts``; the finished stream."""
    stream = llm.stream(history, **sampling, **options)
    for chunk in stream:
        parts.append(chunk.text)
        print(chunk.text, end="", flush=True)
    return stream


def _piped_line(interactive: bool) -> str:
    """The next question from a stdin that is not a terminal, as input() reads it, but at most
    MAX_STDIN_BYTES characters: input() read a line whole, so `hybridllm chat < /dev/zero` (or a
    file of one huge line) filled memory until killed. A stand-in stdin that is no text stream
    (an app's own object) is read by input() as before."""
    if interactive or not isinstance(sys.stdin, io.TextIOBase):
        return input()
    line = sys.stdin.readline(MAX_STDIN_BYTES + 1)
    if not line:
        raise EOFError
    if len(line) > MAX_STDIN_BYTES and not line.endswith("\n"):  # its newline aside, it is over
        raise _UsageError(f"a line read from stdin is over {MAX_STDIN_BYTES:,} characters, more than "
                          "any model here takes as a question; send only the part that matters.")
    return line[:-1] if line.endswith("\n") else line


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
                line = input(prompt) if interactive and to is sys.stdout else _piped_line(interactive)
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
            if text.startswith("//"):  # the escape: a question that itself starts with a slash
                text = text[1:]
            # a first word with a further slash (/usr/bin/env, /tmp/x) is a path, not a command:
            # it is sent as text, as is a lone "/"
            elif _COMMAND.fullmatch(text.split()[0]):
                command = text.split()[0].lower()
                if command in ("/exit", "/quit", "/bye"):
                    return 1 if failed else 0
                if command == "/reset":
                    del history[base:]
                    _note("(conversation cleared)")
                elif command in ("/help", "/?"):
                    # stdout that is not a terminal holds only the answers (README), piped or
                    # redirected (`hybridllm chat > out`): the list goes where the prompt does
                    print(CHAT_HELP, file=to)
                else:
                    _note(f"unknown command {command}, not sent (to send the line as text, start "
                          f"it with //: /{text.split()[0]} ...); {CHAT_HELP}")
                    failed = failed or not interactive  # a piped question refused, not answered: exit 1
                continue
            history.append({"role": "user", "content": text})
            parts: list[str] = []
            stream = None
            try:
                try:
                    # the turns go only once their note has printed: a Ctrl-C before it keeps them
                    trial = history[:]
                    dropped = _fit(llm, trial, base, sampling["max_tokens"])
                    if dropped:
                        _note(f"(the conversation outgrew the model's context: dropped its {dropped} "
                              "oldest messages; /reset starts afresh)")
                        history[:] = trial
                    stream = _answer(llm, history, sampling, parts)
                except (ContextWindowExceededError, CloudError) as exc:
                    # too long for the device, and the cloud could not take it (unavailable, failed,
                    # budget spent: a CloudError with the prompt's numbers; privacy): the device
                    # answers the most recent turns instead
                    too_long = not isinstance(exc, CloudError) or exc.context_length is not None
                    dropped = 0
                    trial = history[:]
                    if too_long:
                        dropped = _fit(llm, trial, base, sampling["max_tokens"], cloud_failed=True)
                    if not dropped:
                        raise
                    if parts:  # the cloud's broken-off start: the device's answer replaces it
                        print(flush=True)
                        parts.clear()
                    _note(f"(the conversation is too long for the device model and the cloud could not "
                          f"take it: dropped its {dropped} oldest messages and the device answers; "
                          "/reset starts afresh)")
                    history[:] = trial  # only now, as above: never dropped unannounced
                    stream = _answer(llm, history, sampling, parts, route="edge")
                # the whole answer joins the conversation before its line ends and its trace line
                # prints: a Ctrl-C there returns to the prompt with it kept (it ended the chat, 130)
                done = stream.completion
                if done is not None:
                    history.append({"role": "assistant", "content": done.text})
                print()
                parts.clear()  # the answer's line is ended
                if done is not None:
                    _note(trace_line(done))
            except KeyboardInterrupt:  # stop this answer, keep the session
                if parts:  # end the partial answer's line
                    print(flush=True)
                elif interactive:  # off the ^C line; not a blank line into piped/redirected answers
                    print(file=to, flush=True)
                if not interactive:  # a piped chat ends, as Ctrl-C at its next read would (130),
                    raise            # rather than going on to the next question
                if history[-1]["role"] == "assistant":  # the answer was whole and is kept
                    continue
                if stream is not None and stream.completion is not None:  # whole, not yet kept
                    history.append({"role": "assistant", "content": stream.completion.text})
                    continue
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
