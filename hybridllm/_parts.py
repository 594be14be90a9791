"""A client's parts: settings to the device, cloud, cache and routing policy, checked, in one Core."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ._config import HybridLLMConfig, load_config
from ._exceptions import ConfigError
from ._pipeline import CachePort, Core, PolicyPort
from .backends.base import Backend, call_guarded


def _build_core(
    *,
    config: str | os.PathLike[str] | None,
    edge: Backend | None,
    cloud: Backend | None,
    cache: CachePort | bool | None,
    policy: PolicyPort | None,
    progress: Any,
    settings: dict[str, Any],
) -> tuple[HybridLLMConfig, Core]:
    """Settings -> parts -> the pipeline. ``cache`` is a cache object, or True/False/None for
    "the default one" / "none" / "as configured"."""
    _check_parts(edge=edge, cloud=cloud, cache=cache, policy=policy)
    if config is not None and not isinstance(config, (str, os.PathLike)):
        # a dict or a HybridLLMConfig raised a bare TypeError from deep in the path handling
        raise ConfigError(f"config= is the path of a TOML file; got {type(config).__name__}. Pass "
                          "settings as keyword arguments instead (HybridLLM(max_tokens=128, ...)).")
    if isinstance(cache, bool):
        settings["cache"] = cache
        cache = None
    cfg = load_config(config, **settings)
    store: CachePort | None = cache
    defaults = {
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "min_p": cfg.min_p,
        "repeat_penalty": cfg.repeat_penalty,
        "presence_penalty": cfg.presence_penalty,
        "frequency_penalty": cfg.frequency_penalty,
        "seed": cfg.seed,
    }
    made: list[Any] = []
    try:
        if edge is None:
            from .backends.base import create_backend

            edge = create_backend(  # "llama_cpp" or "onnx"
                cfg.edge_backend,
                model=cfg.edge_model,
                n_ctx=cfg.n_ctx,
                n_threads=cfg.n_threads,
                progress=progress,
            )
            made.append(edge)
        if cloud is None and cfg.cloud_url:
            from .backends.cloud import CloudBackend

            cloud = CloudBackend(
                base_url=cfg.cloud_url,
                api_key=cfg.cloud_api_key,
                model=cfg.cloud_model,
                connect_timeout_s=cfg.cloud_connect_timeout_s,
                read_timeout_s=cfg.cloud_read_timeout_s,
                stall_timeout_s=cfg.cloud_stall_timeout_s,
                max_retries=cfg.cloud_max_retries,
                breaker_threshold=cfg.cloud_breaker_threshold,
                breaker_cooldown_s=cfg.cloud_breaker_cooldown_s,
                carbon=cfg.cloud_endpoints or None,  # hybridllm.carbon: region, gCO2/kWh
                joules_per_token=cfg.cloud_joules_per_token,
            )
            made.append(cloud)
        if cloud is not None and policy is None:
            policy = _make_policy(cfg, edge)
        if store is None and cfg.cache:
            from .cache import SemanticCache

            store = SemanticCache(
                cfg.cache_path,
                namespace=cfg.namespace,
                ttl_s=cfg.cache_ttl_s,
                max_entries=cfg.cache_max_entries,
                verifier=cfg.cache_verifier,
            )
        ledger = None
        if cloud is not None:
            ledger = cfg.budget()
        core = Core(
            edge=edge,
            cloud=cloud,
            cache=store,
            policy=policy,
            ledger=ledger,
            defaults=defaults,
            namespace=cfg.namespace,
            price_per_1k_tokens=cfg.price_per_1k_tokens,
            cache_min_logprob=cfg.cache_min_logprob,
            edge_max_waiting=cfg.edge_max_waiting,
            edge_wait_timeout_s=cfg.edge_wait_timeout_s,
        )
    except BaseException:
        for part in made:
            part.close()
        raise
    return cfg, core


# an injected part is checked for what the pipeline calls on it, so that a wrong object (a model
# name passed as edge="smollm2", cache="yes") fails at construction, naming the argument, and not
# with an AttributeError deep inside the first answer (or at close)
_PART_NEEDS = {
    "edge": ("stream",),
    "cloud": ("stream",),
    "cache": ("get", "put"),
    "policy": ("decide",),
}
_PART_WHAT = {
    "edge": "a Backend (hybridllm.Backend); to pick a model by name use edge_model=",
    "cloud": "a Backend (hybridllm.Backend); to use an endpoint by URL use cloud_url=",
    "cache": "True, False or a cache object with get() and put() (hybridllm.cache.SemanticCache)",
    "policy": "a routing policy with decide() (hybridllm.router.RoutingPolicy)",
}


def _check_parts(**parts: Any) -> None:
    for name, part in parts.items():
        if part is None or (name == "cache" and isinstance(part, bool)):
            continue
        if isinstance(part, type):  # the class itself has the methods, unbound: refused here, not
            # at the first answer (an EdgeError) or, for a cache, never (every lookup failed, logged)
            raise ConfigError(f"{name}= must be {_PART_WHAT[name]}; got the class {part.__name__}, "
                              f"not an instance: pass {part.__name__}(...).")
        missing = [m for m in _PART_NEEDS[name] if not callable(getattr(part, m, None))]
        if missing:
            lacks = ", ".join(f"{m}()" for m in missing)
            raise ConfigError(f"{name}= must be {_PART_WHAT[name]}; got {part!r} (no {lacks}).")


def _make_policy(cfg: HybridLLMConfig, edge: Backend) -> PolicyPort:
    from .router.policy import RoutingPolicy
    from .router.router import load_router

    router = load_router(cfg.router)
    if cfg.threshold is not None:
        router = dataclasses.replace(router, threshold=cfg.threshold)
    band = (max(0.0, router.threshold - 0.1), router.threshold) if cfg.cascade else None
    return RoutingPolicy(
        router, privacy=cfg.privacy, cascade_band=band,
        edge_context_tokens=call_guarded(lambda: edge.context_length, edge, "edge") or cfg.n_ctx,
    )
