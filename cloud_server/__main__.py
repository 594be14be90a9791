"""``hybridllm-cloud``: the cloud server's command line.

    hybridllm-cloud serve --model ID_OR_PATH [--host 127.0.0.1] [--port 8000] [--api-key KEY ...]
        [--shutdown-timeout S] [--access-log]
        [--replicas N [--ray-address ADDR [--replace]] [--min-replicas A --max-replicas B]] [--power-watts W]
        [--speculative-method ngram|draft --num-speculative-tokens K [--draft-model ID_OR_PATH]]

Errors are printed as one line on stderr, no traceback: a bad option value or combination (an
engine setting, a model or key that is not there, a setting the model's header rules out
(``--max-model-len``, the KV pool, a draft model of another tokenizer), cluster options without
``--replicas`` or a ``--ray-address`` that is no address, all checked before anything loads) with
exit status 2 naming the option, as argparse's own; a port in use, a model that fails to load, a
Ray cluster that does not answer or an engine that dies while serving with 1.
SIGTERM or Ctrl-C shuts the server down gracefully (``hybridllm/wire/shutdown.py``) and the exit
status is 0, at once if the model is still loading.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from cloud_server.exceptions import ConfigError, ServerError
from hybridllm._cli_options import (
    WholeNameParser,
    listen,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from hybridllm._loopback import is_loopback
from hybridllm.wire.body import DEFAULT_MAX_BODY_BYTES

PROG = "hybridllm-cloud"
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


class UsageError(ServerError):
    """A bad option value or combination found after parsing: exit status 2, as argparse's own."""


# EngineConfig fields whose option is not simply --field-name
_FIELD_OPTIONS = {"kv_cache_memory_bytes": "--kv-cache-memory-mb",
                  "enable_prefix_caching": "--no-prefix-caching"}


def _option(field: str) -> str:
    """The command line's option of an EngineConfig field."""
    return _FIELD_OPTIONS.get(field, "--" + field.replace("_", "-"))


def _option_names(message: str) -> str:
    """A ConfigError's ``EngineConfig.field`` names in the command line's words (for one that does
    not say its fields as a SettingError does)."""
    from cloud_server.config import EngineConfig

    for field in sorted((f.name for f in dataclasses.fields(EngineConfig)), key=len, reverse=True):
        message = message.replace(f"EngineConfig.{field}", _option(field))
    return message


