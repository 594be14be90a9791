"""The `hybridllm` command: chat, ask, models, and the router / cache / serve groups.

Every error a user can cause is a HybridLLMError: it is printed on one line and the command exits
with status 1 (2 for usage errors, 130 on Ctrl-C). Set HYBRIDLLM_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ._chat_cli import cmd_ask, cmd_chat
from ._cli_options import WholeNameParser
from ._cli_sampling import SETTINGS_EPILOG, _add_sampling, _system_prompt, add_tools
from ._cli_terminal import _UsageError
from ._exceptions import HybridLLMError
from ._models_cli import (
    cmd_models_list,
    cmd_models_path,
    cmd_models_prepare,
    cmd_models_pull,
    cmd_models_remove,
    cmd_models_verify,
)
from ._progress import end_line, log_lines_apart

# Command groups that live beside the code they drive; each module has register(subparsers).
_GROUPS = ("hybridllm.router._cli", "hybridllm.cache._cli", "hybridllm._serve_cli")


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
    add_tools(p)
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
    p.add_argument("--precision", choices=("int4", "int8", "fp32"), default=None,
                   help="ONNX weights, with --backend onnx (default int4)")
    p.add_argument("--force", action="store_true",
                   help="build again even if prepared (a GGUF model: copy it again, as pull --force)")
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


def _closed_stderr_to_devnull() -> None:
    """Started with stderr closed (`2>&-`, some service managers): Python has no sys.stderr, and
    print(file=None) writes to stdout, so errors, notes and trace lines went into the result
    (`hybridllm models path ID 2>&- > f` wrote "error: ..." into f, `ask` its trace line after the
    answer). They are dropped instead, as `2>/dev/null` drops them; the exit status still tells.
    The null device takes descriptor 2 when it is free, so what C libraries write there (llama.cpp's
    log) cannot land in a file opened later that would have been given it."""
    if sys.stderr is not None:
        return
    try:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the whole process
    except OSError:  # no null device (a minimal sandbox): as before
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _closed_stderr_to_devnull()
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


def _check_stdout(args: argparse.Namespace) -> None:
    """A command started with stdout closed (`>&-`; Python then has no sys.stdout) is a usage error
    before anything loads, as `chat` with stdin closed is: its result had nowhere to go. `ask`,
    `config show` and `models list` exited 0 with the answer thrown away, `router eval --json`
    ended in an "internal error", `router calibrate` did so after rewriting the router, and `serve`
    after loading the model (uvicorn's log setup needs a stdout)."""
    if sys.stdout is None:
        raise _UsageError("stdout is closed (started with >&-), and this command writes its result "
                          "there; redirect it instead (> FILE, or > /dev/null to drop it).")


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
    log_lines_apart()  # a warning or log record while a bar is drawn starts a line of its own
    try:
        _check_stdout(args)
        _check_config_option(args)
        try:
            return int(args.func(args) or 0)
        finally:  # a progress bar cut short ends its line before `error: ...` or `interrupted`
            end_line()
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
    FastAPI); without it, one line says so instead of an import traceback. The entry is
    ``cloud_server/_entry.py``'s, which ``python -m cloud_server`` uses too."""
    from cloud_server._entry import main as cloud

    return cloud()


if __name__ == "__main__":
    # `python -m hybridllm.cli` runs this file as __main__, a second copy of the module: run the
    # one the command groups import (hybridllm.cli), so the _UsageError they raise is the class
    # its main() catches (else `serve --config missing.toml` exited 1 instead of 2)
    from hybridllm.cli import main as _main_of_the_package

    sys.exit(_main_of_the_package())
