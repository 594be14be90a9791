"""One request's tokens and its place in the KV cache (plain data, no torch)."""

from __future__ import annotations

import enum
import itertools
import time

from .sampling_params import SamplingParams

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A prompt and its generated tokens.

    ``num_computed_tokens`` counts the leading tokens whose keys and values are in the cache;
    ``block_table[i]`` is the physical block holding tokens ``[i*bs, (i+1)*bs)``;
    ``block_hashes[i]`` is the chained hash of full block ``i`` once it is computed.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.num_computed_tokens = 0
        self.num_draft_computed_tokens = 0  # leading tokens in the draft model's KV pool
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first schedule)
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.arrival_time = time.monotonic()
        # a response_format request's grammar state at the end of its output (engine/structured.py)
        grammar = params.response_format
        self.matcher = grammar.matcher() if grammar is not None else None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        """After preemption: the cache entries are gone; prompt and outputs are recomputed."""
        self.block_table = []
        self.block_hashes = []
        self.num_computed_tokens = 0
        self.num_draft_computed_tokens = 0
        self.num_preemptions += 1
        self.status = SequenceStatus.WAITING

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, request={self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)}, "
            f"status={self.status.value})"
        )
