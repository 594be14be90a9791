"""The Ray Serve request router: a thin shell around :class:`~.policy.TokenAwareRouter`.

Ray Serve (2.47+) lets a deployment name its own ``RequestRouter`` subclass in
``request_router_config``; Serve calls ``choose_replicas`` with the candidate replicas and the
pending request and tries the returned ranks in order (within a rank, the replica with the shortest
queue). Each replica's ``record_routing_stats`` result arrives as ``RunningReplica.routing_stats``
(2.48+). Our ranks hold one replica each: the policy's choice first, then the others by load.

A request to ``generate`` carries ``(prompt_ids, params, request_id)``; any other call (``describe``)
just goes to the least loaded replica.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .fleet import sent_to_lost_board, watch_sent
from .policy import TokenAwareRouter, _count, estimate_tokens, prompt_block_hashes

GENERATE = "generate"


def request_shape(pending: PendingRequest | None) -> tuple[list[int], int] | None:
    """(prompt token ids, max_tokens) of a ``generate`` call, else None."""
    if pending is None or getattr(pending.metadata, "call_method", None) != GENERATE:
        return None
    args = pending.args
    if len(args) < 2 or not isinstance(args[0], list) or not isinstance(args[1], dict):
        return None
    # a max_tokens that is no count (None, "8", NaN) books no decode: the replica refuses it
    return args[0], _count(args[1].get("max_tokens", 0))


class TokenPrefixRequestRouter(RequestRouter):
    """Longest cached prefix unless overloaded by a margin, else fewest outstanding tokens."""

    def initialize_state(self, **kwargs: Any) -> None:
        self.block_size = int(kwargs.get("block_size", 16))
        self.prefix_caching = bool(kwargs.get("prefix_caching", True))
        self.policy = TokenAwareRouter(
            block_size=self.block_size,
            imbalance_ratio=float(kwargs.get("imbalance_ratio", 0.25)),
            min_margin_tokens=int(kwargs.get("min_margin_tokens", 128)),
            prefill_weight=float(kwargs.get("prefill_weight", 1.0)),
            decode_weight=float(kwargs.get("decode_weight", 0.5)),
            report_ttl_s=float(kwargs.get("report_ttl_s", 10.0)),
        )
        self._report_stamps: dict[Any, Any] = {}
        self._watched: set[str] = set()  # requests whose pending future we watch for a cancel
        self._board_name = kwargs.get("board_name")
        self._board: Any = None
        self._sent: Any = None  # the last note's future: it fails once the board's actor died
        self._posted_at = 0.0

    def _post_decisions(self) -> None:
        """Once a second, the router's own figures go to the fleet board (bench, debugging)."""
        now = time.monotonic()
        if self._board_name is None or now - self._posted_at < 1.0:
            return
        self._posted_at = now
        try:
            if self._board is None or sent_to_lost_board(self._sent):
                import ray

                # a board whose actor died is got again by name (created again by a replica)
                self._board, self._sent = None, None
                self._board = ray.get_actor(self._board_name, namespace="hybridllm")
            p = self.policy
            self._sent = watch_sent(self._board.note.remote(
                "router",
                {
                    "prefix_choices": p.num_prefix_choices,
                    "spill_choices": p.num_spill_choices,
                    "home_choices": p.num_home_choices,
                    "least_token_choices": p.num_load_choices,
                    "open_tokens": [b.sent_tokens for b in p.books.values()],
                    "reported_tokens": [b.reported_tokens for b in p.books.values()],
                },
            ))
        except Exception:  # noqa: BLE001 - figures are best effort
            self._board = None

    def _hashes(self, prompt_ids: list[int]) -> list[int]:
        """The prompt's block hashes; none where the replicas cache no prefix (the books would
        claim blocks no replica holds, and keep a shared prompt on one replica), or where its ids
        are no 64-bit ints (a float, a str, 2**64): the replica refuses such a prompt with a clear
        error, the router must not raise (an exception in ``choose_replicas`` ends Serve's routing
        task, and the request waits for a replica for ever)."""
        if not self.prefix_caching:
            return []
        try:
            return prompt_block_hashes(prompt_ids, self.block_size)
        except (TypeError, ValueError, OverflowError, struct.error):
            return []

    def _refresh(self) -> None:
        self.policy.sync_replicas(self._replicas)
        for gone in [k for k in self._report_stamps if k not in self._replicas]:
            del self._report_stamps[gone]  # replicas come and go (autoscaling, restarts)
        for replica_id, replica in self._replicas.items():
            stats = replica.routing_stats or {}
            stamp = stats.get("reported_at")
            if stamp is not None and self._report_stamps.get(replica_id) != stamp:
                self._report_stamps[replica_id] = stamp
                self.policy.on_report(replica_id, stats)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        self._refresh()
        books = self.policy.books

        def load(r: RunningReplica) -> int:
            b = books.get(r.replica_id)
            return b.load() if b is not None else 0

        shape = request_shape(pending_request)
        if shape is None or pending_request is None:
            return [[r] for r in sorted(candidate_replicas, key=load)]
        prompt_ids, max_tokens = shape
        hashes = self._hashes(prompt_ids)
        choice = self.policy.choose([r.replica_id for r in candidate_replicas], hashes)
        tokens = estimate_tokens(len(prompt_ids), choice.matched_blocks, self.block_size, max_tokens)
        self.policy.on_sent(
            choice.replica,
            pending_request.metadata.internal_request_id,
            hashes,
            tokens,
            prefill_tokens=tokens - max_tokens,
            reason=choice.reason,
        )
        self._watch(pending_request)
        self._post_decisions()
        first = [r for r in candidate_replicas if r.replica_id == choice.replica]
        rest = sorted((r for r in candidate_replicas if r.replica_id != choice.replica), key=load)
        return [first, *[[r] for r in rest]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: Any, result: Any) -> None:
        """The replica that took the request (not always our first rank: a full one turns it
        away, and Serve tries the next): its books carry the request's tokens from now on."""
        shape = request_shape(pending_request)
        if shape is None:
            return
        prompt_ids, max_tokens = shape
        hashes = self._hashes(prompt_ids)
        rid = pending_request.metadata.internal_request_id
        self.policy.on_routed(replica_id, rid, hashes, len(prompt_ids), max_tokens)

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        # every attempt ends here, one a replica turned away too: the policy knows which counts
        self.policy.on_done(internal_request_id, replica_id)

    def _watch(self, pending: PendingRequest) -> None:
        """Serve calls ``on_request_completed`` only for a request it sent to a replica; one
        cancelled while it waits for a free replica (its client gave up) would stay on our books
        as load for ever: drop it when its pending future is cancelled."""
        rid = pending.metadata.internal_request_id
        future = getattr(pending, "future", None)
        if future is None or rid in self._watched:
            return
        self._watched.add(rid)

        def on_future_done(fut: Any) -> None:
            self._watched.discard(rid)
            if fut.cancelled():
                self.policy.on_cancelled(rid)

        future.add_done_callback(on_future_done)
