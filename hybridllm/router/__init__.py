"""The learned difficulty router and the routing policies.

    router = load_router()                       # the shipped default (hybridllm/_data/router/)
    router.score(messages) -> float in [0, 1]    # route = "cloud" if score >= router.threshold
                                                 # (threshold 1: never; see router.sends_to_cloud)
    policy = RoutingPolicy(router, privacy="redact")
    decision = policy.decide(messages)           # Decision(route, reason, score, ...)
    budget = Budget(max_cloud_calls_per_hour=100)  # a ledger; HybridLLM keeps one per client

Modules: features (text statistics + embedding), classifier (the scorer's numpy weights), router
(score, threshold, file format), train, evaluate (RouteLLM metrics), calibrate, label, privacy,
budget, policy, mixture (several labelled files: one scorer each, blended by a gate), _cli
(``hybridllm router ...``; its commands in _cli_commands and _cli_eval).

The names below are imported on first use (PEP 562), so importing one light submodule (the
client's pipeline imports ``privacy``) does not load numpy and the scorer with it.
"""

from __future__ import annotations

import typing as _typing

from .._lazy import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
    from .budget import Budget
    from .policy import Decision, RoutingPolicy
    from .privacy import PII_KINDS, detect_pii, redact_pii
    from .router import Router, load_router

# public name -> the submodule that defines it
_LAZY = {
    "Budget": "budget",
    "Decision": "policy",
    "RoutingPolicy": "policy",
    "PII_KINDS": "privacy",
    "detect_pii": "privacy",
    "redact_pii": "privacy",
    "Router": "router",
    "load_router": "router",
}

__all__ = [
    "PII_KINDS",
    "Budget",
    "Decision",
    "Router",
    "RoutingPolicy",
    "detect_pii",
    "load_router",
    "redact_pii",
]


__getattr__, __dir__ = _lazy_names(__name__, globals(), _LAZY, __all__)
