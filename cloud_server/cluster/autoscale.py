"""Autoscaling on queued tokens (``--min-replicas``/``--max-replicas``), as a Ray Serve policy.

Each replica reports ``outstanding_tokens`` through ``record_autoscaling_stats``; Serve hands the
per-replica values to the policy in ``ctx.aggregated_metrics``. The policy wants enough replicas
that each holds at most ``target_tokens_per_replica`` outstanding tokens:

    desired = clamp(ceil(sum of outstanding tokens / target_tokens_per_replica), min, max)

Serve applies its own upscale/downscale delays on top of the number returned.
"""

from __future__ import annotations

import math
from typing import Any

METRIC = "outstanding_tokens"


def desired_replicas(
    total_tokens: float, target_tokens_per_replica: int, *, current: int, min_replicas: int, max_replicas: int
) -> int:
    if target_tokens_per_replica < 1:
        raise ValueError("target_tokens_per_replica must be >= 1")
    want = math.ceil(total_tokens / target_tokens_per_replica) if total_tokens > 0 else min_replicas
    return max(min_replicas, min(max_replicas, want))


class QueuedTokensPolicy:
    """Serve's custom autoscaling policy (a class: ``policy_kwargs`` reach the constructor)."""

    def __init__(self, target_tokens_per_replica: int = 4096) -> None:
        self.target_tokens_per_replica = int(target_tokens_per_replica)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        per_replica = (ctx.aggregated_metrics or {}).get(METRIC, {})
        total = float(sum(per_replica.values()))
        n = desired_replicas(
            total,
            self.target_tokens_per_replica,
            current=ctx.current_num_replicas,
            min_replicas=ctx.capacity_adjusted_min_replicas,
            max_replicas=ctx.capacity_adjusted_max_replicas,
        )
        return n, ctx.policy_state or {}
