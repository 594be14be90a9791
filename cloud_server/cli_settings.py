"""The serve command's options as settings: EngineConfig and ClusterConfig, errors in the options' words."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from typing import Any

from cloud_server.cli_parser import UsageError
from cloud_server.exceptions import ConfigError

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
                or args.replace or args.graceful_shutdown_s is not None):
            raise UsageError("--ray-address, --replace, --min-replicas, --max-replicas, "
                             "--graceful-shutdown-s and the autoscaling options go with --replicas N")
        return None
    if tuning and args.min_replicas is None and args.max_replicas is None:
        flags = ", ".join("--" + name.replace("_", "-") for name in tuning)
        raise UsageError(f"{flags} tune autoscaling: add --min-replicas A and/or --max-replicas B")
    ray_address = args.ray_address
    if ray_address is None and os.environ.get(RAY_ADDRESS_ENV):
        # ray.init(address=None) joins the cluster RAY_ADDRESS names: taken as --ray-address, or
        # that cluster was handled as a local Ray (no check for another serve's app, which was
        # replaced; the fleet board, a detached actor, left on it at exit)
        ray_address = os.environ[RAY_ADDRESS_ENV]
        _check_ray_address(ray_address, RAY_ADDRESS_ENV)
    elif ray_address is not None:
        _check_ray_address(ray_address)
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
        return ClusterConfig(replicas=args.replicas, ray_address=ray_address,
                             min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                             replace_app=args.replace, **tuning,
                             **({} if args.graceful_shutdown_s is None
                                else {"graceful_shutdown_s": args.graceful_shutdown_s}))
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc


RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own: the cluster ray.init joins when given no address

# what Ray's address takes: auto (a cluster on this machine), HOST:PORT (the head's GCS) or
# ray://HOST:PORT (Ray Client); HOST a name, an IPv4 address or an IPv6 one in brackets
_RAY_ADDRESS = re.compile(r"(?:ray://)?(?:\[[0-9A-Fa-f:.]+\]|[\w.-]+):(\d{1,5})")


def _check_ray_address(address: str, source: str = "--ray-address") -> None:
    match = _RAY_ADDRESS.fullmatch(address)
    if address != "auto" and (match is None or not 0 < int(match[1]) < 65536):
        leave = "unset it" if source == RAY_ADDRESS_ENV else "leave it out"
        raise UsageError(
            f"{source} {address!r} is not an address of a Ray cluster: give auto (a cluster "
            "started on this machine), HOST:PORT (the address `ray start --head` prints) or "
            f"ray://HOST:10001; {leave} to start a local Ray instance"
        )
