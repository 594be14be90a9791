"""A step's sampled tokens into each request's RequestOutput: stop checks, text, logprobs, its end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .detokenizer import IncrementalDetokenizer
from .logprobs import TextOffsets, TokenLogprob, release, token_logprobs
from .outputs import RequestOutput
from .scheduler import Scheduler
from .sequence import Sequence
from .structured import advance


@dataclass
class _Request:
    seq: Sequence
    detok: IncrementalDetokenizer
    num_sent_tokens: int = 0
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # text not sent yet
    offsets: TextOffsets | None = None  # the logprobs' text offsets, once asked for
    on_scheduled: Callable[[], None] | None = None  # called once, when a step first runs it


class OutputProcessorMixin:
    """``LLMEngine``'s per-request output: what a step's tokens send, and the end of a request."""

    tokenizer: Any
    max_model_len: int
    scheduler: Scheduler
    runner: Any
    spec: Any
    _requests: dict[str, _Request]
    _token_index: Any = None  # the TokenIndex, once a response_format request came (LLMEngine)

    @property
    def _decode_answer(self) -> Any:
        """The decode of an answer's ids as they read after its prompt: a SentencePiece decoder
        keeps the first token's space there (``HFTokenizer.decode_continuation``); a GGUF
        vocabulary's ``decode`` keeps it already."""
        return getattr(self.tokenizer, "decode_continuation", self.tokenizer.decode)

    def _release(self, seq_id: int) -> None:
        self.runner.release(seq_id)
        self.spec.release(seq_id)

    def _fail(self, req: _Request, error: BaseException) -> RequestOutput:
        """End a request with ``error``, wherever its step's processing stopped (it may have
        left ``_requests`` and the scheduler already: its blocks are freed once)."""
        self._requests.pop(req.seq.request_id, None)
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
        matcher = seq.matcher
        for j, token in enumerate(tokens):
            end = first + j + 1  # sequence length up to and including this token
            eos = token in self.tokenizer.eos_token_ids
            if matcher is not None and not eos:
                advance(self._token_index, matcher, token)
            if (eos and (not p.ignore_eos or matcher is not None)) or (token in p.stop_token_ids):
                # a grammar allows an EOS only once its value is complete: ignore_eos has no tokens
                # to add then, and the request ends
                reason, stop_token = "stop", True
            elif matcher is not None and matcher.finished:
                reason = "stop"  # the value is complete and nothing may follow it, EOS included
            elif end - seq.num_prompt_tokens >= p.max_tokens or end >= self.max_model_len:
                reason = "length"
            if reason is not None or each or j == len(tokens) - 1:
                text_end = end - 1 if stop_token else end  # a stop token's text is not sent
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
        if req.offsets is None:
            req.offsets = TextOffsets(self._decode_answer)
        for j, entry in enumerate(entries):
            entry.text_offset = req.offsets.offset(out_ids, first - seq.num_prompt_tokens + j)
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
