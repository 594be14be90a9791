"""The main job behind `make run`: answer a few sample prompts and show how each was served."""

from __future__ import annotations

import sys

from ._exceptions import HybridLLMError
from ._progress import ProgressBar

PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for staying focused while studying.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
]


def main() -> int:
    from ._client import HybridLLM

    try:
        llm = HybridLLM(temperature=0.0, seed=0, max_tokens=96,
                        progress=ProgressBar("Preparing smollm2-135m-instruct"))
    except HybridLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with llm:
        for prompt in PROMPTS:
            c = llm.chat(prompt)
            tps = f"{c.tokens_per_s:.0f}" if c.tokens_per_s else "-"
            print(f"\n> {prompt}\n{c.text.strip()}")
            print(f"  route={c.route}  model={c.model}  TTFT={c.ttft_ms:.0f} ms  tok/s={tps}  "
                  f"tokens={c.usage.completion_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
