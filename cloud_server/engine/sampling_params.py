"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridllm._types import is_integer
from hybridllm._types import is_real as _real

from ..exceptions import InvalidRequestError

MAX_SPECULATIVE_TOKENS = 16  # the most drafts a request may ask for (EngineConfig's bound too)
MAX_LOGPROBS = 20  # the most alternatives per token a request may ask for (OpenAI's bound)
MAX_LOGIT_BIAS = 300  # the most token ids one request may bias (OpenAI's bound)


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    ``temperature == 0`` is greedy. ``top_k`` of 0 or -1 and ``top_p`` of 1 turn those filters
    off. ``seed`` makes one request's sampling reproducible whatever it is batched with; with
    speculative decoding on, how many drafts a step gives it (the adaptive rule reads the batch
    size) moves its draws, so there it repeats for the same batch sizes only.
    ``logprobs``: None for none; N in 0..20 reports each emitted token's log-probability and the
    N most likely tokens at its position (of the raw distribution, before any sampling filter).

    vLLM's and OpenAI's controls (``layers/sampler.py`` states the math and the order):
    ``logit_bias`` {token id: -100..100} added to the logits; ``repetition_penalty`` (> 0, 1 off)
    on every token of the prompt and output; ``presence_penalty`` and ``frequency_penalty``
    (-2..2, 0 off) on the output's tokens; ``min_p`` (0..1, 0 off) drops the tokens less likely
    than min_p times the most likely one.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None
    logprobs: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    response_format: Any = None  # a Grammar (or OpenAI's dict, parsed to one) or None

    def __post_init__(self) -> None:
        # a wrong type is the caller's error too, never a TypeError from a comparison below (None,
        # a string); True is no number here (it passed as 1: max_tokens=True gave one token)
        if self.stop is None:  # OpenAI's null: no stop strings
            self.stop = []
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list | tuple):
            raise InvalidRequestError("stop must be a string or a list of strings", param="stop")
        self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if not isinstance(self.stop_token_ids, list | tuple):
            raise InvalidRequestError("stop_token_ids must be a list of integers", param="stop_token_ids")
        self.stop_token_ids = list(self.stop_token_ids)
        if not _real(self.temperature) or not 0 <= self.temperature < float("inf"):  # and NaN
            raise InvalidRequestError("temperature must be a finite number >= 0", param="temperature")
        if self.seed is not None and (
            not _int(self.seed) or not -(2**63) <= self.seed < 2**64
        ):  # what a 64-bit generator can take
            raise InvalidRequestError("seed must be an integer in [-2**63, 2**64)", param="seed")
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p must be in (0, 1]", param="top_p")
        # plain floats from here: any real passed (a Fraction too), and the sampler's tensors
        # take floats only (a Fraction failed the request at its first token, after it was taken)
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)
        if self.ignore_eos is None:
            self.ignore_eos = False
        # a truth value (numpy's and 0/1 too), not any object: "false" is truthy, and it ran past
        # every EOS to max_tokens (a str is never == True or False)
        if self.ignore_eos not in (True, False):
            raise InvalidRequestError("ignore_eos must be true or false", param="ignore_eos")
        self.ignore_eos = bool(self.ignore_eos)
        if not _int(self.top_k) or self.top_k < -1:
            raise InvalidRequestError("top_k must be -1, 0 (off) or a positive integer", param="top_k")
        if not _int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be a positive integer", param="max_tokens")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings", param="stop")
        if self.speculative_method not in (None, "none", "ngram", "draft"):
            raise InvalidRequestError(
                "speculative_method must be 'ngram', 'draft' or 'none'", param="speculative_method"
            )
        k = self.num_speculative_tokens
        if k is not None and (not _int(k) or not 0 <= k <= MAX_SPECULATIVE_TOKENS):
            raise InvalidRequestError(
                f"num_speculative_tokens must be an integer in [0, {MAX_SPECULATIVE_TOKENS}]",
                param="num_speculative_tokens",
            )
        n = self.logprobs
        if n is not None and (not _int(n) or not 0 <= n <= MAX_LOGPROBS):
            raise InvalidRequestError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}]", param="logprobs")
        if any(not _int(t) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be non-negative integers", param="stop_token_ids")
        # plain ints from here (numpy's int64 passes as an integer): the sampler's seed arithmetic
        # (mod 2**64) raises OverflowError on a numpy int, at the request's first draw
        for name in ("top_k", "max_tokens", "seed", "num_speculative_tokens", "logprobs"):
            if getattr(self, name) is not None:
                setattr(self, name, int(getattr(self, name)))
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        self._check_controls()
        self._check_response_format()

    def _check_response_format(self) -> None:
        """OpenAI's dict (or a Grammar, or a Grammar's own dict: a vLLM regex or choice, as one
        reaches a replica) -> a Grammar, or None for {"type": "text"}; a format the grammar core
        refuses is an error naming its field."""
        value = self.response_format
        if value is None:
            return
        from hybridllm._structured import Grammar, ResponseFormatError, ToolCallsGrammar, parse_grammar

        if isinstance(value, (Grammar, ToolCallsGrammar)):
            return
        if not isinstance(value, dict):
            raise InvalidRequestError("response_format must be an object such as {\"type\": \"json_object\"}",
                                      param="response_format")
        try:
            self.response_format = parse_grammar(value)
        except ResponseFormatError as exc:
            raise InvalidRequestError(str(exc), param=exc.param or "response_format") from None

    def _check_controls(self) -> None:
        """min_p, the penalties and logit_bias: checked, then plain floats and ints (the sampler's
        tensors take those only)."""
        if not _real(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidRequestError("min_p must be a number in [0, 1]", param="min_p")
        r = self.repetition_penalty
        if not _real(r) or not 0 < r < float("inf"):
            raise InvalidRequestError("repetition_penalty must be a finite number > 0",
                                      param="repetition_penalty")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _real(v) or not -2 <= v <= 2:
                raise InvalidRequestError(f"{name} must be a number in [-2, 2]", param=name)
        for name in ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            setattr(self, name, float(getattr(self, name)))
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict):
            raise InvalidRequestError("logit_bias must map token ids to biases", param="logit_bias")
        if len(bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} token ids",
                                      param="logit_bias")
        if any(not _int(t) or t < 0 for t in bias):
            raise InvalidRequestError("logit_bias keys must be token ids (integers >= 0)", param="logit_bias")
        if any(not _real(b) or not -100 <= b <= 100 for b in bias.values()):
            raise InvalidRequestError("logit_bias values must be numbers in [-100, 100]", param="logit_bias")
        # a bias of 0 changes nothing: dropped, so an all-zero map costs the sampler nothing
        self.logit_bias = {int(t): float(b) for t, b in bias.items() if b} or None

    @property
    def has_penalties(self) -> bool:
        """Whether sampling reads the tokens so far (repetition, presence or frequency penalty)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-5


def _int(x: object) -> bool:
    return is_integer(x)  # numpy's int64 too: it was refused as "must be an integer"
