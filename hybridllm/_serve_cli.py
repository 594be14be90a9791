"""`hybridllm serve` (the local OpenAI-compatible proxy) and `hybridllm config show`."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from ._cli_options import (
    bind_host,
    given,
    host_port,
    listen,
    non_negative_float,
    port,
    positive_int,
    unit_interval,
)
from ._exceptions import ConfigError
from ._finite import finite_json
from ._loopback import is_loopback
from ._masking import public_text

DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if getattr(args, "model", None):
        out["edge_model"] = args.model
    if getattr(args, "backend", None):
        out["edge_backend"] = args.backend
    if getattr(args, "cloud_url", None):
        out["cloud_url"] = args.cloud_url
    if getattr(args, "no_cache", False):
        out["cache"] = False
    if getattr(args, "threshold", None) is not None:
        out["threshold"] = args.threshold
    return out


def web_origin(value: str) -> str:
    """``--allow-origin``: what a browser sends as ``Origin`` (scheme://host[:port], no path) or ``*``."""
    origin = value.strip().rstrip("/")
    if origin == "*":
        return origin
    match = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/\s?#@]+)", origin)
    if match:
        # in the spelling a browser sends, which is compared as a string: scheme and host in lower
        # case, no default port (`https://App.Example:443` would never match `https://app.example`)
        scheme, netloc = match.group(1).lower(), match.group(2).lower()
        default = {"http": ":80", "https": ":443"}.get(scheme)
        if default and netloc.endswith(default):
            netloc = netloc[: -len(default)]
        return f"{scheme}://{netloc}"
    raise argparse.ArgumentTypeError(
        f"expected an origin such as https://app.example:3000 (scheme://host[:port], as a browser "
        f"sends it, no path) or '*', got {value!r}")


def host_option(value: str) -> str:
    """``--allow-host``: a name or address clients put in the Host header (any port), or ``*``."""
    name = value.strip()
    # one spelling (no port, lower case) is made by the proxy (_loopback.host_name)
    if name == "*" or re.fullmatch(r"\[[0-9A-Fa-f:.]+\](?::\d{1,5})?|[A-Za-z0-9._:-]+", name):
        return name
    raise argparse.ArgumentTypeError(
        f"expected a host name or address as clients write it in the URL (chat.example.com, "
        f"192.168.1.5, [fe80::1]; a port is ignored) or '*', got {value!r}")


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError as exc:
        raise ConfigError("`hybridllm serve` needs FastAPI and uvicorn, which the light install leaves "
                          "out: pip install 'hybridllm[proxy]' (no torch)") from exc
    from ._cli_terminal import _UsageError
    from ._client import HybridLLM
    from ._config import load_config
    from ._progress import ProgressBar, log_lines_apart
    from ._serve_loading import LoadingAnswers
    from .proxy import API_KEYS_ENV, create_app, serve_hosts
    from .wire.auth import load_api_keys
    from .wire.middleware import access_log_config
    from .wire.shutdown import GracefulServer

    # Keys and settings are checked before the port is bound and the model loads: a bad one is a
    # usage error (exit status 2), as hybridllm-cloud's; a port in use stays an error (exit 1).
    try:
        api_keys = load_api_keys(args.api_key, args.api_key_file, env_var=API_KEYS_ENV, error=ConfigError)
        load_config(args.config, **_settings(args))
    except ConfigError as exc:
        raise _UsageError(str(exc)) from exc
    sock = listen(args.host, args.port, ConfigError)
    llm = None
    try:  # the socket is closed however this ends: a model that fails to load, Ctrl-C while it loads
        host, bound_port = sock.getsockname()[:2]
        if not api_keys and not is_loopback(host):  # the address bound: a name may resolve off loopback
            print(f"hybridllm serve: warning: no API key and listening on {args.host}: anyone who can "
                  f"reach it can use it (set {API_KEYS_ENV} or --api-key-file)", file=sys.stderr)
        if not api_keys and "*" in args.allow_origin:  # loopback too: the browser is on this machine
            print(f"hybridllm serve: warning: no API key and --allow-origin '*': any web page opened "
                  f"in a browser that can reach it can use it (set {API_KEYS_ENV} or --api-key-file)",
                  file=sys.stderr)
        log_lines_apart()  # a warning logged while the model's bar is drawn starts a line of its own
        with LoadingAnswers(sock, args.max_body_bytes):  # meanwhile each request gets a 503 "loading"
            llm = HybridLLM(config=args.config, progress=ProgressBar("Preparing the edge model"),
                            **_settings(args))
        cloud = public_text(", ".join(llm.config.cloud_url)) or "none (device only)"  # into logs: no password
        print(f"hybridllm serve: http://{host_port(host, bound_port)}/v1  edge={llm.edge.model}  "
              f"cloud={cloud}  {'API key required' if api_keys else 'open'}", flush=True)
        app = create_app(llm, api_keys=api_keys, max_body_bytes=args.max_body_bytes,
                         allow_origins=args.allow_origin, allow_hosts=serve_hosts(host, args.allow_host))
        # SIGTERM / Ctrl-C: new requests 503, the ones in flight get --shutdown-timeout, the rest end
        # cleanly (wire/shutdown.py); uvicorn's own timeout after it is for clients that stopped reading
        # the access lines (--log-level info) end with [request_id=ID], as the error lines do
        config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5,
                                log_config=access_log_config())
        GracefulServer(config, app.state.drain, args.shutdown_timeout).run(sockets=[sock])
    finally:
        sock.close()
        if llm is not None:
            llm.close()
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from ._config import load_config
    from ._config_file import config_file_path

    cfg = load_config(args.config)
    path = config_file_path(args.config)
    # inf (no bound, as None, for the timeouts and cache_ttl_s) is null: JSON has no Infinity
    print(finite_json({"config_file": str(path) if path else None, **cfg.public_dict()}, indent=2))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible server on the device, routed by HybridLLM")
    p.add_argument("--host", default="127.0.0.1", type=bind_host, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8080, help="port to bind (default 8080; 0: any free one)")
    p.add_argument("--model", default=None, type=given("an edge model id or .gguf path"),
                   help="edge model id or .gguf path")
    p.add_argument("--backend", choices=("llama_cpp", "onnx"), default=None,
                   help="edge runtime: llama_cpp (default) or onnx (ONNX Runtime GenAI)")
    p.add_argument("--cloud-url", action="append", default=None,
                   help="OpenAI-compatible cloud endpoint (repeatable; balanced)")
    p.add_argument("--threshold", type=unit_interval, default=None, metavar="T",
                   help="the router's threshold, a number from 0 to 1: a prompt whose difficulty score "
                   "reaches it goes to the cloud (0: every prompt; 1: none; default: the router's own)")
    p.add_argument("--no-cache", action="store_true", help="disable the semantic cache")
    p.add_argument("--config", default=None, type=given("a TOML file's path"), help="TOML settings file")
    # a blank key ("$KEY" unset) was dropped: the server ran open, and on loopback said nothing
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   type=given("an API key (a blank one would leave the server open)"),
                   help="key clients must send as 'Authorization: Bearer KEY' (repeatable; shows "
                   "in ps, so prefer --api-key-file or HYBRIDLLM_SERVE_API_KEYS)")
    p.add_argument("--api-key-file", default=None, metavar="PATH", type=given("a file's path"),
                   help="file with one accepted key a line ('#' comments)")
    p.add_argument("--allow-origin", action="append", default=[], type=web_origin, metavar="ORIGIN",
                   help="a web page origin (https://app.example:3000, or '*') allowed to call this "
                   "server from a browser, with CORS (repeatable); other pages' requests are 403s")
    p.add_argument("--allow-host", action="append", default=[], type=host_option, metavar="NAME",
                   help="a name (or address) clients reach this server under, besides localhost, "
                   "127.0.0.1, [::1] and the --host address: a reverse proxy's public name "
                   "(repeatable; '*' for any). Bound to loopback, requests for other names are 403s "
                   "(DNS rebinding); bound elsewhere, any name is answered unless this is given")
    p.add_argument("--max-body-bytes", type=positive_int, default=4 * 1024 * 1024, metavar="N",
                   help="largest request body accepted; beyond it 413 (default 4 MiB)")
    p.add_argument("--shutdown-timeout", type=non_negative_float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                   metavar="S",
                   help="on SIGTERM or Ctrl-C, seconds the answers in flight get to finish before they "
                   f"are ended (default {DEFAULT_SHUTDOWN_TIMEOUT_S:g}; 0: end them at once)")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="uvicorn's log level (default warning)")
    p.set_defaults(func=cmd_serve)

    cfg = sub.add_parser("config", help="show the effective settings")
    csub = cfg.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    p = csub.add_parser("show", help="settings after arguments, environment and TOML (secrets masked)")
    p.add_argument("--config", default=None, type=given("a TOML file's path"), help="TOML settings file")
    p.set_defaults(func=cmd_config_show)
