"""``hybridllm-cloud``: the cloud server's command line.

    hybridllm-cloud serve --model ID_OR_PATH [--host 127.0.0.1] [--port 8000] [--api-key KEY ...]
        [--shutdown-timeout S] [--access-log]
        [--replicas N [--ray-address ADDR [--replace]] [--min-replicas A --max-replicas B]] [--power-watts W]
        [--speculative-method ngram|draft --num-speculative-tokens K [--draft-model ID_OR_PATH]]

Errors are printed as one line on stderr, no traceback: a bad option value or combination (an
engine setting, a model or key that is not there, a setting the model's header rules out
(``--max-model-len``, the KV pool, a draft model of another tokenizer), cluster options without
``--replicas`` or a ``--ray-address`` that is no address, a ``HYBRIDLLM_POWER_WATTS`` that is not
a positive number of watts, all checked before anything loads) with
exit status 2 naming the option, as argparse's own; a port in use, a model that fails to load, a
Ray cluster that does not answer or an engine that dies while serving with 1.
SIGTERM or Ctrl-C shuts the server down gracefully (``hybridllm/wire/shutdown.py``) and the exit
status is 0, at once if the model is still loading.
"""

# ruff: noqa: E402 - `python -m cloud_server` checks the [server] extra before the imports below

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # `python -m cloud_server` is `hybridllm-cloud` (cloud_server/_entry.py): without the [server]
    # extra, one line naming it instead of the traceback of an import below (pydantic, FastAPI,
    # torch); with it, main() at the end of this file, run here: the entry's import of it by name
    # (cloud_server.__main__) loaded this file a second time
    from cloud_server._entry import check_extra

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if (_code := check_extra()) is not None:
        sys.exit(_code)

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from cloud_server.cli_checks import _check_device, _check_model, _check_model_header, _check_power_env
from cloud_server.cli_parser import DEFAULT_SHUTDOWN_TIMEOUT_S, PROG, UsageError, build_parser
from cloud_server.cli_settings import _cluster_config, _engine_config
from cloud_server.exceptions import ConfigError, ServerError
from hybridllm._cli_options import listen
from hybridllm._loopback import is_loopback
from hybridllm._progress import end_line, log_lines_apart


