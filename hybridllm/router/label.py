"""Labelling your own model pair: run the edge and the cloud model on questions with reference
answers and write a RouteLLM-format CSV (``prompt``, one True/False column per model, and the edge
answer's mean token log-probability for calibrating the cascade).

Grading, as RouteLLM does for GSM8K: when the reference holds a number, the last number of the
answer must equal it; otherwise the normalized answer must equal the reference (or, for a short
reference such as a multiple-choice letter, start with it).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import CloudError, DataError, EdgeError
from .dataset import LOGPROB_COL

Generate = Callable[[str], tuple[str, float | None]]  # prompt -> (answer, mean logprob or None)

SYSTEM_PROMPT = "Answer the question. Think step by step, then end with 'The answer is X'."
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Question:
    prompt: str
    reference: str


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _normalize(text: str) -> str:
    return re.sub(r"[^\w ]", "", text.lower()).strip()


def reference_answer(raw: str) -> str:
    """GSM8K references end with ``#### 42``; keep what follows the marker."""
    return raw.split("####")[-1].strip() if "####" in raw else raw.strip()


def is_correct(answer: str, reference: str) -> bool:
    ref_num = _last_number(reference)
    if ref_num is not None and _normalize(reference).replace(" ", "").lstrip("-").replace(
        ".", ""
    ).isdigit():
        got = _last_number(answer)
        return got is not None and abs(got - ref_num) < 1e-6
    a, r = _normalize(answer), _normalize(reference)
    if not r:
        return False
    if a == r:
        return True
    tail = re.search(r"answer is\s*(.+)$", a)
    if tail and tail.group(1).strip() == r:
        return True
    return len(r) <= 3 and (a.split() or [""])[0] == r


def read_questions(path: str | Path) -> list[Question]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass a JSONL file of questions with --data.")
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p} line {i} is not JSON ({exc.msg}).") from exc
        prompt = rec.get("question") or rec.get("prompt") if isinstance(rec, dict) else None
        ref = rec.get("answer", rec.get("reference")) if isinstance(rec, dict) else None
        if not isinstance(prompt, str) or ref is None:
            raise DataError(
                f"{p} line {i} needs 'question' (or 'prompt') and 'answer' (or 'reference')."
            )
        out.append(Question(prompt=prompt, reference=reference_answer(str(ref))))
    if not out:
        raise DataError(f"{p} holds no questions.")
    return out


def label_questions(
    questions: Iterable[Question], edge: Generate, cloud: Generate
) -> list[dict[str, Any]]:
    """Rows with ``prompt``, ``edge`` and ``cloud`` correctness and the edge mean logprob."""
    rows = []
    for q in questions:
        edge_text, edge_lp = edge(q.prompt)
        cloud_text, _ = cloud(q.prompt)
        rows.append({
            "prompt": q.prompt,
            "edge": is_correct(edge_text, q.reference),
            "cloud": is_correct(cloud_text, q.reference),
            LOGPROB_COL: "" if edge_lp is None else f"{edge_lp:.5f}",
        })
    return rows


def write_labels(rows: list[dict[str, Any]], path: str | Path, *, edge_col: str,
                 cloud_col: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["prompt", edge_col, cloud_col, LOGPROB_COL])
        for r in rows:
            writer.writerow([r["prompt"], r["edge"], r["cloud"], r[LOGPROB_COL]])
    return out


def llama_cpp_edge(model_path: str | Path, *, max_tokens: int = 256, n_ctx: int = 2048) -> Generate:
    """Greedy answers from a GGUF model with llama.cpp, plus their mean token log-probability."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise EdgeError("The edge model needs llama-cpp-python: pip install llama-cpp-python"
                        ) from exc
    try:
        llm = Llama(model_path=str(model_path), n_ctx=n_ctx, logits_all=True, verbose=False)
    except Exception as exc:
        raise EdgeError(f"llama.cpp could not load {model_path}: {exc}") from exc

    def generate(prompt: str) -> tuple[str, float | None]:
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": prompt}]
        try:
            out: Any = llm.create_chat_completion(  # type: ignore[call-overload,misc]
                messages=messages,  # type: ignore[arg-type]
                max_tokens=max_tokens, temperature=0.0, logprobs=True, top_logprobs=1,
            )
        except Exception as exc:
            raise EdgeError(f"llama.cpp failed while answering: {exc}") from exc
        choice = out["choices"][0]
        lps = [t.get("logprob") for t in ((choice.get("logprobs") or {}).get("content") or [])]
        lps = [float(x) for x in lps if x is not None]  # llama.cpp gives numpy float32
        return choice["message"]["content"] or "", (sum(lps) / len(lps) if lps else None)

    return generate


def openai_cloud(url: str, *, model: str = "default", api_key: str | None = None,
                 max_tokens: int = 256, timeout: float = 120.0) -> Generate:
    """Greedy answers from an OpenAI-compatible ``/v1/chat/completions`` endpoint."""
    import httpx

    base = url.rstrip("/")
    endpoint = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(timeout=timeout, headers=headers)

    def generate(prompt: str) -> tuple[str, float | None]:
        body = {"model": model, "temperature": 0.0, "max_tokens": max_tokens,
                "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                             {"role": "user", "content": prompt}]}
        try:
            resp = client.post(endpoint, json=body)
        except httpx.HTTPError as exc:
            raise CloudError(f"Cannot reach {endpoint}: {exc}; check --cloud.") from exc
        if resp.status_code != 200:
            raise CloudError(f"{endpoint} answered {resp.status_code}: {resp.text[:200]}",
                             status_code=resp.status_code)
        try:
            return str(resp.json()["choices"][0]["message"]["content"] or ""), None
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise CloudError(f"{endpoint} returned no chat completion: {resp.text[:200]}") from exc

    return generate
