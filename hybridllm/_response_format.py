"""A request's structured output as the core keeps it: OpenAI's ``response_format`` (a dict, or a
pydantic model class) normalized to its grammar's own form, and the grammar of such a form. A
regex or choice format (vLLM's ``structured_outputs``) has its own form too: ``{"type": "regex",
"regex": ...}`` and ``{"type": "choice", "choice": [...]}``. The grammar compiler
(:mod:`hybridllm._structured`) loads at the first format only."""

from __future__ import annotations

from typing import Any

from ._exceptions import InvalidRequestError

RAW_KINDS = ("regex", "choice")  # plain text, not JSON: vLLM's structured_outputs regex and choice


def normalized_format(value: Any) -> dict[str, Any] | None:
    """``response_format`` as the core normalizes it: None for plain text, else OpenAI's dict (or a
    regex or choice format's own form, as ``structured_outputs`` makes one). A pydantic model
    class (as openai's ``parse`` takes) is its JSON schema, under its class name."""
    if value is None:
        return None
    if isinstance(value, type) and callable(getattr(value, "model_json_schema", None)):
        model: Any = value
        try:
            schema = model.model_json_schema()
        except Exception as exc:  # a model pydantic cannot describe (an arbitrary type in a field)
            raise InvalidRequestError(
                f"response_format: pydantic could not make a JSON schema of {value.__name__} "
                f"({type(exc).__name__}: {exc}); pass the schema as a dict instead.") from exc
        value = {"type": "json_schema", "json_schema": {"name": value.__name__, "schema": schema,
                                                          "strict": True}}
    if not isinstance(value, dict):
        raise InvalidRequestError(
            "response_format must be a dict such as {'type': 'json_object'} or {'type': 'json_schema', "
            "'json_schema': {'name': ..., 'schema': {...}}}, or a pydantic model class; got "
            f"{type(value).__name__}.")
    grammar = grammar_of(value)
    return None if grammar is None else grammar.response_format  # type: ignore[no-any-return]


def grammar_of(response_format: dict[str, Any]) -> Any:
    """The core's Grammar of a response format, None for plain text (the core keeps each format's
    grammar: the request, its cache key and a backend ask for the same one). ResponseFormatError
    becomes the caller's InvalidRequestError, naming the field and what to do."""
    import json

    # at the first format only
    from ._structured import ResponseFormatError, parse_grammar, parse_response_format

    try:  # in the caller's key order: a schema's property order is the answer's key order
        text = json.dumps(response_format, allow_nan=False)
    except (TypeError, ValueError) as exc:  # a set, an object, NaN: no JSON, so no schema
        raise InvalidRequestError(f"response_format must hold JSON values only ({exc}).") from exc
    value = json.loads(text)  # as JSON reads it (a tuple is a list)
    try:  # a regex or choice format in its own form (structured_outputs'), else OpenAI's
        raw = isinstance(value, dict) and value.get("type") in RAW_KINDS
        return parse_grammar(value) if raw else parse_response_format(value)
    except ResponseFormatError as exc:
        raise format_error(exc, "response_format") from exc


def format_error(exc: Exception, field: str) -> InvalidRequestError:
    """A ResponseFormatError as the caller's InvalidRequestError, naming the field (``param``)."""
    where = getattr(exc, "param", None) or field
    said = str(exc)  # structured_outputs' messages begin with the field they name already
    error = InvalidRequestError(said if field == "structured_outputs" and said.startswith(where)
                                else f"{where}: {said}")
    error.param = where  # type: ignore[attr-defined]  # the field, for a server's 400
    return error
