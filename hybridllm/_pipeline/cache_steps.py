"""The pipeline's cache steps: the lookup before the plan (1) and the store after the answer (4)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .._types import Completion, Decision, Messages
from ..backends.base import Backend
from .ports import CacheHitLike, _CoreParts
from .request import Request

log = logging.getLogger("hybridllm")

_DEFAULT_PORTS = {"http": 80, "https": 443}


def cache_model_of(edge: Backend, cloud: Backend | None) -> str:
    """The model part of every cache key: what can make an answer. The edge model; with a cloud, its
    configured model ("edge|cloud:gpt-4o"), else its endpoints, which may serve any model
    ("edge|cloud@https://api.example/v1"): pointing cloud_url elsewhere serves none of the old
    server's answers. A backend with neither (a custom one) stays "edge|cloud"."""
    if cloud is None:
        return edge.model
    if cloud.model != "cloud":
        return f"{edge.model}|cloud:{cloud.model}"
    # sorted and deduplicated, so the order the endpoints are listed in does not matter
    names = sorted({n for e in getattr(cloud, "endpoints", None) or ()
                    if (n := _endpoint_name(getattr(e, "base_url", None))) is not None})
    return f"{edge.model}|cloud" + ("@" + " ".join(names) if names else "")


def _endpoint_name(url: object) -> str | None:
    """An endpoint as the cache key names it: scheme, host and API root, rebuilt from the URL's
    parts so no user:password@, query string (a ?key=) or fragment is ever in it; the scheme and
    the host in lower case, a default port left out (http://H:80/v1/ is http://h/v1)."""
    from urllib.parse import urlsplit

    from ..backends.cloud_http import _api_root

    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(_api_root(url))
        port, host = parts.port, parts.hostname
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if not host or scheme not in _DEFAULT_PORTS:
        return None
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    shown = host if port is None or port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return f"{scheme}://{shown}{parts.path.rstrip('/')}"


class _CacheSteps(_CoreParts):
    # 1. lookup
    async def _lookup(self, req: Request) -> tuple[Any, CacheHitLike | None]:
        assert self.cache is not None
        cache = self.cache
        ns = req.options.namespace or self.namespace

        def lookup() -> tuple[Any, CacheHitLike | None]:
            # an exact repeat first, without the embedder (a cache may not offer it: optional)
            exact = getattr(cache, "get_exact", None)
            if exact is not None:
                try:
                    hit = exact(req.messages, model=self.cache_model, params_key=req.params.cache_key(),
                                namespace=ns)
                except Exception as exc:  # noqa: BLE001 - answer without the cache
                    log.warning("semantic cache lookup failed: %s", exc)
                    return None, None
                if hit is not None:
                    return None, hit
            # optional too: a cache= needs only get() and put() (the client checks no more), and
            # a custom cache's own error (not a HybridLLMError) failed every request with it
            embed = getattr(cache, "embed_query", None)
            try:
                vec = embed(req.messages) if embed is not None else None
            except Exception as exc:  # noqa: BLE001 - a broken cache must not break answering
                if not self._cache_embed_failed:
                    self._cache_embed_failed = True
                    log.warning("semantic cache embedding failed (%s); answering without the cache "
                                "(logged once)", exc)
                return None, None
            # a cache that offers get_exact takes exact_checked= in get (SemanticCache): the exact
            # repeat was just looked up above, so get does not read it again
            skip: dict[str, Any] = {"exact_checked": True} if exact is not None else {}
            try:
                return vec, cache.get(
                    req.messages,
                    model=self.cache_model,
                    params_key=req.params.cache_key(),
                    namespace=ns,
                    embedding=vec,
                    **skip,
                )
            except Exception as exc:  # noqa: BLE001 - same: answer without the cache
                log.warning("semantic cache lookup failed: %s", exc)
                return vec, None

        return await asyncio.get_running_loop().run_in_executor(None, lookup)

    # 4. record
    async def _record(self, req: Request, d: Decision, c: Completion, vec: Any, use_cache: bool,
                      cloud_tokens: int = 0) -> None:
        self.stats.record(c, cloud_tokens=cloud_tokens)
        if not use_cache or not c.text.strip() or self.cache is None:
            return
        if c.finish_reason != "stop":  # cut by max_tokens or the context: a hit would replay it as whole
            return
        if req.stand_in:  # the device's answer in the cloud's place: the cloud's is stored once it answers
            return
        floor = self.cache_min_logprob
        if floor is not None and c.mean_logprob is not None and c.mean_logprob < floor:
            log.info(
                "not caching an unsure answer (mean token log-probability %.2f < %.2f)", c.mean_logprob, floor
            )
            return
        cache, ns = self.cache, req.options.namespace or self.namespace
        # the plan step's privacy scan runs only in a RoutingPolicy with privacy on: with no cloud,
        # no policy, privacy="off" or a policy of the caller's own, none ran (or none is known to),
        # and the cache's store_pii still keeps personal data out of the file, so the prompt is
        # scanned here (before, privacy="off" wrote an e-mail address to the file in clear)
        unscanned = self.cloud is None or getattr(self.policy, "privacy", "off") == "off"

        def put() -> None:
            try:
                pii = bool(d.pii_kinds) or (unscanned and _holds_pii(req.messages))
                cache.put(
                    req.messages,
                    c.text,
                    model=self.cache_model,
                    params_key=req.params.cache_key(),
                    namespace=ns,
                    pii=pii,
                    metadata={"route": c.route, "model": c.model, "tokens": c.usage.total_tokens},
                    embedding=vec,
                )
            except Exception as exc:  # noqa: BLE001 - a cache that cannot write never costs the answer
                if not self._cache_write_failed:
                    self._cache_write_failed = True
                    log.warning(
                        "the semantic cache cannot store answers (%s: %s); answering "
                        "without storing (logged once)",
                        type(exc).__name__,
                        exc,
                    )

        await asyncio.get_running_loop().run_in_executor(None, put)


def _holds_pii(messages: Messages) -> bool:
    from ..router.privacy import pii_kinds_in_messages

    return bool(pii_kinds_in_messages(messages))
