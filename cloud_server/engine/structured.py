"""Structured output (OpenAI ``response_format``) in the engine: token masks and matcher advance.

A request with a ``response_format`` grammar (``hybridllm._structured``) carries one ``Matcher``
on its ``Sequence``, at the end of its accepted output. Each step the runner masks that row's
logits to the tokens the matcher accepts (``TokenIndex.allowed``); the output processor advances
the matcher over every token the step appends (``advance``); speculative drafts are masked at
their own positions (``row_masks``), so verification keeps the output exact. The ``TokenIndex``
(the bytes each token adds to the text) is built once per engine, at its first structured request,
not at start-up, and by the async front end off the engine thread (the running batch goes on).
Rows without a grammar never reach this module. An auto tools answer's grammar
(``ToolCallsGrammar``) holds only its calls: its rows between them go unmasked.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import EngineError


def token_bytes(tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """What each of the model's ``vocab_size`` ids adds to the output text; None for a control
    token (never allowed unless it ends the output) and for ids past the tokenizer's vocabulary
    (a head padded wider than it). A token that adds no text is a control token here too: allowed
    anywhere it would let a model emit nothing for ever."""
    own = getattr(tokenizer, "structured_token_bytes", None)
    if own is None:
        raise EngineError(f"this model's tokenizer ({type(tokenizer).__name__}) cannot give token bytes "
                          "for response_format")
    out: list[bytes | None] = [b or None for b in own()][:vocab_size]
    return out + [None] * (vocab_size - len(out))


def build_index(tokenizer: Any, vocab_size: int, eos_ids: list[int]) -> Any:
    """The ``TokenIndex`` of the model's head (``vocab_size`` rows)."""
    from hybridllm._structured import TokenIndex

    markers: dict[int, bytes] = getattr(tokenizer, "marker_bytes", dict)()
    return TokenIndex(token_bytes(tokenizer, vocab_size), [i for i in eos_ids if 0 <= i < vocab_size],
                      shown={i: text for i, text in markers.items() if 0 <= i < vocab_size})


def row_masks(order: list[Any], index: Any, device: Any) -> list[Any] | None:
    """Per output row of a step (``order``: its ScheduledSeqs), the bool mask [V] of the tokens
    its grammar allows, or None for a row without one; None when no row has one.

    A sequence's first row is at its matcher's state; with drafts, row j + 1 is at the state after
    drafts 0..j (a copy of the matcher fed them), so each verified position is masked as a plain
    decode would mask it there. Past a draft the grammar refuses (verification rejects it) or one
    that completes the value (the request ends at it) the rows repeat the last mask: what they
    sample is never used."""
    if index is None or not any(s.num_outputs and s.seq.matcher is not None for s in order):
        return None
    import torch

    out: list[Any] = []
    for s in order:
        matcher = s.seq.matcher
        if matcher is None or not s.num_outputs:
            out.extend([None] * s.num_outputs)
            continue
        prev = index.allowed(matcher)  # [V] bool, memoised per state
        rows = [prev]
        state, ok = None, True
        for draft in s.seq.token_ids[s.seq.num_tokens - s.num_lookahead :] if s.num_lookahead else []:
            if ok:
                if state is None:
                    state = matcher.copy()
                ok = bool(prev[draft]) and index.feed_token(state, draft) and not state.finished
                if ok:
                    prev = index.allowed(state)
            rows.append(prev)
        free = getattr(index, "free", None)  # an auto answer's text between its calls: no mask
        masks = {id(r): None if r is free else torch.from_numpy(r).to(device) for r in rows}
        out.extend(masks[id(r)] for r in rows)  # (one tensor per distinct mask)
    return out if any(m is not None for m in out) else None


def grammar_prefix(index: Any, matcher: Any, drafts: list[int]) -> list[int]:
    """Prompt lookup's proposals up to the first one the grammar refuses, or through the one that
    completes the value: those past it could only be rejected or cut, each one a wasted row."""
    state = matcher.copy()
    for j, draft in enumerate(drafts):
        if not index.allowed(state)[draft] or not index.feed_token(state, draft):
            return drafts[:j]
        if state.finished:
            return drafts[: j + 1]
    return drafts


def advance(index: Any, matcher: Any, token: int) -> None:
    """Move ``matcher`` over an appended token; a token the grammar refuses (the mask lets none
    through, so only a fault gets here) ends its request with an error, not with broken JSON."""
    if not index.feed_token(matcher, token):
        raise EngineError(f"token {token} does not fit the request's response_format")
