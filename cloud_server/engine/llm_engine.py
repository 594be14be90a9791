"""The synchronous engine: requests in, one batched step at a time, outputs out.

``add_request`` -> ``step`` (schedule, run the model, append sampled tokens, detokenize, finish)
-> ``abort``. ``AsyncLLMEngine`` drives the same object from a background loop; ``generate``
runs a list of prompts to completion for offline use, tests and benchmarks.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hybridllm._cpus import usable_cpus

from ..config import EngineConfig
from ..cpu_features import CAPPED_ISA, ISA_VARIABLE, bf16_rows_invariant, onednn_cap_state
from ..exceptions import ConfigError, ContextLengthError, EngineError, InvalidRequestError
from .block_manager import BlockManager
from .detokenizer import IncrementalDetokenizer
from .engine_stats import EngineStatsMixin
from .output_processor import OutputProcessorMixin, _Request
from .outputs import GenerationResult, RequestOutput
from .pool_plan import _max_len_cap, _resolve_device, known_kv_bytes, kv_budget, plan_pool
from .sampling_params import SamplingParams
from .scheduler import ScheduledSeq, Scheduler
from .sequence import Sequence
from .spec_setup import SpecSetupMixin

logger = logging.getLogger(__name__)

# held while an engine builds its response_format TokenIndex, so threads that need it at once build
# it once (rare, at most once per engine: one lock for all of a process's engines is enough)
_INDEX_LOCK = threading.Lock()


def _gives_token_bytes(tokenizer: Any) -> bool:
    """Whether a tokenizer gives each token's bytes, which the structured masks are built from."""
    return hasattr(tokenizer, "structured_token_bytes")


