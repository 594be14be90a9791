"""The building blocks of the request models: the strict base model and the checked field types."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic.config import JsonDict

INT32_MAX = 2**31 - 1


def _integral(value: Any) -> Any:
    # JSON has one number type: 5.0 is the integer 5 (as JSON Schema's "integer" says); 5.5 is not
    return int(value) if isinstance(value, float) and value.is_integer() else value


_INTEGRAL = BeforeValidator(_integral)  # after the bounds, so the JSON schema keeps them
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX), _INTEGRAL]
TokenCount = Annotated[int, Field(ge=1, le=INT32_MAX), _INTEGRAL]
Unit = Annotated[float, Field(allow_inf_nan=False)]


def only(**schema: Any) -> Any:
    """Document in the JSON schema the one value accepted (checked by a validator that names the
    parameter and says why, rather than by a bare bound)."""
    return Field(default=None, json_schema_extra=schema)



def _admits_none(annotation: Any) -> bool:
    return annotation is None or annotation is type(None) or type(None) in get_args(annotation)


class _Strict(BaseModel):
    """Strict types, unknown fields refused; and JSON null in an optional field is the field left out.

    Clients other than OpenAI's own send null for every optional field they leave unset (vLLM reads
    it as absent): so a field with a default that null is not a value of (``"echo": null``,
    ``"stream": null``) takes its default, and the JSON schema lists null beside its type. A field
    whose type includes None keeps null as its value (``"max_tokens": null``: the server's default);
    a required field stays required (``"model": null`` is a 400)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def _null_means_default(cls) -> frozenset[str]:
        return frozenset(
            name for name, info in cls.model_fields.items()
            if not info.is_required() and not _admits_none(info.annotation)
        )

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            defaulted = cls._null_means_default()
            if any(data.get(name, 0) is None for name in defaulted):
                data = {k: v for k, v in data.items() if not (v is None and k in defaulted)}
        return data

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: GetJsonSchemaHandler) -> JsonDict:
        schema = super().__get_pydantic_json_schema__(core_schema, handler)
        properties = handler.resolve_ref_schema(schema).get("properties", {})
        for name in cls._null_means_default():
            prop = properties.get(name)
            if prop is None or any(alt.get("type") == "null" for alt in prop.get("anyOf", ())):
                continue
            kept = {k: prop.pop(k) for k in ("default", "title") if k in prop}
            properties[name] = {"anyOf": [prop, {"type": "null"}], **kept}
        return schema