def _system_prompt(model: str, given: str | None) -> str | None:
    """``--system-prompt`` if given, else the catalog entry's default (the one the edge uses, so
    both sides answer alike), else none."""
    if given is not None:
        return given or None
    if Path(model).exists():
        return None
    from hybridllm.models import load_catalog

    spec = load_catalog().get(model)
    return spec.extra.get("system_prompt") if spec is not None else None


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from cloud_server.api.auth import load_api_keys
    from cloud_server.api.server import create_app
    from hybridllm.wire.middleware import access_log_config
    from hybridllm.wire.shutdown import GracefulServer

    # Every option is checked before logging starts and anything loads: a bad one is a usage
    # error (exit status 2) naming the option.
    try:
        api_keys = load_api_keys(args.api_key, args.api_key_file)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    config = _engine_config(args)
    cluster = _cluster_config(args)
    _check_power_env(args.power_watts)  # read by each replica too: the same variable, the same rule
    _check_model(args.model)
    if args.draft_model is not None:
        _check_model(args.draft_model, "--draft-model")
    if cluster is None:
        _check_device(config)
    _check_model_header(args, config, cluster is not None)
    _configure_logging(args.log_level)
    log_lines_apart()  # a record logged while the load's bar is drawn starts a line of its own
    if cluster is not None:  # Ray is imported only here
        _warn_if_open(api_keys, args.host)  # Ray Serve's proxy binds it
        from cloud_server.cluster.launch import serve_cluster

        return serve_cluster(
            config, cluster, host=args.host, port=args.port, power_watts=args.power_watts,
            app_options={"api_keys": api_keys, "served_model_name": args.served_model_name,
                         "system_prompt": _system_prompt(args.model, args.system_prompt),
                         "max_body_bytes": args.max_body_bytes, "allow_origins": args.allow_origin},
        )

    def make_engine() -> Any:
        from cloud_server.engine.async_engine import AsyncLLMEngine

        return AsyncLLMEngine(config)

    failure: list[BaseException] = []
    died: list[BaseException] = []
    server: GracefulServer | None = None

    def on_load_error(exc: BaseException) -> None:
        failure.append(exc)
        if server is not None:
            server.should_exit = True

    def on_engine_dead(exc: BaseException) -> None:  # a supervisor restarts the server
        died.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(
        make_engine,
        api_keys=api_keys,
        served_model_name=args.served_model_name,
        on_load_error=on_load_error,
        system_prompt=_system_prompt(args.model, args.system_prompt),
        max_body_bytes=args.max_body_bytes,
        power_watts=args.power_watts,
        on_engine_dead=on_engine_dead,
        allow_origins=args.allow_origin,
    )
    sock = listen(args.host, args.port, ServerError)
    host, port = sock.getsockname()[:2]
    _warn_if_open(api_keys, host)  # the address bound: a name may resolve off loopback
    logging.getLogger("cloud_server").info(
        "listening on http://%s:%s (%s)", host, port, "API key required" if api_keys else "open"
    )
    # uvicorn's own timeout comes after the drain (GracefulServer): only a client that stopped
    # reading could still hold a connection open by then
    # the access lines (--access-log) end with [request_id=ID], as the proxy's and the error lines
    uv_config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5,
                               access_log=args.access_log, log_config=access_log_config())
    log_lines_apart()  # uvicorn's handlers (set up by Config): the model loads while it serves
    grace_s = DEFAULT_SHUTDOWN_TIMEOUT_S if args.shutdown_timeout is None else args.shutdown_timeout
    server = GracefulServer(uv_config, app.state.server.drain, grace_s)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if app.state.server.load_abandoned:
        _exit_leaving_the_load()
    if failure:
        error = failure[0]
        raise ServerError(f"loading model {args.model!r} failed: {error}") from error
    if died:
        raise ServerError(f"the engine failed while serving ({died[0]}); start the server again")
    return 0


def _configure_logging(level: str) -> None:
    """The server's log format at ``level``. httpx logs every request it sends at INFO (the
    cluster's health polls: "HTTP Request: GET .../health"): those only with ``--log-level debug``."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level.lower() != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)


def _warn_if_open(api_keys: Sequence[str], host: str) -> None:
    """Warn of a server without an API key bound beyond this machine. Loopback is the rule of
    `hybridllm serve` (``is_loopback``): all of 127.0.0.0/8 and ``::1`` in any spelling."""
    if not api_keys and not is_loopback(host):
        logging.getLogger("cloud_server").warning(
            "no API key configured and listening on %s: anyone who can reach it can use it", host)


def _exit_leaving_the_load() -> NoReturn:
    """Shut down while the model was still loading: the load runs on in a worker thread that
    cannot be interrupted, and the interpreter would wait for it (minutes for a large model)
    before exiting. Nothing was served and the weight cache is written atomically, so leave now,
    removing the cache file the load may be writing (``os._exit`` runs no cleanup)."""
    end_line()  # the load's bar (a catalog model being assembled): its line ends before the log's
    logging.getLogger("cloud_server").info("shut down while the model was loading: not waiting for it")
    weight_cache = sys.modules.get("cloud_server.models.weight_cache")
    if weight_cache is not None:
        weight_cache.remove_partial_files()
    logging.shutdown()
    end_line()  # drawn again by the load's thread since: the shell's prompt starts a line
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        try:
            if args.command == "serve":
                return serve(args)
        finally:  # a progress bar cut short ends its line before `error: ...`, as in hybridllm's CLI
            end_line()
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:  # as argparse's own: exit status 2
        print(f"{PROG}: error: {' '.join(str(exc).split())} (see {PROG} serve --help)", file=sys.stderr)
        return 2
    except (ServerError, OSError, ValueError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
