"""The fields both requests share (:class:`SamplingRequest`: model, sampling, stop strings, streaming)
and the bounds on them, each value past one a 400 naming its field. Why each bound is where it is:
the comments below; what the requests accept as a whole: ``requests.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from .._types import MAX_MODEL_CHARS  # the bound on model names (see there)
from .errors import WireError
from .fields import _INTEGRAL, INT32_MAX, TokenCount, TokenId, Unit, _Strict, only

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
FLOAT32_TINY = 1.1754943508222875e-38  # smallest normal float32
# OpenAI takes 4 stop strings, vLLM any number; IDE plugins send more (Continue's autocomplete 9 and
# up, SillyTavern a user's own list), which were 400s here. Each is searched for in the new text every
# step (cloud_server.engine.detokenizer): 32 short ones cost microseconds; the worst case, a stop
# string longer than the answer (all text searched each step), measured ~7 ms a step at 200k
# characters against ~2 ms with 4. hybridllm's own requests (the device proxy) keep OpenAI's 4.
MAX_STOP = 32
# The engine tests every new token against the whole list: a 4 MiB body of ids ([0,0,...], two
# million of them) cost some 30 ms per token in its step, so one request slowed its whole batch.
# vLLM sets no bound; this one is far beyond any tokenizer's list of end tokens.
MAX_STOP_TOKEN_IDS = 1024
# The longest stop string. Real ones are markers and short (a turn header such as Llama 3's
# "<|start_header_id|>user<|end_header_id|>" is 40 characters, an IDE plugin's line of code a few
# hundred at most); a streamed answer holds back its last len(stop)-1 characters (they may begin a
# stop string) and the engine searches that much text per string each step, so one megabyte-long
# string froze the stream and slowed its batch. OpenAI documents no bound; this is 5x the longest.
MAX_STOP_CHARS = 1024


StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]  # the JSON schema states the bound
Penalty = Annotated[Unit, Field(ge=-2.0, le=2.0)]  # OpenAI's presence/frequency bounds; 0 is off


class StreamOptions(_Strict):
    include_usage: bool = False
    # vLLM: usage in every chunk; not sent by these servers, so accepted only as false
    continuous_usage_stats: bool = Field(default=False, json_schema_extra={"enum": [False]})

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous_usage(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "continuous_usage_stats is not supported by this server; usage comes in "
                "the last chunk (include_usage)"
            )
        return value


# stream_options only with "stream": true
_STREAM_RULE: JsonDict = {
    "if": {"not": {"required": ["stream"], "properties": {"stream": {"const": True}}}},
    "then": {"properties": {"stream_options": {"type": "null"}}},
}


class SamplingRequest(_Strict):
    """Fields shared by chat and legacy completions. ``None`` means "the server's default"."""

    model_config = ConfigDict(json_schema_extra=_STREAM_RULE)

    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]
    max_tokens: TokenCount | None = None
    temperature: Annotated[Unit, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[Unit, Field(ge=FLOAT32_TINY, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX), _INTEGRAL] | None = None  # vLLM; -1 and 0 turn it off
    min_p: Annotated[Unit, Field(ge=0.0, le=1.0)] | None = None  # vLLM
    repetition_penalty: Annotated[Unit, Field(gt=0.0, le=10.0)] | None = None  # vLLM; 1 is off
    n: Annotated[int, Field(ge=1, le=128, json_schema_extra={"maximum": 1}), _INTEGRAL] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None  # vLLM
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX), _INTEGRAL] | None = None
    ignore_eos: bool = False  # vLLM, for benchmarks
    # hybridllm cloud server: this request's speculative decoding ("none" turns it off)
    speculative_method: Literal["ngram", "draft", "none"] | None = None
    num_speculative_tokens: Annotated[int, Field(ge=0, le=16), _INTEGRAL] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # biases of 0 change nothing: accepted, as a penalty of 0 is (some clients send zeros)
    logit_bias: dict[str, Annotated[Unit, Field(ge=-100.0, le=100.0)]] | None = only(
        additionalProperties={"type": "number", "minimum": 0, "maximum": 0}
    )
    user: str | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model_named(cls, value: Any) -> Any:
        # OpenAI's 400 for "model": "" (not a 404 quoting an empty name); spaces name no model either
        if isinstance(value, str) and not value.strip():
            raise WireError(
                "you must provide a model parameter (GET /v1/models lists this server's).", param="model"
            )
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _short_stops(cls, value: Any) -> Any:
        # before the type's own bound, so the 400 names "stop" and says which string and its length
        texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for i, text in enumerate(texts):
            if isinstance(text, str) and len(text) > MAX_STOP_CHARS:
                where = "stop" if isinstance(value, str) else f"stop[{i}]"
                raise WireError(
                    f"Invalid 'stop': {where} is {len(text)} characters long; a stop string "
                    f"may be at most {MAX_STOP_CHARS}.",
                    param="stop",
                )
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value and any(value.values()):
            # its keys are token ids: the device model and the cloud number tokens differently
            raise ValueError(
                "logit_bias is not supported by this server (its route, device or cloud, "
                "is chosen per request, and their models' token ids differ)"
            )
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise WireError("stream_options is only allowed when stream is true.", param="stream_options")
        return self

    def stop_list(self) -> list[str]:
        """The stop strings; an empty one stops nothing, so it is dropped."""
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage
