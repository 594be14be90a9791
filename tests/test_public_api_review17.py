"""The public API surface and the wire formats: documented errors, SSE framing, OpenAI shapes."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
import re
from pathlib import Path

import pytest

import hybridllm
from hybridllm.wire.responses import (
    DONE,
    ChunkWriter,
    chat_completion,
    error_event,
    text_completion,
    usage_dict,
)
from hybridllm.wire.sse import EventStreamResponse

README = Path(__file__).resolve().parents[1] / "README.md"
ERRORS = [getattr(hybridllm, n) for n in hybridllm.__all__
          if isinstance(getattr(hybridllm, n), type) and issubclass(getattr(hybridllm, n), Exception)]


def _python_api_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## The Python API")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_readme_names_every_public_error():
    # ModelError, BackendError, EdgeError's sibling CloudError, RouterError and CacheError were
    # exported but not named: a user could not learn from the README which base catches a branch
    section = _python_api_section()
    missing = [e.__name__ for e in ERRORS if f"`{e.__name__}`" not in section]
    assert not missing, missing


def _sample(cls: type[Exception]) -> Exception:
    if cls is hybridllm.CloudBudgetSpentError:
        return cls("spent", reason="100 calls an hour", retry_after_s=12.5, prompt_tokens=9)
    if issubclass(cls, hybridllm.CloudError):
        return cls("down", status_code=503, retry_after_s=2.0)
    if cls is hybridllm.ContextWindowExceededError:
        return cls("too long", prompt_tokens=5000, context_length=4096)
    return cls("what went wrong; what to do")


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_public_error_pickles_and_copies_whole(cls):
    err = _sample(cls)
    err.add_note("a note")
    for other in (pickle.loads(pickle.dumps(err)), copy.copy(err), copy.deepcopy(err)):
        assert type(other) is cls and other.args == err.args and vars(other) == vars(err)
        assert str(other) == str(err)


# -- SSE writing -----------------------------------------------------------------------------------


def _frames(events: list[str]) -> list[dict]:
    out = []
    for event in events:
        # one "data: " line, ended by a blank line, ASCII (a client's decoder cannot split it)
        assert event.startswith("data: ") and event.endswith("\n\n") and event.count("\n") == 2
        assert event.isascii() and "\r" not in event
        out.append(json.loads(event[len("data: "):]))
    return out


def test_chunk_frames_stay_one_line_whatever_the_text_holds():
    w = ChunkWriter(id="chatcmpl-1", created=1, model="m", chat=True, include_usage=True)
    text = "a\nb\r\nc\rd\u2028e\u00e9\U0001F600: ping\n\ndata: [DONE]"
    frames = _frames([w.role(), w.text(text), w.finish("stop"), w.usage(usage_dict(3, 2))])
    assert frames[1]["choices"][0]["delta"]["content"] == text
    assert error_event({"error": {"message": "x"}}).endswith(DONE) and DONE == "data: [DONE]\n\n"


def test_shapes_validate_against_openai_types():
    openai_types = pytest.importorskip("openai.types")
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    usage = usage_dict(3, 4, cached_tokens=1)
    for reason in ("stop", "length", "content_filter"):
        ChatCompletion.model_validate(chat_completion(
            id="chatcmpl-1", created=1, model="m", text="hi", finish_reason=reason, usage=usage))
        openai_types.Completion.model_validate(text_completion(
            id="cmpl-1", created=1, model="m", text="hi", finish_reason=reason, usage=usage))
    for include_usage in (True, False):
        w = ChunkWriter(id="chatcmpl-1", created=1, model="m", chat=True, include_usage=include_usage)
        for frame in _frames([w.role(), w.text("hi"), w.finish("length"), w.usage(usage)]):
            ChatCompletionChunk.model_validate(frame)


# -- EventStreamResponse ----------------------------------------------------------------------------


class _Events:
    """An event iterator like the cloud server's ``_ClosingEvents``: ``aclose`` frees the work."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> str:
        await asyncio.sleep(30)
        return "data: {}\n\n"

    async def aclose(self) -> None:
        self.closed = True


def _serve(events, fail_at: int, is_closed) -> None:
    """Run the response; the server's ``send`` raises RuntimeError at its ``fail_at``-th message;
    ``is_closed()`` must hold once it returns (still in the loop: asyncio.run's end closes any)."""
    sent = 0

    async def send(message: dict) -> None:
        nonlocal sent
        sent += 1
        if sent == fail_at:
            raise RuntimeError("Unexpected ASGI message")

    async def receive() -> dict:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    async def main() -> None:
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(EventStreamResponse(events)({"type": "http"}, receive, send), 5)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.sleep(0)
        assert all(t.done() for t in others)  # watcher and stopper gone too
        assert is_closed()

    asyncio.run(main())


def test_events_are_closed_when_the_start_cannot_be_sent():
    # a send that failed with anything but OSError left the events open: the cloud server's engine
    # request (freed by aclose) ran on to max_tokens with nobody to read it
    events = _Events()
    _serve(events, fail_at=1, is_closed=lambda: events.closed)


def test_generator_is_closed_when_a_body_send_fails():
    closed = []

    async def events():
        try:
            yield "data: {}\n\n"
            await asyncio.sleep(30)
        finally:
            closed.append(True)

    _serve(events(), fail_at=2, is_closed=lambda: closed == [True])


def test_readme_error_names_are_real_classes():
    # every `...Error` the Python API section names is a public class (no stale name)
    names = set(re.findall(r"`([A-Z][A-Za-z]*Error)`", _python_api_section()))
    assert names <= {e.__name__ for e in ERRORS}, names - {e.__name__ for e in ERRORS}
