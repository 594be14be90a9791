"""Command-line pieces both servers share (``hybridllm serve``, ``hybridllm-cloud serve``): option
types that refuse a bad value in one line before anything loads, and the listening socket, bound
once, before the model loads, and handed to uvicorn. Standard library only: the ``hybridllm``
command imports it on the light install too."""

from __future__ import annotations

import argparse
import errno
import math
import socket
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

MAX_PORT = 65535


class WholeNameParser(argparse.ArgumentParser):
    """The parsers of both commands (``hybridllm``, ``hybridllm-cloud``). Whole option names only:
    with argparse's prefixes `--cloud` was taken for `--cloud-url`, so a script's shorthand would
    change meaning when an option that shares the prefix is added. A usage error is one line that
    names the command (`hybridllm router train: error: ...`), exit status 2. Every subcommand's
    parser is of this class too (argparse makes a subparser of its parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        if not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            self._refuse_prefixes(sys.argv[1:] if args is None else list(args))
        # an option the subcommand does not take is refused by that subcommand, whose --help
        # lists what it takes, not by `hybridllm` after the subcommand has parsed the rest
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def _refuse_prefixes(self, args: list[str]) -> None:
        """Say which options a prefix stands for, before argparse reports a required option as
        missing (`--cloud-frac 0.3`: "the following arguments are required: --cloud-fraction")."""
        for arg in args:
            if arg == "--":
                return
            name = arg.split("=", 1)[0]
            if not name.startswith("--") or name in self._option_string_actions:
                continue
            whole = sorted(o for o in self._option_string_actions if o.startswith(name))
            if whole:
                self.error(f"unrecognized arguments: {name} (options take their whole name: "
                           f"{' or '.join(whole)})")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(text: str, kind: type[int] | type[float], what: str) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = int(_number(text, int, "a positive integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int, "an integer >= 0"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = float(_number(text, float, "a positive, finite number"))
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = float(_number(text, float, "a number >= 0"))
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def unit_interval(text: str) -> float:
    """A number from 0 to 1, both ends included (a threshold on a score or a probability)."""
    value = float(_number(text, float, "a number from 0 to 1"))
    if not 0.0 <= value <= 1.0:  # NaN fails every comparison: refused here too
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port; 0 asks the system for a free one (the server prints which)."""
    value = non_negative_int(text)
    if value > MAX_PORT:
        raise argparse.ArgumentTypeError(f"port must be in 0-{MAX_PORT}, got {text!r}")
    return value


def bind_host(text: str) -> str:
    """``--host``: an address or name to bind (``hybridllm serve`` and ``hybridllm-cloud serve``). An
    empty one (an unset shell variable) failed only at the bind, exit 1 without naming the option
    (and with ``--replicas`` was bound as every interface); a space in it (``"0.0.0.0 "``) was
    looked up as a name."""
    if not text or text != "".join(text.split()):
        raise argparse.ArgumentTypeError(
            f"expected an address or host name to bind (127.0.0.1, 0.0.0.0 for every interface, "
            f"::), got {text!r}")
    return text


def given(what: str, *, trimmed: bool = False) -> Any:
    """An argparse type refusing a blank value (an unset shell variable, ``--config "$CFG"``), which
    otherwise reads as the option left out, or as a name of spaces that fails once loading.
    ``trimmed``: spaces around the value are refused too (a model name clients must send spaces
    and all)."""

    def parse(text: str) -> str:
        if not text.strip() or (trimmed and text != text.strip()):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return text

    return parse


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 address in brackets (``[::1]:8080``, not ``::1:8080``,
    where the port cannot be told from the address)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def listen(host: str, port: int, error: type[Exception]) -> socket.socket:
    """A socket listening on ``host:port``, or ``error`` with the reason (address in use, no such
    host, no permission) in one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise error(f"Cannot listen on {host_port(host, port)}: {exc.strerror or exc}.") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        # the port is the likely clash (8080 is llama.cpp's server's too): say how to get past it
        advice = (" Another program is listening there (a server still running?): stop it, or pick "
                  "another port with --port (0 takes any free one).") if exc.errno == errno.EADDRINUSE else ""
        raise error(f"Cannot listen on {host_port(host, port)}: {exc.strerror or exc}.{advice}") from exc
    sock.set_inheritable(True)
    return sock
