"""vLLM's structured output fields, as both servers take them on a chat or completion request:
``structured_outputs`` (``{"json": schema}``, ``{"regex": pattern}`` or ``{"choice": [strings]}``)
and the older ``guided_json``, ``guided_regex`` and ``guided_choice``, one of them at most and not
beside a ``response_format`` other than ``text``. ``VllmFormatFields`` declares them (a request
model inherits it); ``vllm_grammar`` reads them into the grammar core's Grammar, a 400 naming the
field for what it cannot serve. The cloud server holds its engine to that grammar; ``hybridllm
serve`` hands the grammar's own form to the client, whose device and cloud routes serve it."""

from __future__ import annotations

from typing import Any

from .errors import WireError
from .fields import _Strict

VLLM_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice")

StructuredOutputs = dict[str, Any]
GuidedJson = dict[str, Any] | str


class VllmFormatFields(_Strict):
    """The four fields, as a request model declares them (checked by ``vllm_grammar``)."""

    structured_outputs: StructuredOutputs | None = None
    guided_json: GuidedJson | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None


def vllm_field(req: Any) -> str | None:
    """The vLLM field a request gives (None without one)."""
    return next((name for name in VLLM_FIELDS if getattr(req, name, None) is not None), None)


def vllm_grammar(req: Any) -> Any:
    """The Grammar of vLLM's structured_outputs (or a guided_* field), None without one; a 400
    naming the field for two of them, one beside a response_format, or what the core refuses."""
    given = [name for name in VLLM_FIELDS if getattr(req, name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise WireError(f"Only one of {', '.join(VLLM_FIELDS)} may be given; got {' and '.join(given)}.",
                        param=given[1])
    name = given[0]
    if req.response_format is not None and req.response_format.type != "text":
        raise WireError(f"response_format and {name} cannot both be given: use one.", param=name)
    from .._structured import ResponseFormatError, parse_structured_outputs

    value = getattr(req, name)
    spec = value if name == "structured_outputs" else {name.removeprefix("guided_"): value}
    try:
        return parse_structured_outputs(spec, field=name)
    except ResponseFormatError as exc:
        raise WireError(str(exc), param=exc.param or name) from None
