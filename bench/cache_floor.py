"""Calibrate the semantic cache's confidence floor on the real edge model.

The cache does not store an answer whose mean token log-probability is below a floor (the model
itself was unsure). This samples the edge model several times per short factual question at the
default temperature, labels each answer right or wrong by its expected word, and picks the floor
that best separates them (balanced accuracy, the rule the router's cascade threshold uses):

    python -m bench.cache_floor --json    # one JSON object: floor, balanced accuracy, counts

The shipped default (``CACHE_MIN_LOGPROB`` in hybridllm/_config.py) is the value this printed.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from hybridllm._cli_options import non_negative_float, positive_int

QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of England?", "London"),
    ("What is the capital of Russia?", "Moscow"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Australia?", "Canberra"),
    ("What is 2 + 2?", "4"),
    ("What is 10 times 10?", "100"),
    ("How many days are in a week?", "7"),
    ("How many legs does a spider have?", "8"),
    ("How many continents are there?", "7"),
    ("What color is the sky on a clear day?", "blue"),
    ("What color is grass?", "green"),
    ("What is the largest planet in our solar system?", "Jupiter"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("What is the chemical symbol for water?", "H2O"),
    ("What is the freezing point of water in Celsius?", "0"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("Who painted the Mona Lisa?", "Leonardo"),
    ("What is the tallest mountain in the world?", "Everest"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What gas do plants absorb from the air?", "carbon dioxide"),
    ("What language is spoken in Brazil?", "Portuguese"),
    ("How many hours are in a day?", "24"),
    ("What is the opposite of hot?", "cold"),
    ("What animal is known as the king of the jungle?", "lion"),
]


def forced_mean_logprob(edge, question: str, answer: str) -> float:
    """The mean log-probability the model gives ``answer``'s tokens after ``question`` (teacher
    forcing, raw logits as the edge reports them)."""
    from llama_cpp import Llama

    # the ids the edge itself feeds (hybridllm.prompts.tokenize_prompt): the question and the
    # answer (a continuation prefix) are text, only the template's markers are control tokens
    messages = [{"role": "user", "content": question}]
    prompt, whole = edge.tokenize(messages), edge.tokenize(messages, prefix=answer)
    if whole[: len(prompt)] != prompt:
        raise SystemExit(f"the answer {answer!r} merges into the prompt's last tokens; end the "
                         "prompt or start the answer differently")
    ans = whole[len(prompt) :]
    llm = Llama(model_path=str(edge.model_path), n_ctx=512, logits_all=True, verbose=False)
    llm.reset()
    llm.eval(prompt + ans)
    rows = np.asarray(llm.scores[len(prompt) - 1 : len(prompt) + len(ans) - 1], dtype=np.float64)
    # log_softmax(row)[token] = row[token] - logsumexp(row), per answer position
    peak = rows.max(axis=1, keepdims=True)
    lse = peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))
    lp = rows[np.arange(len(ans)), ans] - lse
    llm.close()
    return float(lp.mean())


def _temperature(text: str) -> float:
    """``--temperature``: 0 to 2, the range GenerationParams takes (refused there only after the
    model had loaded, with a traceback)."""
    value = non_negative_float(text)
    if value > 2.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 2, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cache_floor", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="edge model (default: the client's default)")
    # checked here: 0 samples failed after the model loaded, NaN or -1 as a temperature deep in a run
    ap.add_argument("--samples", type=positive_int, default=4, help="answers per question (default 4)")
    ap.add_argument("--temperature", type=_temperature, default=0.7,
                    help="sampling temperature (default 0.7)")
    ap.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per answer (default 32)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on one line")
    args = ap.parse_args(argv)

    from hybridllm._config import DEFAULT_EDGE_MODEL
    from hybridllm._exceptions import DataError
    from hybridllm._types import GenerationParams
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.router.calibrate import calibrate_logprob_threshold

    edge = LlamaCppBackend(args.model or DEFAULT_EDGE_MODEL, n_ctx=512)
    lps, ok, examples = [], [], []
    for q, want in QUESTIONS:
        for s in range(args.samples):
            params = GenerationParams(
                max_tokens=args.max_tokens, temperature=args.temperature, seed=1000 + s, logprobs=True
            )
            g = edge.generate([{"role": "user", "content": q}], params)
            lps.append(g.mean_logprob if g.mean_logprob is not None else float("-inf"))
            ok.append(want.lower() in g.text.lower())
            if q.endswith("France?"):
                examples.append(
                    {"text": g.text.strip()[:80], "mean_logprob": round(lps[-1], 3), "right": ok[-1]}
                )
    issue = forced_mean_logprob(edge, "What is the capital of France?", "L'Étoile, est la cité de la France.")
    edge.close()
    lp, right = np.asarray(lps), np.asarray(ok)
    try:
        floor = calibrate_logprob_threshold(lp, right)
    except DataError as exc:
        # every answer right (or every one wrong): no floor separates them; a null floor and the
        # reason, not a traceback after the whole run
        out = {"floor": None, "n": int(len(lp)), "right": int(right.sum()), "error": str(exc)}
        print(f"bench.cache_floor: no floor: {exc}", file=sys.stderr)
        print(json.dumps(out) if args.json else json.dumps(out, indent=2))
        return 1
    kept = lp >= floor
    out = {
        "floor": round(floor, 3),
        "n": int(len(lp)),
        "right": int(right.sum()),
        "kept_right": int((kept & right).sum()),
        "kept_wrong": int((kept & ~right).sum()),
        "dropped_wrong": int((~kept & ~right).sum()),
        "dropped_right": int((~kept & right).sum()),
        "balanced_accuracy": round(float(((~kept[~right]).mean() + kept[right].mean()) / 2), 3),
        "wrong_kept_before": int((~right).sum()),
        "france": examples,
        # the sampled answer a user was served from the cache for 7 days before the floor
        "issue_answer_mean_logprob": round(issue, 3),
        "issue_answer_kept": bool(issue >= floor),
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
