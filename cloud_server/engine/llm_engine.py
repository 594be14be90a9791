"""The synchronous engine: requests in, one batched step at a time, outputs out.

``add_request`` -> ``step`` (schedule, run the model, append sampled tokens, detokenize, finish)
-> ``abort``. ``AsyncLLMEngine`` drives the same object from a background loop; ``generate``
runs a list of prompts to completion for offline use, tests and benchmarks.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hybridllm._cpus import usable_cpus

from ..config import EngineConfig
from ..exceptions import ConfigError, ContextLengthError, EngineError, InvalidRequestError
from .block_manager import BlockManager
from .detokenizer import IncrementalDetokenizer
from .logprobs import TokenLogprob, release, text_offset, token_logprobs
from .outputs import GenerationResult, RequestOutput
from .sampling_params import MAX_SPECULATIVE_TOKENS, SamplingParams
from .scheduler import ScheduledSeq, Scheduler
from .sequence import Sequence

logger = logging.getLogger(__name__)

_CPU_MAX_MODEL_LEN = 4096
_SPEC_LOG_SECONDS = 10.0
_CPU_KV_BYTES = 1 << 30
# Default draft vocabulary: the first 32768 ids. Byte-level BPE numbers tokens in merge order,
# so low ids are the frequent ones; the Qwen2.5-Coder 0.5B's head shrinks from 151,936 rows
# (7.9 ms of a 33 ms draft step on one thread) to 32,768 (1.4 ms); acceptance 0.80 -> 0.75.
_DRAFT_VOCAB = 32768


@dataclass
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer
    num_sent_tokens: int = 0
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # text not sent yet


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        import torch

        from ..models.loader import load_model
        from .model_runner import ModelRunner

        self.config = config
        device, dtype, quantization = _resolve_device(config)
        if device.type == "cpu":
            torch.set_num_threads(config.num_threads or usable_cpus())  # a container's cpuset, not the host
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
        budget = config.kv_cache_memory_bytes or _default_kv_bytes(device)
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

    def _graph_args(self, config: EngineConfig) -> dict[str, Any]:
        """CUDA graph buckets: a step's decode rows (every running sequence plus the draft rows: a
        request may ask for prompt lookup on any server) and its key window (the longest context).
        Graphs are captured on first use, so a bound that is never reached costs nothing."""
        rows = config.max_num_seqs + config.spec_max_rows
        # drafts stay inside max_model_len (SpecDecoder.lookahead); a request's own K is at most
        k = config.num_speculative_tokens or MAX_SPECULATIVE_TOKENS
        return {"cuda_graphs": not config.enforce_eager, "max_decode_rows": rows,
                "max_context": self.max_model_len + k + 1}

    def _make_spec_decoder(self, num_blocks: int) -> Any:
        from ..layers.linear import int8_row_block
        from .model_runner import ModelRunner
        from .spec_decode import SpecDecoder
        from .spec_decode.draft import DraftProposer

        config, draft = self.config, None
        if config.draft_model is not None:
            from ..models.loader import load_model

            loaded = load_model(
                config.draft_model,
                device=self.device,
                dtype=self.dtype,
                max_position=self.max_model_len,
                quantization=self.quantization,
            )
            _check_same_tokenizer(self, loaded)
            limit = config.draft_vocab_size
            if limit is None:
                limit = _DRAFT_VOCAB if loaded.config.vocab_size > _DRAFT_VOCAB else 0
            if 0 < limit < loaded.config.vocab_size:
                logger.info("the draft proposes token ids below %d of %d (--draft-vocab-size)",
                            limit, loaded.config.vocab_size)
            draft = DraftProposer(
                ModelRunner(
                    loaded.model,
                    loaded.config,
                    num_blocks=num_blocks,
                    block_size=config.block_size,
                    device=self.device,
                    dtype=self.dtype,
                    seed=config.seed + 1,
                    vocab_limit=limit or None,
                    **self._graph_args(config),
                )
            )
        return SpecDecoder(
            method=config.speculative_method,
            num_speculative_tokens=config.num_speculative_tokens,
            max_model_len=self.max_model_len,
            draft=draft,
            max_spec_rows=config.spec_max_rows,
            row_block=int8_row_block(self.device, self.dtype, self.quantization),
        )

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
        total = len(prompt_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ContextLengthError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"exceeds the context window of {self.max_model_len} tokens",
                param="max_tokens",
            )

    @property
    def _decode_answer(self) -> Any:
        """The decode of an answer's ids as they read after its prompt: a SentencePiece decoder
        keeps the first token's space there (``HFTokenizer.decode_continuation``); a GGUF
        vocabulary's ``decode`` keeps it already."""
        return getattr(self.tokenizer, "decode_continuation", self.tokenizer.decode)

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None
    ) -> Sequence:
        params = params or SamplingParams()
        if request_id in self._requests:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        prompt_ids = self.encode_prompt(prompt)
        self.check_request(prompt_ids, params)
        seq = Sequence(request_id, prompt_ids, params)
        self.scheduler.add(seq)  # QueueFullError when the waiting queue is full
        self._requests[request_id] = _Request(seq, IncrementalDetokenizer(self._decode_answer, params.stop))
        return seq

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
        sched = self.scheduler.schedule(spec.lookahead)
        if sched.is_empty:
            return []
        try:
            if any(item.num_spec_slots for item in sched.scheduled):
                drafts = spec.propose(sched.scheduled, self.block_manager)
                self.scheduler.add_drafts(sched.scheduled, drafts)
            result = self.runner.execute(sched.scheduled, return_probs=spec.needs_probs(sched.scheduled))
            spec.prefill(sched.scheduled, self.block_manager, len(self.scheduler.running),
                         self.scheduler.max_num_batched_tokens)
        except Exception as exc:  # a model failure is an engine failure, not a request error
            self.scheduler.rollback(sched.scheduled)
            # the batch that failed: requests still waiting were not in it, and the engine keeps
            # every request (a later step retries), so a caller may fail these alone
            raise EngineError(f"model step failed: {exc}",
                              request_ids=[item.seq.request_id for item in sched.scheduled]) from exc
        self._record_batch(len(sched.scheduled), sched.num_tokens)
        new_tokens, num_rejected = spec.verify(
            sched.scheduled,
            result.tokens,
            result.probs,
            lambda seq: self.runner.sampler.generator(seq.seq_id, seq.params, self.device),
        )
        outputs = [
            self._process_tokens(
                self._requests[seq.request_id], tokens, (result.logprobs or {}).get(seq.seq_id)
            )
            for seq, tokens in self.scheduler.update(sched.scheduled, new_tokens, num_rejected)
        ]
        if spec.draft is not None:  # one place records the draft's full blocks (freed: no table)
            for item in sched.scheduled:
                self.block_manager.mark_draft_ready(item.seq)
        for item in sched.scheduled:
            error = result.tokens.get(item.seq.seq_id)
            if isinstance(error, BaseException) and item.seq.request_id in self._requests:
                outputs.append(self._fail(item.seq.request_id, error))
        self._record_kv()
        self._log_spec()
        return outputs

    def _release(self, seq_id: int) -> None:
        self.runner.release(seq_id)
        self.spec.release(seq_id)

    def _log_spec(self) -> None:
        """Every ~10 s with new drafts: the mean acceptance length (1 + accepted per draft)."""
        now, st = time.monotonic(), self.spec.stats
        last_time, last_drafts = self._spec_logged
        if now - last_time < _SPEC_LOG_SECONDS or st.num_drafts == last_drafts:
            return
        self._spec_logged = (now, st.num_drafts)
        rate = st.num_accepted_tokens / max(1, st.num_draft_tokens)
        logger.info(
            "speculative decoding: mean acceptance length %.2f, acceptance rate %.1f%% "
            "(%d drafts, %d draft tokens, %d accepted)",
            st.mean_acceptance_length,
            100 * rate,
            st.num_drafts,
            st.num_draft_tokens,
            st.num_accepted_tokens,
        )

    def _fail(self, request_id: str, error: BaseException) -> RequestOutput:
        req = self._requests.pop(request_id)
        self.scheduler.finish(req.seq, "error")
        self._release(req.seq.seq_id)
        out = self._output(req, "", [], "error")
        out.error = f"{type(error).__name__}: {error}"
        return out

    def _process_tokens(self, req: _Request, tokens: list[int], rows: Any = None) -> RequestOutput:
        """Stop checks token by token over a step's new tokens (one, or several accepted), stop
        strings included: a request ends at the token that completes its stop, wherever that falls
        in an accepted draft run, so speculation returns and counts the same tokens as without.
        ``rows``: the step's raw log-probability rows of this sequence, when it asks for logprobs."""
        seq, p = req.seq, req.seq.params
        reason: str | None = None
        kept, stop_token = len(tokens), False
        delta = ""
        first = seq.num_tokens - len(tokens)  # index of the first new token
        # text token by token only where a stop string ends inside a multi-token run
        each = len(tokens) > 1 and req.detok.finds_stop(seq.output_token_ids)
        for j, token in enumerate(tokens):
            end = first + j + 1  # sequence length up to and including this token
            if (token in self.tokenizer.eos_token_ids and not p.ignore_eos) or (token in p.stop_token_ids):
                reason, stop_token = "stop", True
            elif end - seq.num_prompt_tokens >= p.max_tokens or end >= self.max_model_len:
                reason = "length"
            if reason is not None or each or j == len(tokens) - 1:
                text_end = end - 1 if reason == "stop" else end  # a stop token's text is not sent
                text_ids = seq.token_ids[seq.num_prompt_tokens : text_end]
                delta += req.detok.update(text_ids, final=reason is not None)
                if req.detok.stopped:
                    reason = "stop"
            if reason is not None:
                del seq.token_ids[end:]  # tokens past the stop are not the answer's
                kept = j + 1
                break
        logprobs = None
        if p.logprobs is not None and rows is not None:
            logprobs = self._logprobs(req, tokens[: kept - stop_token], rows, first, reason is not None)
        new_ids = seq.output_token_ids[req.num_sent_tokens :]
        req.num_sent_tokens = seq.num_output_tokens
        if reason is not None:
            self._requests.pop(seq.request_id, None)
            self.scheduler.finish(seq, reason)
            self._release(seq.seq_id)
        out = self._output(req, delta, new_ids, reason)
        out.logprobs = logprobs
        return out

    def _logprobs(
        self, req: _Request, tokens: list[int], rows: Any, first: int, final: bool
    ) -> list[TokenLogprob]:
        """This step's tokens' entries queue behind the earlier ones; those whose text went out
        with this step's delta (all at the end, less any a stop string cut away) are returned."""
        seq = req.seq
        entries = token_logprobs(rows, tokens, seq.params.logprobs or 0)
        out_ids = seq.output_token_ids
        for j, entry in enumerate(entries):
            entry.text_offset = text_offset(self._decode_answer, out_ids, first - seq.num_prompt_tokens + j)
        req.pending_logprobs += entries
        return release(req.pending_logprobs, req.detok.num_sent_chars, final=final, cut=req.detok.stopped)

    @staticmethod
    def _output(req: _Request, delta: str, ids: list[int], reason: str | None) -> RequestOutput:
        seq = req.seq
        return RequestOutput(
            request_id=seq.request_id,
            delta_text=delta,
            delta_token_ids=ids,
            finished=reason is not None,
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens,
        )

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

    # -- stats -------------------------------------------------------------------------------
    def _record_batch(self, num_seqs: int, num_tokens: int) -> None:
        self._steps += 1
        self._last_batch_num_seqs, self._last_batch_num_tokens = num_seqs, num_tokens
        self._max_batch_num_seqs = max(self._max_batch_num_seqs, num_seqs)

    def _record_kv(self) -> None:
        """Track allocated slots and, at their peak, how many hold no computed token."""
        bm = self.block_manager
        allocated = bm.num_used_blocks * bm.block_size
        if allocated >= self._peak_slots:
            self._peak_slots = allocated
            self._unused_slots_at_peak = sum(
                len(s.block_table) * bm.block_size - s.num_computed_tokens for s in self.scheduler.running
            )

    def describe(self) -> str:
        """Where and how the model runs, for the server's start-up log line."""
        dtype = str(self.dtype).removeprefix("torch.")
        parts = [f"{self.device}", dtype, f"quantization {self.quantization}"]
        if self.device.type == "cuda":
            parts.append("CUDA graphs " + ("on" if self.runner.graphs is not None else "off"))
        if self.spec.method:
            parts.append(f"speculative {self.spec.method} k={self.spec.server_k}")
        return ", ".join(parts)

    def stats(self) -> dict[str, Any]:
        bm, sch = self.block_manager, self.scheduler
        return {
            "num_running": len(sch.running),
            "num_waiting": len(sch.waiting),
            "num_total_blocks": bm.num_blocks,
            "num_free_blocks": bm.num_free_blocks,
            "num_cached_blocks": bm.num_cached_blocks,
            "kv_cache_usage": bm.usage,
            "prefix_cache_queries": bm.prefix_cache_queries,
            "prefix_cache_hits": bm.prefix_cache_hits,
            "num_preemptions": sch.num_preemptions,
            "steps": self._steps,
            "last_batch_num_seqs": self._last_batch_num_seqs,
            "last_batch_num_tokens": self._last_batch_num_tokens,
            "max_batch_num_seqs": self._max_batch_num_seqs,
            "kv_peak_allocated_slots": self._peak_slots,
            "kv_unused_slots_at_peak": self._unused_slots_at_peak,
            "spec_decode_num_drafts": self.spec.stats.num_drafts,
            "spec_decode_num_draft_tokens": self.spec.stats.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.spec.stats.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.spec.stats.accepted_per_pos),
        }

    def load_report(self) -> dict[str, Any]:
        """Read-only load for a cluster router: outstanding tokens (tokens still to prefill, a
        preempted request's outputs included, + decode tokens still expected, up to
        ``max_tokens``) and the prefix block hashes held. Called from outside the engine
        thread: copies before it counts."""
        running, waiting = list(self.scheduler.running), list(self.scheduler.waiting)
        seqs = [*running, *waiting]
        # a preempted request recomputes its outputs too, all but the last (the decode row that
        # samples its next token), also once running again in chunks (it counted its prompt alone)
        prefill = sum(max(0, s.num_tokens - s.num_computed_tokens - (s.num_output_tokens > 0))
                      for s in seqs)
        decode = sum(max(0, s.params.max_tokens - s.num_output_tokens) for s in seqs)
        return {
            "outstanding_tokens": prefill + decode,
            "prefill_tokens": prefill,
            "decode_tokens": decode,
            "prefix_hashes": self.block_manager.cached_block_hashes(),
        }

    def reset_stats(self) -> None:
        self._steps = self._max_batch_num_seqs = 0
        self._peak_slots = self._unused_slots_at_peak = 0
        self.scheduler.num_preemptions = 0
        self.block_manager.prefix_cache_queries = self.block_manager.prefix_cache_hits = 0
        from .spec_decode import SpecStats

        self.spec.stats = SpecStats()


