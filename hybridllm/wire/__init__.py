"""The OpenAI wire format as both servers speak it: request models, response and chunk shapes,
SSE framing, error JSON, body limits and OpenAPI pieces. Used by ``cloud_server.api`` and
``hybridllm.proxy``; needs pydantic (the ``server`` extra), so the light client never imports it.

    body.py       read_body (size limit, 413), decode_json_object (strict JSON, depth, surrogates)
    requests.py   ChatCompletionRequest, CompletionRequest, parse_request -> WireError (400)
    vllm_formats.py  vLLM's structured_outputs / guided_* fields and their grammar (400s)
    fields.py     the strict base model and field types the request models are built from
    validation.py validation_error: a pydantic error as one 400 message naming the parameter
    responses.py  chat_completion, text_completion, ChunkWriter, sse_event, DONE; document models
    errors.py     WireError, error_body, header_value
    urls.py       url_hint: the route a 404's path was likely meant for (a base_url without /v1)
    openapi.py    request_body, error_responses, ok_response, add_schemas
"""

from .body import DEFAULT_MAX_BODY_BYTES, decode_json_object, is_large, read_body
from .errors import WireError, error_body, header_value
from .requests import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingRequest, parse_request
from .responses import DONE, ChunkWriter, chat_completion, error_event, sse_event, text_completion, usage_dict

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DONE",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChunkWriter",
    "CompletionRequest",
    "SamplingRequest",
    "WireError",
    "chat_completion",
    "decode_json_object",
    "error_body",
    "error_event",
    "header_value",
    "is_large",
    "parse_request",
    "read_body",
    "sse_event",
    "text_completion",
    "usage_dict",
]