class LLMEngine(SpecSetupMixin, OutputProcessorMixin, EngineStatsMixin):
    def __init__(self, config: EngineConfig) -> None:
        import torch

        from ..models.loader import load_model
        from .model_runner import ModelRunner

        self.config = config
        device, dtype, quantization = _resolve_device(config)
        if device.type == "cpu":
            torch.set_num_threads(config.num_threads or usable_cpus())  # a container's cpuset, not the host
            if dtype == torch.bfloat16 and onednn_cap_state() == "late" and not bf16_rows_invariant():
                logger.warning(
                    "torch ran a bf16 matmul before cloud_server was imported, so oneDNN keeps its AMX "
                    "kernels on this CPU: a batched request may differ from the same request alone in "
                    "the last bit of a bf16 (a greedy near-tie can then pick another token); import "
                    "cloud_server first, or start the process with %s=%s",
                    ISA_VARIABLE, CAPPED_ISA,
                )
        cap = _max_len_cap(device.type)

        def plan(model_config: Any, budget: int | None) -> tuple[int, int]:
            """(max_model_len, KV blocks) for ``budget`` bytes of pool; ConfigError if it cannot fit."""
            native = model_config.max_position_embeddings
            if config.max_model_len is not None and config.max_model_len > native:
                raise ConfigError(f"max_model_len {config.max_model_len} exceeds the model's {native}")
            max_len, num_blocks = plan_pool(config, model_config, device.type, dtype, budget)
            if budget is not None and num_blocks * config.block_size < max_len:
                raise ConfigError(
                    f"kv_cache_memory_bytes={budget} holds {num_blocks * config.block_size} tokens, "
                    f"less than one max_model_len={max_len} sequence: raise the KV pool "
                    f"(--kv-cache-memory-mb) or lower --max-model-len"
                )
            return max_len, num_blocks

        # checked before the weights load where the pool is known then (not a GPU's default,
        # half the memory the weights leave free)
        known = known_kv_bytes(config, device.type)

        def before_weights(model_config: Any) -> None:
            plan(model_config, known)

        loaded = load_model(
            config.model,
            device=device,
            dtype=dtype,
            max_position=config.max_model_len or cap,
            quantization=quantization,
            check=before_weights,
        )
        self.model_name = loaded.name
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        budget = kv_budget(config, device)  # ConfigError: a given size the GPU cannot hold
        self.max_model_len, num_blocks = plan(loaded.config, budget)
        self.block_manager = BlockManager(
            num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_waiting=config.max_waiting,
        )
        self.runner = ModelRunner(
            loaded.model,
            loaded.config,
            num_blocks=num_blocks,
            block_size=config.block_size,
            device=device,
            dtype=dtype,
            seed=config.seed,
            **self._graph_args(config),
        )
        self.device, self.dtype, self.quantization = device, dtype, quantization
        self.spec = self._make_spec_decoder(num_blocks)
        self._spec_logged = (time.monotonic(), 0)
        self._requests: dict[str, _Request] = {}
        self._steps = 0
        self._last_batch_num_seqs = 0
        self._last_batch_num_tokens = 0
        self._max_batch_num_seqs = 0
        self._peak_slots = 0
        self._unused_slots_at_peak = 0

    # -- requests ----------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special=True)
        if not isinstance(prompt, list | tuple):  # a bare int, None: not list(prompt)'s TypeError
            raise InvalidRequestError("a prompt is a string or a list of token ids", param="prompt")
        ids = list(prompt)
        # True is no token id (it ran as id 1), as SamplingParams refuses it for a number
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.model_config.vocab_size
               for t in ids):
            raise InvalidRequestError("prompt token ids out of the vocabulary", param="prompt")
        return ids

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):  # a dict: not an AttributeError below
            raise InvalidRequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.speculative_method == "draft" and self.spec.draft is None:
            raise InvalidRequestError(
                "speculative_method 'draft' needs a server started with --draft-model",
                param="speculative_method",
            )
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if not _gives_token_bytes(self.tokenizer) and params.response_format is not None \
                and params.response_format.kind != "tool_calls":  # (an auto hold is dropped: _served)
            raise InvalidRequestError("response_format needs a tokenizer that gives each token's bytes; "
                                      "this model's does not", param="response_format")
        total = len(prompt_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ContextLengthError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) "
                                     f"= {total} exceeds the context window of {self.max_model_len} tokens",
                                     param="max_tokens")

    def _served(self, params: SamplingParams) -> SamplingParams:
        """Without token bytes, auto tool calls run unheld (read as written): a copy, as the
        caller's params may be shared by several prompts."""
        if params.response_format is None or _gives_token_bytes(self.tokenizer):
            return params
        return dataclasses.replace(params, response_format=None)

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
        on_scheduled: Callable[[], None] | None = None,
    ) -> Sequence:
        """``on_scheduled``: called (in the engine's thread) when a step first schedules the
        request, e.g. so that its energy share starts then, not while it waits in the queue."""
        params = params or SamplingParams()
        if request_id in self._requests:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        prompt_ids = self.encode_prompt(prompt)
        self.check_request(prompt_ids, params)
        params = self._served(params)
        if params.response_format is not None:
            self._structured_index()
        seq = Sequence(request_id, prompt_ids, params)
        self.scheduler.add(seq)  # QueueFullError when the waiting queue is full
        self._requests[request_id] = _Request(seq, IncrementalDetokenizer(self._decode_answer, params.stop),
                                              on_scheduled=on_scheduled)
        return seq

    _built_index: Any = None  # the TokenIndex once built (prepare_structured)

    def prepare_structured(self, grammar: Any = None) -> Any:
        """The model's TokenIndex, built at the first call (a pass over the vocabulary: about a
        second for 150k tokens, once), not at start-up, and ready for ``grammar``'s patterns
        (a pass each, kept). Safe from any thread: the async front end calls it in a worker thread
        before it hands a response_format request to the engine thread, so the running batch
        keeps stepping meanwhile."""
        index = self._build_index()
        if grammar is not None:
            index.prepare(grammar)
        return index

    def _build_index(self) -> Any:
        with _INDEX_LOCK:
            if self._built_index is None:
                from .structured import build_index

                started = time.perf_counter()
                self._built_index = build_index(self.tokenizer, self.model_config.vocab_size,
                                                list(self.tokenizer.eos_token_ids))
                logger.info("response_format token index built in %.2f s", time.perf_counter() - started)
            return self._built_index

    def _structured_index(self) -> Any:
        """The TokenIndex, installed in the runner and the speculator (engine thread only)."""
        if self._token_index is None:
            self._token_index = self._build_index()
            self.runner.token_index = self.spec.token_index = self._token_index
        return self._token_index

    def abort(self, request_id: str) -> RequestOutput | None:
        """Drop a request; its KV blocks go back to the pool at once."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req.seq, "abort")
        self._release(req.seq.seq_id)
        return self._output(req, "", [], "abort")

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # -- stepping ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, let the scheduler apply the results, then detokenize.

        A failure of the whole forward pass is an ``EngineError`` for the step; a failure that
        belongs to one request (its sampling settings) ends that request alone, with an error.
        """
        spec = self.spec
        marks = spec.adaptive_marks()
        sched = self.scheduler.schedule(spec.lookahead)
        if sched.is_empty:
            return []
        self._tell_scheduled(sched.admitted)
        draws = self._seeded_draws(sched.scheduled)
        try:
            if any(item.num_spec_slots for item in sched.scheduled):
                drafts = spec.propose(sched.scheduled, self.block_manager)
                self.scheduler.add_drafts(sched.scheduled, drafts)
            result = self.runner.execute(sched.scheduled, return_probs=spec.needs_probs(sched.scheduled))
            spec.prefill(sched.scheduled, self.block_manager, len(self.scheduler.running),
                         self.scheduler.max_num_batched_tokens)
            new_tokens, num_rejected = spec.verify(
                sched.scheduled,
                result.tokens,
                result.probs,
                lambda seq: self.runner.sampler.generator(seq.seq_id, seq.params, self.device),
            )
            appended = self.scheduler.update(sched.scheduled, new_tokens, num_rejected)
            if spec.draft is not None:  # one place records the draft's full blocks
                for item in sched.scheduled:
                    self.block_manager.mark_draft_ready(item.seq)
        except Exception as exc:  # a model failure is an engine failure, not a request error
            # verification, the update and its block records too: the step is taken back whole
            # (sequences, blocks, draws, speculation state and counters), so a retry gives what
            # no failure gives
            self.scheduler.rollback(sched.scheduled)
            for gen, state in draws:  # the retry draws what this step drew: same seed, same answer
                gen.set_state(state)
            spec.restore_marks(marks)  # and drafts as many tokens as this step did
            # the batch that failed: requests still waiting were not in it, and the engine keeps
            # every request (a later step retries), so a caller may fail these alone
            raise EngineError(f"model step failed: {exc}",
                              request_ids=[item.seq.request_id for item in sched.scheduled]) from exc
        self._record_batch(len(sched.scheduled), sched.num_tokens)
        rows = result.logprobs or {}
        outputs = []
        for seq, tokens in appended:
            req = self._requests[seq.request_id]
            try:
                outputs.append(self._process_tokens(req, tokens, rows.get(seq.seq_id)))
            except Exception as exc:  # noqa: BLE001 - this request's text, stops or logprobs
                # the step stands (the others' outputs go out); this request ends with the error,
                # its blocks freed: retried, the same tokens would fail the same way
                logger.error("request %s failed after its step", seq.request_id, exc_info=exc)
                outputs.append(self._fail(req, exc))
        for item in sched.scheduled:
            error = result.tokens.get(item.seq.seq_id)
            if isinstance(error, BaseException) and item.seq.request_id in self._requests:
                outputs.append(self._fail(self._requests[item.seq.request_id], error))
        self._record_kv()
        self._log_spec()
        return outputs

    def _tell_scheduled(self, admitted: list[Sequence]) -> None:
        """Call the ``on_scheduled`` of the requests this step starts for the first time."""
        for seq in admitted:
            req = self._requests.get(seq.request_id)
            if req is None or req.on_scheduled is None:
                continue
            fn, req.on_scheduled = req.on_scheduled, None
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a caller's hook must not fail the step
                logger.warning("on_scheduled of request %s failed", seq.request_id, exc_info=exc)

    def _seeded_draws(self, scheduled: list[ScheduledSeq]) -> list[tuple[Any, Any]]:
        """(generator, state) of each seeded sampled request's own generators, the target's and
        the draft model's, before the step draws from them.

        A step that fails after drawing (the draft's prefill after the target sampled, the
        target's pass after the draft proposed) is retried by a later step; restored, the retry
        draws the same numbers, and the request gives the answer it gives without the failure."""
        draft = self.spec.draft
        draws = []
        for item in scheduled:
            seq = item.seq
            if seq.params.seed is None or seq.params.is_greedy:
                continue  # greedy rows draw nothing; unseeded ones share a generator, no promise
            # only the generators the step draws from (a state is a 5 KB copy): the target's
            # where it samples, the draft model's where it proposes
            samplers = [self.runner.sampler] if item.samples else []
            if draft is not None and item.num_spec_slots and self.spec.method_for(seq)[0] == "draft":
                samplers.append(draft.runner.sampler)
            for sampler in samplers:
                gen = sampler.generator(seq.seq_id, seq.params, self.device)
                draws.append((gen, gen.get_state()))
        return draws

    def score(self, token_ids: list[int]) -> Any:
        """Logits at every position of ``token_ids`` (teacher forcing): ``[n, vocab]`` fp32.

        Runs one prefill outside the scheduler, so call it only between steps.
        """
        # ids past the vocabulary would index past the embedding (on CUDA, an assert that
        # takes the whole context down): refused as add_request refuses them
        token_ids = self.encode_prompt(list(token_ids))
        seq = Sequence(f"score-{time.monotonic_ns()}", token_ids, SamplingParams(max_tokens=1))
        if not token_ids or len(token_ids) > self.max_model_len:
            raise ContextLengthError("score needs 1..max_model_len tokens", param="prompt")
        if not self.block_manager.can_append(seq, len(token_ids)):
            raise EngineError("not enough free KV blocks to score this sequence")
        self.block_manager.append_slots(seq, len(token_ids))
        try:
            return self.runner.prompt_logits(ScheduledSeq(seq, len(token_ids)))
        finally:
            self.block_manager.free(seq)

    # -- offline -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """Run ``prompts`` to completion. When it raises (a prompt refused by ``add_request``, a
        failed step, an interrupt), none of its requests stays behind in the engine: those
        already added are aborted, so their KV blocks go back to the pool and later calls do not
        compute them. One string is one prompt (it was run as a prompt per character). Every
        prompt is checked before any runs; they enter the engine as its waiting queue has room
        (``max_waiting`` bounds a server's queue, not an offline batch: more prompts than it
        raised QueueFullError, and the requests already added were aborted)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        ids = [f"gen-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        results = {rid: GenerationResult(rid, "") for rid in ids}
        todo: deque[tuple[str, list[int], SamplingParams]] = deque()
        for rid, prompt, p in zip(ids, prompts, plist, strict=True):
            p = p or SamplingParams()
            prompt_ids = self.encode_prompt(prompt)
            self.check_request(prompt_ids, p)
            todo.append((rid, prompt_ids, p))
        sch = self.scheduler
        try:
            while todo or any(rid in self._requests for rid in ids):
                while todo and sch.num_queued_beyond_slots < sch.max_waiting:  # as Scheduler.add
                    rid, prompt_ids, p = todo.popleft()
                    seq = self.add_request(rid, prompt_ids, p)
                    results[rid].num_prompt_tokens = seq.num_prompt_tokens
                for out in self.step():
                    if out.request_id in results:
                        r = results[out.request_id]
                        r.text += out.delta_text
                        r.token_ids += out.delta_token_ids
                        r.finish_reason = out.finish_reason
                        r.num_cached_tokens = out.num_cached_tokens
                        r.error = out.error or r.error  # why it failed, when finish_reason is "error"
                        if out.logprobs is not None:
                            r.logprobs = (r.logprobs or []) + out.logprobs
        except BaseException:
            for rid in ids:
                self.abort(rid)  # None for the ones never added or already finished
            raise
        return [results[rid] for rid in ids]
