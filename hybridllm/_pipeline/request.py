"""A validated request: its per-call options, its parameters, and the records of its cloud calls."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._exceptions import InvalidRequestError
from .._message_text import check_namespace
from .._tools import calls_tools
from .._types import GenerationParams, Messages, Usage


@dataclasses.dataclass
class Options:
    """Per-call options that are not sampling parameters."""

    route: str | None = None  # force "edge" or "cloud"
    cache: bool = True  # look up and store in the semantic cache (None passed: this default)
    cascade: bool | None = None  # None: as the policy says
    namespace: str | None = None  # cache namespace (tenant or user)
    priority: str | None = None  # "interactive" (the fastest cloud) or "batch" (the cleanest grid)

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> Options:
        opts = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls) if f.name in kwargs})
        if opts.route not in (None, "edge", "cloud"):
            raise InvalidRequestError(f"route must be 'edge', 'cloud' or None, got {opts.route!r}.")
        # None is the default for both (the cache used, the policy's cascade), as for every option;
        # anything else but a bool is refused (1 or "no" passed "cascade in (None, True, False)")
        for name in ("cache", "cascade"):
            value = getattr(opts, name)
            if value is not None and not isinstance(value, bool):
                raise InvalidRequestError(f"cache and cascade must be True or False, or None for the "
                                          f"default; got {name}={value!r}.")
        if opts.cache is None:
            opts.cache = True
        if opts.namespace is not None:  # refused here, not by every cache lookup (logged) after
            check_namespace(opts.namespace, InvalidRequestError)
        from ..carbon import check_priority

        check_priority(opts.priority)
        return opts


@dataclasses.dataclass
class Request:
    """A validated request: built at the call, so bad input raises there."""

    messages: Messages
    params: GenerationParams
    options: Options
    # each cloud call this request made: the ledger, the cost and the stats read them when the
    # request ends, also when the caller stops reading early
    cloud_calls: list[_CloudCall] = dataclasses.field(default_factory=list)
    # the sync client reads on its own thread: an edge answer is generated there (InlineRun)
    inline_edge: bool = False
    # the prompt in the device's tokens, counted once in the plan step (None: the edge cannot
    # tell), and the device's context (n_ctx): the context check, the router and the budget's
    # estimate all read them
    prompt_tokens: int | None = None
    context_length: int | None = None
    # the budget's room held for this request's cloud call until the call starts (then the
    # call's own record holds it); released when the request ends without one
    reservation: Any = None
    # the device answered in the cloud's place (the cloud down or failing, the budget spent, a
    # cascade's escalation that could not happen): its answer is not stored, or a hit would serve
    # it to the same question once the cloud can answer it again
    stand_in: bool = False
    # the device model can be given this request's tools (its template lists them; set at the call)
    edge_tools: bool = False
    # prompt_tokens counts the tools as the device's template lists them (the plan step)
    tools_in_count: bool = False

    @property
    def fits_edge(self) -> bool:
        """The prompt and at least one answer token fit the device's context. ``max_tokens`` does
        not count: a device answer stops with finish_reason "length" where the context ends."""
        n, limit = self.prompt_tokens, self.context_length
        return n is None or limit is None or n + 1 <= limit

    @property
    def calls_tools(self) -> bool:
        """The request needs a model that reads tools: it gives tools and its answer may call them
        (tool_choice not "none"), or its conversation holds calls or their results, which only a
        template with a tool format writes out. With "none" and no such turns the answer is text
        and the prompt holds no tools, so any model can give it."""
        return calls_tools(self.params.tools, self.params.tool_choice, self.messages)

    @property
    def tools_need_cloud(self) -> bool:
        """The answer may call tools and the device model cannot be given them."""
        return self.calls_tools and not self.edge_tools

    @property
    def edge_can_answer(self) -> bool:
        """The device may answer in the cloud's place: the prompt fits it, and it can call the
        request's tools if it gives any."""
        return self.fits_edge and not self.tools_need_cloud


@dataclasses.dataclass
class _CloudCall:
    """One cloud call's accounting, filled in as the call runs and read once the request ends: by
    the ledger (``Core._settle``), the answer's ``cost_usd`` and ``usage`` and the stats
    (``_account``)."""

    prompt: int  # the prompt in the device's tokens (~4 characters a token without a tokenizer)
    reservation: Any = None  # the budget's room held for this call (None: none, a forced route)
    streamed: int = 0  # what streamed, ~4 characters a token, as the cloud sent it (placeholders)
    usage: Usage | None = None  # the cloud's own count, when it arrived
    hung_up: bool = False  # the caller closed the stream or cancelled while the call ran

    def cost(self) -> Usage:
        """What the call cost: the cloud's own count; without one (the stream broke, the caller
        hung up, a server that reports no usage) the prompt plus what streamed, since the cloud
        read the whole prompt before its first token; nothing for a call that failed before
        streaming anything. A call the caller hung up on before its first token costs its
        prompt: the request was sent, and the cloud did the prefill."""
        if self.usage is not None and self.usage.total_tokens:
            return Usage(self.usage.prompt_tokens, self.usage.completion_tokens)
        if self.streamed or self.hung_up:
            return Usage(self.prompt, self.streamed)
        return Usage()
