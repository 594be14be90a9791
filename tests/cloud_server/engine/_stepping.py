"""One request stepped to its end past failed steps, as the server's async loop retries them."""

from __future__ import annotations

from typing import Any

from cloud_server.exceptions import EngineError


def step_past_failures(eng: Any, rid: str, prompt: list[int], params: Any,
                       max_steps: int) -> tuple[list[int], list[str]]:
    """(the request's output ids, the failed steps' errors) after at most ``max_steps`` steps; a
    step that fails (``EngineError``) is followed by the next. The request is aborted at the end,
    whatever happened, so it never stays behind holding blocks."""
    eng.add_request(rid, prompt, params)
    ids: list[int] = []
    errors: list[str] = []
    try:
        for _ in range(max_steps):
            if not eng.has_unfinished():
                break
            try:
                for out in eng.step():
                    ids += out.delta_token_ids
            except EngineError as exc:
                errors.append(str(exc))
    finally:
        eng.abort(rid)
    return ids, errors
