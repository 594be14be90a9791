"""Request parts whose checks are the library's own: ``response_format`` (the grammar core,
``hybridllm/_structured``) and ``tools``, ``tool_choice`` and earlier tool calls
(``hybridllm._tools``), each refusal a 400 (:class:`WireError`) naming the field at fault.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from .errors import WireError
from .fields import _Strict


class ResponseFormat(_Strict):
    # OpenAI's three types, each served (checked_response_format reads the schema)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


def checked_response_format(value: ResponseFormat | None) -> ResponseFormat | None:
    """A format as the grammar core takes it: a schema belongs to type json_schema, and a format
    the core refuses is a 400 naming its field (``response_format.json_schema.schema.…``)."""
    if value is None:
        return None
    if value.type != "json_schema" and value.json_schema is not None:
        raise WireError(
            f"response_format.json_schema is only allowed with type 'json_schema', not '{value.type}'.",
            param="response_format.json_schema",
        )
    if value.type != "text":
        from .._structured import ResponseFormatError, parse_response_format

        try:  # compiled once: the same format asked again is the core's kept grammar
            parse_response_format(value.model_dump(exclude_none=True))
        except ResponseFormatError as exc:
            raise WireError(str(exc), param=exc.param) from None
    return value


def _as_wire(check: Any, *args: Any) -> Any:
    """A library check's InvalidRequestError as the servers' 400, its ``param`` and ``code`` kept."""
    from .._exceptions import InvalidRequestError

    try:
        return check(*args)
    except InvalidRequestError as exc:
        raise WireError(
            str(exc), param=getattr(exc, "param", None), code=getattr(exc, "code", None)
        ) from None


def checked_tools(value: Any) -> list[dict[str, Any]]:
    """A request's ``tools`` as a chat template gets them (``{"type": "function", "function":
    {...}}``), or a 400 naming the field at fault (the library's checks, ``hybridllm._tools``)."""
    from .._tools import check_tools

    return cast(list[dict[str, Any]], _as_wire(check_tools, value))


def tool_choice_of(choice: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """``(mode, name)`` of a request's ``tool_choice``: "none", "auto", "required" or "named"
    (then ``name``: the function), or a 400 naming ``tool_choice``."""
    from .._tools import tool_choice_mode

    return cast(tuple[str, str | None], _as_wire(tool_choice_mode, choice, tools))


def checked_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's earlier ``tool_calls``, each with ``arguments`` as a JSON text, or a
    400 naming the call at fault."""
    from .._tools import check_calls

    return cast(list[dict[str, Any]], _as_wire(check_calls, value, where))
