"""The engine's side of speculative decoding, step by step.

1. ``lookahead(seq, num_decoding)``: the scheduler asks how many draft slots a decoding sequence
   gets this step (the adaptive rule below); 0 means a plain decode.
   ``prefill(scheduled, ...)``: a draft model prefills alongside the target's prefill chunks.
2. ``propose(scheduled)``: drafts for the sequences given slots (prompt lookup, or the draft
   model run over all of them in one batch per position); the scheduler appends them.
3. ``verify(scheduled, result)``: one target step computed every draft position as a decode row
   (beside other sequences' decode rows and prefill chunks); the rejection rule keeps a prefix.

Adaptive rule (so that speculation never costs throughput under load): every draft token is one
more row in the target step. Rows are nearly free while a step is bound by reading the weights
(few rows) and cost their full compute once it is not, so a step gets at most
``max_spec_rows`` draft rows in all, split over its decoding sequences: k = min(K, (R - B) // B)
for B decoding sequences; at B >= R / 2 speculation is off. A sequence whose acceptance rate
(an exponential average over its own steps) falls below ``min_acceptance`` drafts only every
``probe_every`` steps, one token, to notice when its text becomes predictable again.

Row blocks: the CPU int4 and int8 matmuls compute their rows in blocks of ``row_block`` (8 with
the engine's kernels, 4 with torch's) and pay a full pass over the weights per block, so a row
past a block costs much more than one inside it (torch's kernel, one thread, the 1.5B's matmuls:
164 ms at 4 rows, 295 ms at 5). A sequence's 1 + k rows are therefore rounded down to whole blocks
once they pass one: k = floor((1 + k) / b) * b - 1 (K = 8 verifies 8 rows).

Prompt-lookup ramp: a match starts a copy run more often than not, and a copy run goes on past
a few tokens, but most rows of a long draft after a wrong guess are wasted. So a sequence drafts
at most ``_RAMP`` tokens by prompt lookup until its previous draft was accepted whole, and then
up to K (8 by default). Where no 2-token match exists (48% of the 1.5B's steps on the long prompt
set), the latest occurrence of the last token alone proposes up to ``_FALLBACK`` tokens. Both
were chosen by replaying the 1.5B's greedy outputs under measured step costs, and measured in
process (the README's speculative decoding section has the figures); replays under the step costs
of the engine's int8-activation kernels (4 rows 1.13x a plain step, 8 rows 1.47x) put the ramp of
3, K = 8 and a fallback of 3 within 1% of the best of ramps 3-7, K 5-15 and fallbacks 1-7.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from ..scheduler import ScheduledSeq
from ..sequence import Sequence
from ..structured import grammar_prefix
from .ngram import propose_ngram
from .rejection import verify_greedy, verify_sampled

_EMA = 0.3  # weight of the latest step in the acceptance average
_RAMP = 3  # prompt-lookup drafts until a draft is accepted whole
_FALLBACK = 3  # drafts from a one-token match, where no 2-token match exists
# K when neither the server nor the request sets it: prompt lookup's drafts cost nothing to make
# (and the ramp keeps them short after a miss), each draft-model token costs a draft step (a
# fourth draft, accepted about a third of the time, costs more than it brings)
DEFAULT_K = {"ngram": 8, "draft": 3}


@dataclass
class SpecStats:
    """Counters with vLLM's meanings: a draft is one sequence's proposal in one step.

    The engine thread updates them in several statements while ``/metrics`` reads them from
    another thread: ``record`` and ``snapshot`` share a lock, so a scrape never sees a draft half
    counted (accepted tokens without their draft tokens, or per position ahead of the total)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, num_draft: int, num_accepted: int) -> None:
        with self._lock:
            self.num_drafts += 1
            self.num_draft_tokens += num_draft
            self.num_accepted_tokens += num_accepted
            if len(self.accepted_per_pos) < num_draft:
                self.accepted_per_pos += [0] * (num_draft - len(self.accepted_per_pos))
            for i in range(num_accepted):
                self.accepted_per_pos[i] += 1

    def snapshot(self) -> dict[str, Any]:
        """The counters of whole drafts only, as ``engine.stats()`` reports them."""
        with self._lock:
            return {
                "spec_decode_num_drafts": self.num_drafts,
                "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
            }

    def restore(self, counts: dict[str, Any]) -> None:
        """Go back to a ``snapshot`` (a failed step's drafts are not counted)."""
        with self._lock:
            self.num_drafts = counts["spec_decode_num_drafts"]
            self.num_draft_tokens = counts["spec_decode_num_draft_tokens"]
            self.num_accepted_tokens = counts["spec_decode_num_accepted_tokens"]
            self.accepted_per_pos = list(counts["spec_decode_num_accepted_tokens_per_pos"])

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verified draft: 1 (the target's own) + accepted drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass
class _SeqState:
    acceptance: float = 0.7  # optimistic start: the first drafts decide
    steps: int = 0
    whole: bool = False  # the previous step's draft was accepted whole (the prompt-lookup ramp)


class SpecDecoder:
    def __init__(
        self,
        *,
        method: str | None,
        num_speculative_tokens: int | None,
        max_model_len: int,
        draft: Any = None,  # a DraftProposer when a draft model is loaded
        max_spec_rows: int = 16,
        row_block: int = 1,
        min_acceptance: float = 0.2,
        probe_every: int = 4,
    ) -> None:
        self.method = method
        self.k = num_speculative_tokens  # None: DEFAULT_K of the method
        self.max_model_len = max_model_len
        self.draft = draft
        self.max_spec_rows = max_spec_rows
        self.row_block = row_block
        self.min_acceptance = min_acceptance
        self.probe_every = probe_every
        self.stats = SpecStats()
        self._state: dict[int, _SeqState] = {}
        self._ngram: dict[int, list[int]] = {}  # proposals made in lookahead(), used by propose()
        self._draft_probs: dict[int, Any] = {}  # q of this step's draft-model drafts, for verify()
        # the step's start value of each state it changed (None: it had none), for restore_marks
        self._journal: dict[int, _SeqState | None] = {}
        self.token_index: Any = None  # the engine's, once a response_format request came

    def method_for(self, seq: Sequence) -> tuple[str | None, int]:
        """The request's own choice, else the server's."""
        p = seq.params
        method = p.speculative_method or self.method
        if method == "none" or method is None:
            return None, 0
        k = p.num_speculative_tokens if p.num_speculative_tokens is not None else self.k
        return method, DEFAULT_K[method] if k is None else k

    @property
    def server_k(self) -> int:
        """K for requests that do not set their own (0 when speculation is off)."""
        return (self.k or DEFAULT_K[self.method]) if self.method else 0

    def _slots_each(self, num_decoding: int) -> int:
        """Draft slots each of ``num_decoding`` sequences may take: k = (R - B) // B."""
        return (self.max_spec_rows - num_decoding) // max(1, num_decoding)

    # -- 1. slots -----------------------------------------------------------------------------
    def _room(self, seq: Sequence, ahead: int = 0) -> int:
        """Drafts one step may verify for ``seq``, ``ahead`` tokens from now: never past max_tokens
        or the context window (the last position computed is num_tokens - 1 + k, and k accepted
        drafts + 1 new token must fit max_tokens)."""
        return min(seq.params.max_tokens - seq.num_output_tokens - ahead - 1,
                   self.max_model_len - seq.num_tokens - ahead - 1)

    def lookahead(self, seq: Sequence, num_decoding: int) -> int:
        self._ngram.pop(seq.seq_id, None)  # a proposal lives for one step only
        method, k = self.method_for(seq)
        if method is None or k < 1:
            return 0
        k = min(k, self._slots_each(num_decoding))
        b = self.row_block
        if 1 + k > b:  # whole row blocks only: rows = floor((1 + k) / b) * b
            k = (1 + k) // b * b - 1
        k = min(k, self._room(seq))
        if k < 1:
            return 0
        state = self._own_state(seq.seq_id)
        state.steps += 1
        if state.acceptance < self.min_acceptance:
            if state.steps % self.probe_every:
                return 0
            k = 1
        if method == "ngram":
            if not state.whole:
                k = min(k, _RAMP)
            drafts = propose_ngram(seq.token_ids, k, fallback_k=_FALLBACK)
            if seq.matcher is not None and self.token_index is not None:  # a response_format request
                drafts = grammar_prefix(self.token_index, seq.matcher, drafts)
            state.whole = False  # verify() sets it again when these drafts all pass
            if drafts:
                self._ngram[seq.seq_id] = drafts
            return len(drafts)
        return k

    # -- 2. proposals ------------------------------------------------------------------------
    def propose(self, scheduled: list[ScheduledSeq], blocks: Any = None) -> dict[int, list[int]]:
        """Drafts for every sequence given lookahead slots (at most that many each); ``blocks``:
        the engine's BlockManager, so a draft model reuses its keys of prefix-hit blocks."""
        out: dict[int, list[int]] = {}
        model_items: list[ScheduledSeq] = []
        for item in scheduled:
            if item.num_spec_slots < 1:
                continue
            sid = item.seq.seq_id
            if sid in self._ngram:
                out[sid] = self._ngram.pop(sid)[: item.num_spec_slots]
            else:
                model_items.append(item)
        self._ngram.clear()
        self._draft_probs = {}
        if model_items:
            drafts, probs = self.draft.propose(model_items, blocks)
            out.update(drafts)
            self._draft_probs = probs
        return out

    def prefill(
        self, scheduled: list[ScheduledSeq], blocks: Any, num_running: int, budget: int
    ) -> list[Sequence]:
        """Run the draft model over this step's prefill chunks of the sequences that will draft
        with it, as far as the target goes but short of the last token (the first proposal
        computes it, so the draft never samples here); returns the sequences whose draft KV
        advanced.

        Only while speculation would be on with ``num_running`` decoding sequences (the adaptive
        rule above): on a busy server sequences may never draft, and their first proposal
        catches up instead. At most ``budget`` draft tokens a step (the scheduler's token budget),
        so a long prefix that only the target had cached is caught up over several steps."""
        if self.draft is None or self._slots_each(num_running) < 1:
            return []
        chunks: list[tuple[Sequence, int]] = []
        for item in scheduled:
            seq, n = item.seq, item.num_new_tokens
            method, k = self.method_for(seq)
            middle = seq.num_computed_tokens + n < seq.num_tokens
            if method != "draft" or k < 1 or item.num_lookahead or not (middle or n > 1):
                continue  # decode rows and plain or prompt-lookup requests
            # lookahead()'s bound once this prefill has sampled its token: a request with no
            # room for a draft then (2 tokens or fewer to go) never drafts, its prefill is wasted
            if self._room(seq, ahead=1) < 1:
                continue
            start = self.draft.start(seq, blocks)
            end = min(seq.num_computed_tokens + n, seq.num_tokens - 1, start + budget)
            if end > start:
                chunks.append((seq, end))
                budget -= end - start
            if budget <= 0:
                break
        if chunks:
            self.draft.prefill(chunks)
        return [seq for seq, _ in chunks]

    # -- 3. verification ---------------------------------------------------------------------
    def verify(
        self,
        scheduled: list[ScheduledSeq],
        tokens: dict[int, Any],
        probs: dict[int, Any] | None,
        generator: Any,
    ) -> tuple[dict[int, list[int]], dict[int, int]]:
        """(new tokens, rejected draft count) per sequence, for ``Scheduler.update``.

        ``tokens[seq_id]`` holds the target's token at each output position; for a sequence with
        drafts the new tokens are the correction or bonus token after the accepted drafts, which
        stay in ``token_ids``.
        """
        new: dict[int, list[int]] = {}
        rejected: dict[int, int] = {}
        sampled: list[ScheduledSeq] = []
        accepted_of: dict[int, int] = {}
        for item in scheduled:
            seq, sid = item.seq, item.seq.seq_id
            out = tokens.get(sid)
            k = item.num_lookahead
            if not isinstance(out, list):  # the row failed: none of its drafts was verified
                if k:
                    rejected[sid] = k
                continue
            if k == 0:
                new[sid] = out
            elif seq.params.is_greedy or probs is None:
                emitted = verify_greedy(seq.token_ids[seq.num_tokens - k :], out)
                accepted_of[sid] = len(emitted) - 1
                new[sid] = emitted[-1:]
            else:
                sampled.append(item)
        if sampled:
            accepted, emitted = self._verify_sampled(sampled, tokens, probs, generator)
            for item, a, t in zip(sampled, accepted, emitted, strict=True):
                accepted_of[item.seq.seq_id] = a
                new[item.seq.seq_id] = [t]
        # q lives for one step: kept, it held every drafting sequence's [k, V] rows (on the
        # device) past the step and past the request's end, while the server sat idle
        self._draft_probs = {}
        for item in scheduled:
            sid = item.seq.seq_id
            if sid not in accepted_of:
                continue
            k, a = item.num_lookahead, accepted_of[sid]
            self.stats.record(k, a)
            state = self._own_state(sid)
            state.acceptance += _EMA * (a / k - state.acceptance)
            state.whole = a == k
            rejected[sid] = k - a
        return new, rejected

    def _verify_sampled(
        self, items: list[ScheduledSeq], tokens: dict[int, Any], probs: Any, generator: Any
    ) -> tuple[list[int], list[int]]:
        """The rejection rule over every sampled sequence of the step in one batch."""
        import torch

        kmax = max(it.num_lookahead for it in items)
        first = probs[items[0].seq.seq_id]
        n, vocab, dev = len(items), first.shape[-1], first.device
        drafts = torch.zeros(n, kmax, dtype=torch.long, device=dev)
        target = torch.zeros(n, kmax + 1, vocab, dtype=first.dtype, device=dev)
        q = None
        if any(it.seq.seq_id in self._draft_probs for it in items):
            q = torch.zeros(n, kmax, vocab, dtype=first.dtype, device=dev)
        bonus, uniforms = [], []
        for row, it in enumerate(items):
            seq, sid, k = it.seq, it.seq.seq_id, it.num_lookahead
            drafts[row, :k] = torch.tensor(seq.token_ids[seq.num_tokens - k :])
            target[row, : k + 1] = probs[sid]
            if q is not None and sid in self._draft_probs:
                dq = self._draft_probs[sid][:k]  # [k, V], or [k, N] from a cut draft head
                q[row, :k, : dq.shape[-1]] = dq  # q = 0 on the ids the draft cannot propose
            elif q is not None:  # a prompt-lookup row beside draft-model rows: q one-hot
                q[row, torch.arange(k), drafts[row, :k]] = 1.0
            bonus.append(tokens[sid][k])
            # k + 1 draws of its own (k accept tests, then the residual draw in the last column),
            # not kmax + 1: a seeded request's draws must not depend on the others' drafts
            u = torch.rand(k + 1, generator=generator(seq), device=dev)
            row_u = torch.zeros(kmax + 1, device=dev)
            row_u[:k], row_u[kmax] = u[:k], u[k]
            uniforms.append(row_u)
        num = torch.tensor([it.num_lookahead for it in items], device=dev)
        accepted, emitted = verify_sampled(
            drafts, num, target, q, torch.tensor(bonus, device=dev), torch.stack(uniforms)
        )
        return accepted.tolist(), emitted.tolist()

    def needs_probs(self, scheduled: list[ScheduledSeq]) -> bool:
        return any(s.num_lookahead and not s.seq.params.is_greedy for s in scheduled)

    def _own_state(self, sid: int) -> _SeqState:
        """The sequence's state, for ``lookahead`` or ``verify`` to change: its value at the
        step's start is kept first (a copy per sequence that drafts, not per running one)."""
        state = self._state.get(sid)
        if sid not in self._journal:
            self._journal[sid] = None if state is None else replace(state)
        if state is None:
            state = self._state[sid] = _SeqState()
        return state

    def adaptive_marks(self) -> tuple[dict[int, _SeqState | None], dict[str, Any]]:
        """Start a step: the states its ``lookahead`` and ``verify`` calls change (step count,
        "accepted whole" mark, acceptance) are kept as they were, with the draft counters, so
        ``restore_marks`` can take a failed step's changes back."""
        self._journal = {}
        return self._journal, self.stats.snapshot()

    def restore_marks(self, marks: tuple[dict[int, _SeqState | None], dict[str, Any]]) -> None:
        """After a failed step: its ``lookahead`` and ``verify`` calls leave no trace, so the
        retry drafts as many tokens as the failed step did (a seeded sampled request draws one
        number a draft, and a shorter draft after the failure sent it on another course), and
        its drafts are counted once."""
        journal, counts = marks
        for sid, state in journal.items():
            if state is None:
                self._state.pop(sid, None)
            else:
                self._state[sid] = state
        journal.clear()
        self.stats.restore(counts)

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence: its acceptance state, lookup index, draft KV and q (held
        past its step when the step failed: verify() never ran, and its aborted requests end here)."""
        self._state.pop(seq_id, None)
        self._ngram.pop(seq_id, None)
        self._draft_probs.pop(seq_id, None)
        if self.draft is not None:
            self.draft.release(seq_id)