class _Parser(WholeNameParser):
    """Whole option names only (``--mod`` is not ``--model``); usage errors as one line
    (``hybridllm-cloud: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="hybridllm cloud server")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = sub.add_parser(
        "serve",
        help="serve a model over the OpenAI-compatible HTTP API",
        description="Serve a model over the OpenAI-compatible HTTP API. API keys also come from "
        "the HYBRIDLLM_CLOUD_API_KEYS environment variable (comma-separated).",
    )
    serve.add_argument("--model", required=True, help="catalog id, .gguf file or HF folder")
    serve.add_argument(
        "--served-model-name",
        help="model name in the API (default: the catalog id, or the .gguf file's or folder's name)",
    )
    serve.add_argument(
        "--system-prompt", default=None, metavar="TEXT",
        help="system message for chat requests without one (default: the catalog model's own, as "
        "the device uses it; '' for none)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=port, default=8000, help="port to bind (default 8000)")
    serve.add_argument(
        "--api-key", action="append", default=[], metavar="KEY", help="accepted key (repeatable)"
    )
    serve.add_argument(
        "--api-key-file", metavar="PATH",
        help="file with one accepted key a line (preferred over --api-key, which shows in ps)",
    )
    serve.add_argument(
        "--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
        help=f"largest request body accepted; beyond it 413 (default {DEFAULT_MAX_BODY_BYTES})",
    )
    serve.add_argument(
        "--shutdown-timeout", type=non_negative_float, default=None, metavar="S",
        help=f"on SIGTERM or Ctrl-C, refuse new requests (503) and give those in flight S seconds "
        f"to finish before ending them (default {DEFAULT_SHUTDOWN_TIMEOUT_S:g}; 0: end them at once)",
    )
    engine = serve.add_argument_group("engine")
    engine.add_argument(
        "--max-num-seqs", type=positive_int, default=16,
        help="most sequences in one engine step (default 16)",
    )
    engine.add_argument(
        "--max-num-batched-tokens", type=positive_int, default=512,
        help="most tokens in one engine step, decode and prefill chunks together (default 512)",
    )
    engine.add_argument(
        "--max-waiting", type=positive_int, default=256,
        help="requests that may wait beyond the free batch slots; beyond that 429 (default 256)",
    )
    engine.add_argument(
        "--max-model-len", type=positive_int, default=None,
        help="longest sequence, prompt and answer (default: the model's own, at most 4096 on CPU "
        "and 32768 on CUDA)",
    )
    engine.add_argument(
        "--block-size", type=positive_int, default=16,
        help="tokens per KV cache block, a power of two (default 16)",
    )
    engine.add_argument(
        "--kv-cache-memory-mb", type=positive_int, default=None,
        help="KV pool budget in MiB (default: 1024 on CPU, half the free memory on CUDA); a "
        "--draft-model adds its own pool beyond it, as many blocks at its own size a token",
    )
    engine.add_argument(
        "--no-prefix-caching", action="store_true",
        help="do not reuse the KV blocks of earlier prompts' shared prefixes",
    )
    engine.add_argument(
        "--device", default=None, help="cpu or cuda[:N] (default: cuda where available, else cpu)"
    )
    engine.add_argument(
        "--dtype", default=None,
        help="float32, bfloat16 or float16 (default: bfloat16; float32 on CPU with --quantization none)",
    )
    engine.add_argument(
        "--quantization", default=None, choices=["none", "int8", "int4"],
        help="weights: int8 (weight-only, groups of 32: a GGUF's own blocks), int4 (a GGUF's own "
        "4-bit groups, int8 for its other tensors) or none (default: int4 on CPU, none on CUDA)",
    )
    engine.add_argument(
        "--enforce-eager", action="store_true",
        help="CUDA: run every step eagerly (default: decode steps replay CUDA graphs, captured "
        "on first use of each batch and context size)",
    )
    engine.add_argument("--seed", type=int, default=0, help="seed of the engine's sampler (default 0)")
    engine.add_argument(
        "--num-threads", type=positive_int, default=None,
        help="torch CPU threads (default: all cores this process may use; 1 a replica with --replicas)",
    )
    engine.add_argument(
        "--power-watts", type=positive_float, default=None, metavar="W",
        help="watts: estimate the per-request energy at W, even where a counter is readable (default: "
        "measured with NVML on a GPU or RAPL where readable, else estimated at 10 W per CPU thread / "
        "300 W per GPU)",
    )
    cluster = serve.add_argument_group(
        "cluster (Ray Serve; needs pip install 'hybridllm[cluster]')"
    )
    cluster.add_argument(
        "--replicas", type=positive_int, default=None, metavar="N",
        help="run N engine replicas as a Ray Serve deployment behind this API, routed by "
        "outstanding tokens and cached prefixes (without it Ray is not used)",
    )
    cluster.add_argument(
        "--ray-address", default=None, metavar="ADDR",
        help="join this Ray cluster (auto, ray://host:10001); default: start a local one",
    )
    cluster.add_argument(
        "--replace", action="store_true",
        help="with --ray-address: deploy over a hybridllm app already on that cluster (one left "
        "behind by a serve that was killed); without it such an app is refused, not replaced",
    )
    cluster.add_argument(
        "--min-replicas", type=non_negative_int, default=None, metavar="A",
        help="autoscale between A and --max-replicas replicas on queued tokens",
    )
    cluster.add_argument(
        "--max-replicas", type=positive_int, default=None, metavar="B",
        help="upper bound of the autoscaled replica count",
    )
    cluster.add_argument(
        "--target-tokens-per-replica", type=positive_int, default=None, metavar="T",
        help="autoscaling: want ceil(queued tokens of the fleet / T) replicas (default 4096)",
    )
    cluster.add_argument(
        "--autoscale-window-s", type=positive_float, default=None, metavar="S",
        help="autoscaling: average the queued tokens over the last S seconds (default 30; "
        "replicas push their figures every 10 s, so keep it above 10)",
    )
    cluster.add_argument(
        "--upscale-delay-s", type=non_negative_float, default=None, metavar="S",
        help="autoscaling: add replicas once more have been wanted for S seconds (default 30)",
    )
    cluster.add_argument(
        "--downscale-delay-s", type=non_negative_float, default=None, metavar="S",
        help="autoscaling: remove replicas once fewer have been wanted for S seconds (default 600)",
    )
    spec = serve.add_argument_group("speculative decoding (off by default)")
    spec.add_argument(
        "--speculative-method", default=None, choices=["ngram", "draft"],
        help="ngram: prompt lookup (drafts copied from the prompt and output); draft: a smaller "
        "model with the same tokenizer (--draft-model)",
    )
    spec.add_argument(
        "--num-speculative-tokens", type=positive_int, default=None, metavar="K",
        help="most tokens proposed per sequence and step, 1-16 (default 8 for ngram, 3 for draft; "
        "fewer under load)",
    )
    spec.add_argument(
        "--draft-model", default=None, metavar="ID_OR_PATH",
        help="draft model for --speculative-method draft: catalog id, .gguf file or HF folder",
    )
    spec.add_argument(
        "--draft-vocab-size", type=non_negative_int, default=None, metavar="N",
        help="the draft proposes only token ids below N, a smaller output head to compute "
        "(lossless: the target checks every token; default 32768 for larger vocabularies, 0: all)",
    )
    serve.add_argument(
        "--access-log", action="store_true",
        help="log one line per request at --log-level info, ending with [request_id=ID] as the "
        "error lines do (default: off; the single-process server only)",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
        help="log level (default info)",
    )
    return parser


def _engine_config(args: argparse.Namespace) -> Any:
    from cloud_server.config import EngineConfig, SettingError

    try:
        return _make_engine_config(EngineConfig, args)
    except SettingError as exc:  # says which fields: worded with their options
        raise UsageError(exc.naming(_option)) from exc
    except ConfigError as exc:
        raise UsageError(_option_names(str(exc))) from exc


def _make_engine_config(engine_config: Any, args: argparse.Namespace) -> Any:
    return engine_config(
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_memory_bytes=(
            args.kv_cache_memory_mb << 20 if args.kv_cache_memory_mb is not None else None
        ),
        max_model_len=args.max_model_len,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        seed=args.seed,
        max_waiting=args.max_waiting,
        enable_prefix_caching=not args.no_prefix_caching,
        num_threads=args.num_threads,
        speculative_method=args.speculative_method,
        num_speculative_tokens=args.num_speculative_tokens,
        draft_model=args.draft_model,
        draft_vocab_size=args.draft_vocab_size,
        enforce_eager=args.enforce_eager,
    )


def _cluster_config(args: argparse.Namespace) -> Any:
    """A ClusterConfig when --replicas (or an autoscaling bound) is given, else None. A cluster
    option without --replicas, or one that does not fit the others, is a usage error."""
    tuning = {
        name: getattr(args, name)
        for name in (
            "target_tokens_per_replica", "autoscale_window_s", "upscale_delay_s", "downscale_delay_s"
        )
        if getattr(args, name) is not None
    }
    if args.replicas is None:
        if (args.min_replicas is not None or args.max_replicas is not None or args.ray_address or tuning
                or args.replace):
            raise UsageError("--ray-address, --replace, --min-replicas, --max-replicas and the "
                             "autoscaling options go with --replicas N")
        return None
    if tuning and args.min_replicas is None and args.max_replicas is None:
        flags = ", ".join("--" + name.replace("_", "-") for name in tuning)
        raise UsageError(f"{flags} tune autoscaling: add --min-replicas A and/or --max-replicas B")
    if args.ray_address is not None:
        _check_ray_address(args.ray_address)
    elif args.replace:
        raise UsageError("--replace goes with --ray-address: a local Ray instance starts empty")
    if args.port == 0:
        raise UsageError("--replicas needs an explicit --port (Ray Serve's proxy binds it)")
    if args.shutdown_timeout is not None:
        raise UsageError("--shutdown-timeout applies to the single-process server, not to --replicas")
    if (args.device or "").startswith("cuda:"):  # else refused by the deployment, after Ray's import (exit 1)
        raise UsageError(f"--device {args.device} names one GPU; with --replicas use --device cuda "
                         "(Ray gives each replica a GPU of its own)")
    if args.access_log:  # Ray Serve's proxy answers the requests: its own access log, in Ray's logs
        raise UsageError("--access-log applies to the single-process server, not to --replicas (Ray "
                         "Serve logs each request under /tmp/ray/session_latest/logs/serve)")
    from cloud_server.config import ClusterConfig

    try:
        return ClusterConfig(replicas=args.replicas, ray_address=args.ray_address,
                             min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                             replace_app=args.replace, **tuning)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc


# what Ray's address takes: auto (a cluster on this machine), HOST:PORT (the head's GCS) or
# ray://HOST:PORT (Ray Client); HOST a name, an IPv4 address or an IPv6 one in brackets
_RAY_ADDRESS = re.compile(r"(?:ray://)?(?:\[[0-9A-Fa-f:.]+\]|[\w.-]+):(\d{1,5})")


def _check_ray_address(address: str) -> None:
    match = _RAY_ADDRESS.fullmatch(address)
    if address != "auto" and (match is None or not 0 < int(match[1]) < 65536):
        raise UsageError(
            f"--ray-address {address!r} is not an address of a Ray cluster: give auto (a cluster "
            "started on this machine), HOST:PORT (the address `ray start --head` prints) or "
            "ray://HOST:10001; leave it out to start a local Ray instance"
        )


def _check_model(model: str, option: str = "--model") -> None:
    """Fail before binding when the model is neither a file or folder nor a catalog id, or is a
    file or folder the loader cannot take (it reads a path as a model only when it is a folder or
    ends in .gguf: another file was looked up as a catalog id once the server had started)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{option}: folder {model!r} has no config.json: give a Hugging Face "
                             "model folder (config.json, *.safetensors, tokenizer.json)")
        return
    if path.exists():
        if path.suffix != ".gguf":
            raise UsageError(f"{option}: {model!r} is not a .gguf file (a GGUF model's name ends "
                             "in .gguf) nor a Hugging Face model folder")
        return
    from hybridllm.models import load_catalog

    known = sorted(load_catalog())
    if model not in known:
        raise UsageError(
            f"{option}: {model!r} is neither an existing file or folder nor a catalog id "
            f"({', '.join(known)})"
        )