def _check_same_tokenizer(engine: LLMEngine, draft: Any) -> None:
    """A draft model must speak the target's token ids: same vocabulary, same pieces."""
    target = engine.tokenizer
    size = engine.model_config.vocab_size
    problem = None
    if draft.config.vocab_size != size:
        problem = f"vocabulary of {draft.config.vocab_size} tokens, the target's has {size}"
    else:
        sample = "def f(x):\n    return x * 2  # Überprüfung, 数字 42!"
        if draft.tokenizer.encode(sample) != target.encode(sample) or set(
            draft.tokenizer.eos_token_ids
        ) != set(target.eos_token_ids):
            problem = "a different tokenizer"
        else:
            ids = list(range(0, size, max(1, size // 2000)))
            try:
                same = [draft.tokenizer.decode([i]) for i in ids] == [target.decode([i]) for i in ids]
            except Exception:  # noqa: BLE001 - ids past one tokenizer's end differ by definition
                same = False
            problem = None if same else "a different tokenizer"
    if problem:
        raise ConfigError(
            f"draft model {engine.config.draft_model!r} has {problem}; speculative decoding "
            f"needs a draft that shares the target's tokenizer"
        )


def _max_len_cap(device_type: str) -> int:
    return _CPU_MAX_MODEL_LEN if device_type == "cpu" else 32768


def plan_pool(config: EngineConfig, model_config: Any, device_type: str, dtype: Any,
              budget: int | None) -> tuple[int, int]:
    """(max_model_len, KV blocks) the engine takes, without checking them: the length given, else
    the model's own capped at 4,096 tokens on a CPU (32,768 on a GPU), and as many whole blocks as
    ``budget`` bytes of pool hold (0 for None). The start-up checks read the same rule."""
    native = model_config.max_position_embeddings
    max_len = config.max_model_len or min(native, _max_len_cap(device_type))
    if budget is None:
        return max_len, 0
    per_block = model_config.kv_bytes_per_token(dtype.itemsize) * config.block_size
    return max_len, budget // per_block


def known_kv_bytes(config: EngineConfig, device_type: str) -> int | None:
    """The KV pool's bytes where known before the weights load: the one given, or the CPU's
    default; None for a GPU's default (half the memory the weights leave free)."""
    return config.kv_cache_memory_bytes or (None if device_type == "cuda" else _CPU_KV_BYTES)


def _resolve_device(config: EngineConfig) -> tuple[Any, Any, str]:
    """(device, activation dtype, quantization): CPU defaults to int4 weights, bf16 activations."""
    import torch

    name = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but CUDA is not available")
    quantization = config.quantization or ("int4" if device.type == "cpu" else "none")
    dtype_name = config.dtype or (
        "float32" if device.type == "cpu" and quantization == "none" else "bfloat16"
    )
    return device, getattr(torch, dtype_name), quantization


def _default_kv_bytes(device: Any) -> int:
    if device.type != "cuda":
        return _CPU_KV_BYTES
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return int(free * 0.5)
