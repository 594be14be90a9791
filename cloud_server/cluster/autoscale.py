"""Autoscaling on queued tokens (``--min-replicas``/``--max-replicas``), as a Ray Serve policy.

Each replica reports ``outstanding_tokens`` through ``record_autoscaling_stats``; Serve hands the
per-replica values to the policy in ``ctx.aggregated_metrics``. The policy wants enough replicas
that each holds at most ``target_tokens_per_replica`` outstanding tokens:

    desired = clamp(ceil(sum of outstanding tokens / target_tokens_per_replica), min, max)

Serve applies its own upscale/downscale delays on top of the number returned. Once a second the
policy also notes Serve's current target on the fleet board, so ``/health`` compares the replicas
that report with the count Serve is holding, not with ``--min-replicas``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from hybridllm._types import is_integer

from .fleet import finite_number, sent_to_lost_board, watch_sent

METRIC = "outstanding_tokens"
TARGET_NOTE = "target_replicas"  # the fleet board's note: Serve's current target replica count


def desired_replicas(
    total_tokens: float, target_tokens_per_replica: int, *, current: int, min_replicas: int, max_replicas: int
) -> int:
    _check_target(target_tokens_per_replica)
    want = math.ceil(total_tokens / target_tokens_per_replica) if total_tokens > 0 else min_replicas
    return max(min_replicas, min(max_replicas, want))


def _check_target(value: Any) -> int:
    """``target_tokens_per_replica`` as an int, or a ValueError naming it and the value given.
    The project's rule for integer settings (``hybridllm._types.is_integer``): an integer of any
    type (numpy's too), never a bool or a float, even ``256.0`` (refused by ``ClusterConfig`` too)."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"target_tokens_per_replica (--target-tokens-per-replica) must be an "
                         f"integer >= 1, got {value!r}")
    return int(value)


class QueuedTokensPolicy:
    """Serve's custom autoscaling policy (a class: ``policy_kwargs`` reach the constructor)."""

    def __init__(self, target_tokens_per_replica: int = 4096, board_name: str | None = None) -> None:
        # refused here, when the app is built: later Serve's controller would log the error on
        # every autoscaling tick and the fleet would never scale (0.5 was truncated to 0)
        self.target_tokens_per_replica = _check_target(target_tokens_per_replica)
        self._board_name = board_name
        self._board: Any = None
        self._sent: Any = None  # the last note's future: it fails once the board's actor died
        self._noted: tuple[float, int] | None = None

    def _note_target(self, target: int) -> None:
        """Serve's target on the fleet board: on a change at once, else once a second."""
        now = time.monotonic()
        if self._board_name is None or (
            self._noted is not None and self._noted[1] == target and now - self._noted[0] < 1.0
        ):
            return
        self._noted = (now, target)
        try:
            if self._board is None or sent_to_lost_board(self._sent):
                import ray

                # a board whose actor died is got again by name (created again by a replica)
                self._board, self._sent = None, None
                self._board = ray.get_actor(self._board_name, namespace="hybridllm")
            self._sent = watch_sent(self._board.note.remote(TARGET_NOTE, target))
        except Exception:  # noqa: BLE001 - the board may not exist yet; health falls back
            self._board = None

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        target = getattr(ctx, "target_num_replicas", None)
        if isinstance(target, int):
            self._note_target(target)
        per_replica = (ctx.aggregated_metrics or {}).get(METRIC, {})
        # Serve's average of a window with no sample is None; a NaN would make the sum NaN, read
        # as "no load", and scale a busy fleet down to its minimum: only finite values count
        values = [float(v) for v in per_replica.values() if finite_number(v)]
        # Serve leaves out a running replica that has pushed no figure yet (just started, the
        # controller restarted, its stats call hanging): running replicas of which none has a
        # figure are not an idle fleet either
        running = getattr(ctx, "running_replicas", None)
        if not values and (per_replica or running):  # none with a figure: hold, never shrink blind
            lo, hi = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
            return max(lo, min(hi, ctx.current_num_replicas)), ctx.policy_state or {}
        n = desired_replicas(
            sum(values),
            self.target_tokens_per_replica,
            current=ctx.current_num_replicas,
            min_replicas=ctx.capacity_adjusted_min_replicas,
            max_replicas=ctx.capacity_adjusted_max_replicas,
        )
        return n, ctx.policy_state or {}
