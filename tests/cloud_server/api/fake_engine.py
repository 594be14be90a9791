"""A fake of ``AsyncLLMEngine``'s interface for fast API tests: one character is one token.

It keeps real books (a block pool, running and waiting counts, a bounded queue) so the tests can
check that aborts and disconnects give every block back, and it batches like the real engine in
spirit: every running request advances one token per step.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import ContextLengthError, QueueFullError

REPLY = "Hello from the fake engine. "


class CharTokenizer:
    eos_token_ids = [0]
    vocab_size = 0x110000  # one id a Unicode code point

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        # the engine tokenizers' signature (no BOS here either way)
        return [ord(ch) for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        turns = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return turns + "<assistant>"

    def encode_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        # the engine tokenizers' signature (cloud_server.models.tokenizer); the fake's template
        # shows no tools and always ends with the assistant's turn
        return self.encode(self.apply_chat_template(messages))

    def stop_strings(self, messages: list[dict[str, str]]) -> tuple[str, ...]:
        return ("\n<user>",)  # as a base-model transcript's format would


@dataclass
class FakeOutput:
    request_id: str
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0


class FakeEngine:
    def __init__(
        self,
        *,
        max_num_seqs: int = 4,
        max_waiting: int = 8,
        max_model_len: int = 512,
        num_blocks: int = 1024,
        step_s: float = 0.002,
        reply: str = REPLY,
    ) -> None:
        self.model_name = "fake-model"
        self.max_model_len = max_model_len
        self.tokenizer = CharTokenizer()
        self._ready = False
        self._stopped = False
        self._dead: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.block_size = 16
        self.num_total_blocks = num_blocks
        self.num_free_blocks = num_blocks
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.step_s = step_s
        self.reply = reply
        self.num_running = 0
        self.num_waiting = 0
        self.max_batch = 0
        self.aborted: set[str] = set()
        self.live: set[str] = set()
        # each live request's on_scheduled (generate's), called once it has a batch slot; kept
        # apart from _run's arguments, which subclasses override with the three of them
        self.on_scheduled: dict[str, Callable[[], None]] = {}
        # a prefix cache in miniature: whole prompts seen before count as hits
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self._seen_prompts: set[tuple[int, ...]] = set()
        self._slots: asyncio.Semaphore | None = None

    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self.max_num_seqs)
        self._loop, self._dead, self._stopped = asyncio.get_running_loop(), asyncio.Event(), False
        self._ready = True

    async def stop(self) -> None:
        self._stopped = True
        self._ready = False

    @property
    def is_ready(self) -> bool:
        return self._ready

    @is_ready.setter
    def is_ready(self, ready: bool) -> None:
        """A test setting it False stands for the engine's loop ending by itself: as the real engine
        does, ``wait_dead`` returns then (the test may set it from another thread)."""
        self._ready = ready
        if not ready and not self._stopped and self._loop is not None and self._dead is not None:
            self._loop.call_soon_threadsafe(self._dead.set)

    async def wait_dead(self) -> BaseException | None:
        if self._dead is None:
            raise RuntimeError("start the fake engine first")
        await self._dead.wait()
        return None

    async def abort(self, request_id: str) -> None:
        if request_id in self.live:
            self.aborted.add(request_id)

    def stats(self) -> dict[str, float]:
        used = self.num_total_blocks - self.num_free_blocks
        return {
            "num_running": self.num_running,
            "num_waiting": self.num_waiting,
            "num_total_blocks": self.num_total_blocks,
            "num_free_blocks": self.num_free_blocks,
            "kv_cache_usage": used / self.num_total_blocks,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "num_preemptions": 0,
            "steps": 0,
            "last_batch_num_seqs": self.num_running,
            "max_batch_num_seqs": self.max_batch,
        }

    def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams,
        on_scheduled: Callable[[], None] | None = None,
    ) -> AsyncIterator[FakeOutput]:
        """Validate at the call, as the real engine does (ContextLengthError, QueueFullError),
        then return the stream of outputs; ``on_scheduled`` once it has a batch slot."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ContextLengthError("too long", param="max_tokens")
        # like the real engine: only requests waiting beyond the free batch slots count
        free_slots = max(0, self.max_num_seqs - self.num_running)
        if self.num_waiting - free_slots >= self.max_waiting:
            raise QueueFullError("queue full", retry_after_s=2.0)
        self.prefix_cache_queries += len(ids)  # counted in prompt tokens, as the real engine does
        self.prefix_cache_hits += len(ids) if tuple(ids) in self._seen_prompts else 0
        self._seen_prompts.add(tuple(ids))
        self.live.add(request_id)
        self.num_waiting += 1  # counted at once, so a burst of calls sees the others
        if on_scheduled is not None:
            self.on_scheduled[request_id] = on_scheduled
        return self._run(request_id, ids, params)

    async def _run(
        self, request_id: str, ids: list[int], params: SamplingParams
    ) -> AsyncIterator[FakeOutput]:
        assert self._slots is not None
        blocks = 0
        try:
            try:
                await self._slots.acquire()
            finally:
                self.num_waiting -= 1
            try:
                blocks = math.ceil((len(ids) + params.max_tokens) / self.block_size)
                self.num_free_blocks -= blocks
                self.num_running += 1
                self.max_batch = max(self.max_batch, self.num_running)
                if (on_scheduled := self.on_scheduled.pop(request_id, None)) is not None:
                    on_scheduled()
                reply = self.reply
                for n in range(1, params.max_tokens + 1):
                    await asyncio.sleep(self.step_s)
                    if request_id in self.aborted:
                        return
                    ch = reply[(n - 1) % len(reply)]
                    done_stop = not params.ignore_eos and n == len(reply)
                    finished = done_stop or n == params.max_tokens
                    reason = ("stop" if done_stop else "length") if finished else None
                    yield FakeOutput(request_id, ch, [ord(ch)], finished, reason, len(ids), n)
                    if finished:
                        return
            finally:
                self.num_running -= 1
                self.num_free_blocks += blocks
                self._slots.release()
        finally:
            self.live.discard(request_id)
            self.aborted.discard(request_id)
            self.on_scheduled.pop(request_id, None)  # ended before it had a slot
