"""The two models a label run asks: an edge model in llama.cpp and an OpenAI-compatible cloud."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import CloudError, EdgeError


@dataclass(frozen=True)
class Answer:
    text: str
    mean_logprob: float | None = None  # mean token log-probability (the edge side)
    num_tokens: int | None = None  # completion tokens
    finish_reason: str | None = None  # "length" when max_tokens cut the answer off


# prompt -> Answer, or (answer text, mean logprob or None)
Generate = Callable[[str], "Answer | tuple[str, float | None]"]

# Brief on purpose: a long chain of thought costs cloud tokens (and labelling time: on a 2-core CPU
# Qwen2.5-Coder-1.5B averaged 270 tokens per GSM8K answer when told to think step by step, 64 with
# this prompt) and gets cut off at --max-tokens, which grades a right answer wrong.
SYSTEM_PROMPT = (
    "Solve the problem. Show the calculation in at most four short lines of plain "
    "text (no LaTeX), then end with 'The answer is X'."
)
# seconds to open a connection to the cloud: a wrong or firewalled address hung for the whole
# --timeout (15 min by default, meant for a long answer) on each of the 3 tries of each question
CONNECT_TIMEOUT_S = 10.0


def llama_cpp_edge(
    model_path: str | Path, *, max_tokens: int = 256, n_ctx: int = 2048, system_prompt: str = SYSTEM_PROMPT
) -> Generate:
    """Greedy answers from a GGUF model with llama.cpp, plus their mean token log-probability."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise EdgeError("The edge model needs llama-cpp-python: pip install llama-cpp-python") from exc
    from ..backends.llama_cpp_load import _route_llama_logs

    _route_llama_logs()  # its advice lines off the progress bar's stderr
    try:
        llm = Llama(model_path=str(model_path), n_ctx=n_ctx, logits_all=True, verbose=False)
    except Exception as exc:
        raise EdgeError(f"llama.cpp could not load {model_path}: {exc}") from exc

    def generate(prompt: str) -> Answer:
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
        try:
            out: Any = llm.create_chat_completion(  # type: ignore[call-overload,misc]
                messages=messages,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=0.0,
            )
        except Exception as exc:
            raise EdgeError(f"llama.cpp failed while answering: {exc}") from exc
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Answer(
            text=choice["message"]["content"] or "",
            mean_logprob=_greedy_mean_logprob(
                llm.scores, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            ),
            num_tokens=usage.get("completion_tokens"),
            finish_reason=choice.get("finish_reason"),
        )

    return generate


def _greedy_mean_logprob(scores: Any, num_prompt: int, num_completion: int) -> float | None:
    """Mean log-probability of a greedy completion from llama.cpp's saved logits.

    Row ``j`` of ``scores`` (``logits_all``) holds the logits after token ``j``, so the completion's
    tokens are predicted by rows ``num_prompt - 1 .. num_prompt + num_completion - 2``; greedy
    decoding picked each row's argmax, whose log-probability is ``max - logsumexp``. (Asking
    llama-cpp-python for ``logprobs`` instead sorts the whole 49k vocabulary in Python for every
    token: on two cores that made the 135M edge slower per question than the batched 1.5B cloud.)
    """
    import numpy as np

    if num_prompt < 1 or num_completion < 1:
        return None
    rows = np.asarray(scores[num_prompt - 1 : num_prompt - 1 + num_completion], dtype=np.float64)
    if len(rows) == 0:
        return None
    top = rows.max(axis=1)
    lse = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
    return float(np.mean(top - lse))


def openai_cloud(
    url: str,
    *,
    model: str = "default",
    api_key: str | None = None,
    max_tokens: int = 256,
    timeout: float = 900.0,
    system_prompt: str = SYSTEM_PROMPT,
) -> Generate:
    """Greedy answers from an OpenAI-compatible ``/v1/chat/completions`` endpoint."""
    import httpx

    base = url.rstrip("/")
    endpoint = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # --timeout waits for a long answer; opening the connection never needs that long
    limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
    client = httpx.Client(timeout=limits, headers=headers)

    def generate(prompt: str) -> Answer:
        body = {
            "model": model,
            "temperature": 0.0,
            "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}],
        }
        try:
            resp = client.post(endpoint, json=body)
        except httpx.HTTPError as exc:
            raise CloudError(f"Cannot reach {endpoint}: {exc}; check --cloud.") from exc
        if resp.status_code != 200:
            raise CloudError(
                f"{endpoint} answered {resp.status_code}: {resp.text[:200]}", status_code=resp.status_code
            )
        try:
            data = resp.json()
            choice = data["choices"][0]
            return Answer(
                text=str(choice["message"]["content"] or ""),
                num_tokens=(data.get("usage") or {}).get("completion_tokens"),
                finish_reason=choice.get("finish_reason"),
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise CloudError(f"{endpoint} returned no chat completion: {resp.text[:200]}") from exc

    return generate
