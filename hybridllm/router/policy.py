"""Routing policies that run before the difficulty score, and the decision they produce.

Order (the first rule that applies decides; each decision carries its reason):

    1. privacy="keep_on_device" and the prompt holds personal data or secrets -> edge
    2. force="edge" | "cloud" (per call)                                      -> that route
    3. prompt longer than the edge model's context                            -> cloud
    4. router score >= threshold -> cloud (threshold 1: never), else edge; a score inside
       ``cascade_band`` -> edge first, escalated to the cloud when the edge answer's confidence is
       low ("edge->cloud")

Every message is scanned (system, assistant and tool turns too), and a value split across two
turns is found. With privacy="redact", cloud-bound messages have each distinct detected value
replaced by a numbered placeholder (``[EMAIL_1]``, ``[EMAIL_2]``), a cloud decision's reason says
so (a cascade's only once it escalates, and not one the device answers after all), and the
decision keeps the map back (``placeholders``, never sent) so that the pipeline can restore the
values in the cloud's answer.
The client's pipeline then applies what only it knows: the cloud budget (a ledger it keeps, see
:mod:`.budget`) and whether the cloud is reachable.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from os import PathLike

import numpy as np

from .._exceptions import ConfigError, InvalidRequestError
from .._types import (
    Decision,
    Message,
    estimate_tokens,
    is_integer,
    is_real,
    last_user_text,
    normalize_messages,
)
from .privacy import pii_kinds_in_messages, pseudonymize_messages, redaction_note
from .router import NEVER_CLOUD, Router, load_router, routable, sends_to_cloud

PRIVACY_MODES = ("keep_on_device", "redact", "off")
ROUTES = ("edge", "cloud")


class RoutingPolicy:
    def __init__(
        self,
        router: Router | None = None,
        *,
        privacy: str = "keep_on_device",
        edge_context_tokens: int = 2048,
        cascade_band: tuple[float, float] | None = None,
    ) -> None:
        if privacy not in PRIVACY_MODES:
            raise ConfigError(
                f"privacy must be one of {', '.join(PRIVACY_MODES)}, got {privacy!r}."
            )
        ctx: object = edge_context_tokens  # object: mypy reads no int as a numbers.Integral
        # is_integer: numpy's int64 (a backend's context_length read from a model's config) was
        # refused as "not a positive integer"
        if not is_integer(ctx) or ctx < 1:
            raise ConfigError(f"edge_context_tokens must be a positive integer, got {ctx!r}.")
        edge_context_tokens = int(ctx)
        if cascade_band is not None:
            # a scalar, one number or strings failed in unpacking or "<=" with no word of the setting
            band = tuple(cascade_band) if isinstance(cascade_band, Sequence) else ()
            if len(band) != 2 or not all(is_real(v) for v in band) or not 0.0 <= band[0] < band[1] <= 1.0:
                raise ConfigError(
                    f"cascade_band must be (lo, hi) with 0 <= lo < hi <= 1, got {cascade_band!r}."
                )
        given: object = router  # typed Router | None, but a path is what a RouteLLM config holds
        if isinstance(given, str | PathLike):  # it raised an AttributeError at the first request
            raise ConfigError(
                f"router must be a Router object or None (the shipped one), got the path "
                f"{str(given)!r}; pass load_router({str(given)!r})."
            )
        self._router = router
        self._router_lock = threading.Lock()  # decide() runs in executor threads: one load
        self.privacy = privacy
        self.edge_context_tokens = edge_context_tokens
        self.cascade_band = cascade_band

    @property
    def router(self) -> Router:
        if self._router is None:
            with self._router_lock:
                if self._router is None:
                    self._router = load_router()
        return self._router

    def should_escalate(self, mean_logprob: float | None) -> bool:
        return self.router.should_escalate(mean_logprob)

    def decide(
        self,
        messages: str | Sequence[Message],
        *,
        force: str | None = None,
        prompt_tokens: int | None = None,
        embedding: np.ndarray | None = None,
    ) -> Decision:
        msgs = normalize_messages(messages)
        if force is not None and force not in ROUTES:
            raise InvalidRequestError(f"force must be 'edge', 'cloud' or None, got {force!r}.")
        if prompt_tokens is not None and not (is_real(prompt_tokens) and 0 <= prompt_tokens < math.inf):
            # NaN passed the context check (NaN > n is False) and a string raised a TypeError there
            raise InvalidRequestError(
                f"prompt_tokens must be a number >= 0 (the prompt's length in the edge model's "
                f"tokens) or None to estimate it, got {prompt_tokens!r}."
            )
        kinds = pii_kinds_in_messages(msgs) if self.privacy != "off" else []
        cloud_msgs, placeholders = (
            pseudonymize_messages(msgs) if kinds and self.privacy == "redact" else (msgs, {})
        )

        def decision(route: str, reason: str, score: float | None = None,
                     cascade: bool = False, forced: bool = False, private: bool = False) -> Decision:
            # a cascade starts on the device: the pipeline adds the note if it escalates
            if cloud_msgs is not msgs and route == "cloud":
                reason += redaction_note(kinds)
            return Decision(route=route, reason=reason, score=score, messages_for_cloud=cloud_msgs,
                            pii_kinds=kinds, cascade=cascade, forced=forced, placeholders=placeholders,
                            private=private)

        if kinds and self.privacy == "keep_on_device":
            # what the user can do: the cloud with placeholders instead of the values
            over = " over route='cloud'" if force == "cloud" else ""
            return decision("edge", f"privacy: prompt contains {', '.join(kinds)}; kept on device{over} "
                            "(privacy='redact' sends the cloud placeholders instead)", private=True)
        if force is not None:
            return decision(force, f"forced {force} by the caller", forced=True)
        tokens = estimate_tokens(msgs) if prompt_tokens is None else prompt_tokens
        if tokens > self.edge_context_tokens:
            return decision(
                "cloud", f"prompt of {tokens} tokens exceeds the edge context "
                f"({self.edge_context_tokens})"
            )
        router = self.router
        score = routable(router.score_text(last_user_text(msgs), embedding=embedding))
        if self.cascade_band is not None and self.cascade_band[0] <= score < self.cascade_band[1]:
            return decision("edge", f"borderline score {score:.3f}: edge first, cloud if unsure",
                            score, cascade=True)
        t = router.threshold
        shown_score, shown_t = apart(score, t)
        if sends_to_cloud(score, t):
            return decision("cloud", f"score {shown_score} >= threshold {shown_t}", score)
        if t >= NEVER_CLOUD:
            return decision("edge", f"score {shown_score}, threshold {shown_t}: never the cloud", score)
        return decision("edge", f"score {shown_score} < threshold {shown_t}", score)


def apart(a: float, b: float, digits: int = 3) -> tuple[str, str]:
    """``a`` and ``b`` with ``digits`` decimals, or the fewest more that tell them apart, so that a
    reason reads as the comparison made (0.55954 against a score of 0.559539 showed "0.560 < 0.560").
    Rounding is monotone, so two different strings keep the order of the numbers."""
    for d in range(digits, 21):
        sa, sb = f"{a:.{d}f}", f"{b:.{d}f}"
        if a == b or sa != sb:
            return sa, sb
    return repr(a), repr(b)  # closer than 1e-20 (two tiny scores): the shortest exact forms