def _check_model_header(args: argparse.Namespace, config: Any, cluster: bool) -> None:
    """Refuse what the models' headers already rule out (read without the weights; the engine
    found it only once the server had started, exit 1): a ``--max-model-len`` beyond the model's
    context length, a KV pool that cannot hold one sequence (on a CPU, with a draft model's own
    pool beyond it, more than the memory), a ``--draft-model`` whose vocabulary
    or end-of-sequence ids are not the target's (the load compares the tokenizers in full) or whose
    context is shorter than the target's (every step past it failed). A model whose header cannot
    be read here (a catalog model not pulled yet) is left to the load."""
    from cloud_server.models.loader import read_model_header

    target = read_model_header(args.model)
    if target is None:
        return
    native = target.config.max_position_embeddings
    if args.max_model_len is not None and args.max_model_len > native:
        raise UsageError(f"--max-model-len {args.max_model_len} is more than the context length of "
                         f"{args.model!r} ({native} tokens): give at most {native} or leave it out")
    from cloud_server.engine.pool_plan import _resolve_device, known_kv_bytes, plan_pool

    # the engine's own plan: a replica's device is its own (its pool is checked there); here the
    # pool is checked where known before the load (given, or the CPU's default)
    budget = None
    if cluster:
        max_len, _ = plan_pool(config, target.config, (config.device or "cpu").partition(":")[0], None, None)
    else:
        device, dtype, _ = _resolve_device(config)
        budget = known_kv_bytes(config, device.type)
        max_len, num_blocks = plan_pool(config, target.config, device.type, dtype, budget)
        if budget is not None and num_blocks * config.block_size < max_len:
            raise UsageError(
                f"a KV pool of {budget >> 20} MiB (--kv-cache-memory-mb) holds "
                f"{num_blocks * config.block_size} tokens of {config.model!r} in blocks of "
                f"{config.block_size} (--block-size), less than one sequence of {max_len} "
                f"(--max-model-len): raise --kv-cache-memory-mb or lower --max-model-len"
            )
    draft = read_model_header(args.draft_model) if args.draft_model is not None else None
    if draft is None:
        return
    differs = None
    if draft.config.vocab_size != target.config.vocab_size:
        differs = (f"vocabulary of {draft.config.vocab_size} tokens, the target's "
                   f"{target.config.vocab_size}")
    elif None not in (draft.eos_token_ids, target.eos_token_ids) and (
        draft.eos_token_ids != target.eos_token_ids
    ):
        differs = (f"end-of-sequence token ids {sorted(draft.eos_token_ids or ())}, the target's "
                   f"{sorted(target.eos_token_ids or ())}")
    if differs:
        raise UsageError(f"--draft-model {args.draft_model!r} does not share the tokenizer of "
                         f"--model {args.model!r} (its {differs}): a draft model must use the "
                         "target's tokenizer")
    # the draft runs every position the target does: past its own RoPE table every step failed
    draft_len = draft.config.max_position_embeddings
    if draft_len < max_len:
        raise UsageError(f"--draft-model {args.draft_model!r} has a context length of {draft_len} "
                         f"tokens, less than the target's {max_len} (--max-model-len): give "
                         f"--max-model-len {draft_len} or less")
    # The draft keeps a KV pool of its own beside the target's, as many blocks (the target's block
    # tables index both), at its own bytes a token: beyond --kv-cache-memory-mb. On the CPU the two
    # together must fit in memory (before, only the target's pool was compared with it).
    total = _memory_bytes()
    if budget is None or device.type != "cpu" or total is None:
        return
    draft_bytes = num_blocks * config.block_size * draft.config.kv_bytes_per_token(dtype.itemsize)
    if budget + draft_bytes > total:
        raise UsageError(f"--kv-cache-memory-mb {budget >> 20} and the draft model's own KV pool of "
                         f"{draft_bytes >> 20} MiB (as many blocks, of {args.draft_model!r}) are "
                         f"together more than this machine's memory ({total >> 20} MiB): lower "
                         "--kv-cache-memory-mb")


