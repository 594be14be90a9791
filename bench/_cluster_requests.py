"""bench.cluster's requests: the tenants' seeded workload, its chat bodies, one streamed request timed."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

MODEL = "smollm2"
TENANTS = ("acme-legal", "birch-health", "cobalt-retail", "delta-travel")
WORDS = (
    "policy customer account refund contract clause review privacy record data agent answer "
    "escalate verify identity schedule invoice shipment warranty claim support ticket priority "
    "region compliance audit report summary tone brief formal friendly cite source never always"
).split()
QUESTIONS = (
    "How do I reset my password?",
    "What is your refund policy?",
    "Can you summarise my last invoice?",
    "Where is my order right now?",
    "Who do I contact about a warranty claim?",
    "Is my data shared with third parties?",
)


def say(msg: str) -> None:
    print(f"[bench.cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def system_prompt(tenant: str, num_words: int) -> str:
    rng = random.Random(tenant)
    rules = []
    for i in range(num_words // 12):
        rules.append(f"Rule {i + 1}: " + " ".join(rng.choice(WORDS) for _ in range(10)) + ".")
    return f"You are the assistant of {tenant}. Follow these house rules. " + " ".join(rules)


def workload(n: int, rate: float, long_tokens: int, long_share: float, seed: int) -> list[dict[str, Any]]:
    """Poisson arrivals (exponential gaps, mean 1/rate), tenant and answer length drawn per request."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        tenant = rng.choice(TENANTS)
        out.append(
            {
                "at": t,
                "tenant": tenant,
                "question": f"{rng.choice(QUESTIONS)} (#{i})",
                "max_tokens": long_tokens if rng.random() < long_share else 16,
            }
        )
    return out


def chat_body(system: str | None, question: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": question}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {
        "model": MODEL,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "max_tokens": max_tokens,
        "messages": messages,
        "stream_options": {"include_usage": True},
    }


async def one(client: Any, url: str, body: dict[str, Any], at: float, t0: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
    sent = time.perf_counter()
    ttft, chunks, error, usage = None, 0, None, None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                error = f"HTTP {resp.status_code}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    event = json.loads(line[5:])
                    if event.get("error"):
                        error = f"stream error: {str(event['error'])[:120]}"
                        break
                    usage = event.get("usage") or usage
                    for c in event.get("choices") or []:
                        if (c.get("delta") or {}).get("content"):
                            chunks += 1
                            if ttft is None:
                                ttft = time.perf_counter() - sent
    except Exception as exc:  # noqa: BLE001 - counted, not fatal
        error = type(exc).__name__
    if error is None and ttft is None:
        error = "no content"
    usage = usage or {}
    return {
        "ttft": ttft,
        "max_tokens": body["max_tokens"],
        "output_tokens": usage.get("completion_tokens"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "error": error,
        "sent": sent - t0,
        "end": time.perf_counter() - t0,
    }
