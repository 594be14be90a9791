"""Request models of the OpenAI wire format, as this server accepts them.

Requests are validated with pydantic; unknown top-level fields are rejected (OpenAI answers 400
"Unrecognized request argument"). Parameters OpenAI knows but this server does not implement are
accepted only at their neutral value (``n=1``, no logprobs, no tools, zero penalties), so a client
never silently gets something other than what it asked for. Responses are built as plain dicts in
``serving.py``: they are written once per token and need no validation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cloud_server.exceptions import InvalidRequestError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Messages carry fields such as `name` or `tool_calls` that clients echo back; ignore them.
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _SamplingRequest(_Strict):
    """Fields shared by chat and legacy completions."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)  # vLLM extension; -1 disables it
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extension
    seed: int | None = None
    ignore_eos: bool = False  # vLLM extension, used by benchmarks
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return value

    @model_validator(mode="after")
    def _check_supported(self) -> _SamplingRequest:
        if self.n != 1:
            raise InvalidRequestError("Only n=1 is supported.", param="n")
        if self.presence_penalty or self.frequency_penalty:
            param = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            raise InvalidRequestError(f"{param} is not supported by this server.", param=param)
        if self.logit_bias:
            raise InvalidRequestError("logit_bias is not supported by this server.", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError(
                "stream_options is only allowed when stream is true.", param="stream_options"
            )
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None

    @model_validator(mode="after")
    def _check_chat_supported(self) -> ChatCompletionRequest:
        if self.logprobs or self.top_logprobs:
            raise InvalidRequestError("logprobs are not supported by this server.", param="logprobs")
        if self.tools:
            raise InvalidRequestError("tools are not supported by this server.", param="tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise InvalidRequestError(
                "Only response_format type 'text' is supported.", param="response_format"
            )
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self) -> list[dict[str, str]]:
        # "developer" is OpenAI's new name for "system"; chat templates only know the latter.
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # the legacy endpoint's own default
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_completion_supported(self) -> CompletionRequest:
        if self.echo:
            raise InvalidRequestError("echo is not supported by this server.", param="echo")
        if self.logprobs:
            raise InvalidRequestError("logprobs are not supported by this server.", param="logprobs")
        if self.best_of not in (None, 1):
            raise InvalidRequestError("Only best_of=1 is supported.", param="best_of")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported by this server.", param="suffix")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str | list):
            if len(self.prompt) != 1:
                raise InvalidRequestError(
                    "Batched prompts are not supported; send one prompt per request.",
                    param="prompt",
                )
        return self

    def output_limit(self) -> int | None:
        return self.max_tokens

    def single_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # type: ignore[assignment]
        if isinstance(prompt, list) and not prompt:
            raise InvalidRequestError("prompt must not be empty.", param="prompt")
        return prompt  # type: ignore[return-value]