def _check_device(config: Any) -> None:
    """Refuse before the load a device this machine lacks (``--device cuda`` without CUDA, or
    ``cuda:N`` past its GPUs: the server started, then the load failed) and, on the CPU, a KV pool
    larger than its memory (mapped lazily: refused only after the weights had loaded, if at all).
    Single-process server only: a Ray cluster's replicas run elsewhere."""
    import torch

    name = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kind, _, index = name.partition(":")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index or 0) >= count:
            raise UsageError(f"--device {name}: this machine has "
                             f"{f'{count} CUDA device(s)' if count else 'no CUDA device'}")
        return
    total = _memory_bytes()
    if total is None:
        return
    if config.kv_cache_memory_bytes is not None and config.kv_cache_memory_bytes > total:
        raise UsageError(f"--kv-cache-memory-mb {config.kv_cache_memory_bytes >> 20} is more than "
                         f"this machine's memory ({total >> 20} MiB)")


def _memory_bytes() -> int | None:
    """This machine's physical memory, or None where it is not known (Windows)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


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
    _check_model(args.model)
    if args.draft_model is not None:
        _check_model(args.draft_model, "--draft-model")
    if cluster is None:
        _check_device(config)
    _check_model_header(args, config, cluster is not None)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if cluster is not None:  # Ray is imported only here
        _warn_if_open(api_keys, args.host)  # Ray Serve's proxy binds it
        from cloud_server.cluster.launch import serve_cluster

        return serve_cluster(
            config, cluster, host=args.host, port=args.port, power_watts=args.power_watts,
            app_options={"api_keys": api_keys, "served_model_name": args.served_model_name,
                         "system_prompt": _system_prompt(args.model, args.system_prompt),
                         "max_body_bytes": args.max_body_bytes},
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
    logging.getLogger("cloud_server").info("shut down while the model was loading: not waiting for it")
    weight_cache = sys.modules.get("cloud_server.models.weight_cache")
    if weight_cache is not None:
        weight_cache.remove_partial_files()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args)
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
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
