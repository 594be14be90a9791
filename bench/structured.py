"""Structured output on llama.cpp: our response_format token masks against llama.cpp's own grammar.

    python -m bench.structured [--json] [--model ID_OR_GGUF] [--schema person|event|choice|regex]
                               [--prompts 6]
                               [--max-tokens 96] [--threads 2]

Three sides on the same GGUF, chat prompts and greedy settings, taking turns prompt by prompt:
``gbnf`` is llama-cpp-python's ``create_chat_completion`` with the grammar llama.cpp writes for the
schema (``LlamaGrammar.from_json_schema``); ``ours`` is the same call with this project's mask
(``hybridllm/_structured``: a ``TokenIndex`` of the model's vocabulary, the matcher fed each token)
as a logits processor; ``plain`` is the call with no constraint. Reported: each side's tokens per
second over the whole call (prompt included, ``gbnf_tok_s``, ``ours_tok_s``, ``plain_tok_s``),
``ours_over_gbnf`` (> 1: ours is faster) and each constraint's speed against none
(``ours_over_plain``, ``gbnf_over_plain``); the answers that ended and pass the schema
(``ours_valid``, ``gbnf_valid``, ``plain_valid``, of ``prompts``); each side's mean seconds per
call (``ours_call_s``, ``gbnf_call_s``, ``plain_call_s``); the index's build time
(``index_s``) and the mean mask time per token with the memo cold and warm (``mask_cold_ms``,
``mask_warm_ms``). ``--schema event`` asks for strings held to patterns and to the date and
date-time formats (both grammars serve them) instead of the person's plain fields. ``--schema
choice`` and ``--schema regex`` ask for plain text (vLLM's structured outputs): one of three
labels for a product review, or a US phone number ``(555) 555-5555``, against the GBNF that says the
same (``LlamaGrammar.from_string``); valid is then the label, or the pattern matched whole.
llama.cpp's OpenMP threads spin while they wait: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from hybridllm._cli_options import positive_int

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "languages", "employed"],
    "additionalProperties": False,
}
PEOPLE = [
    "Maria Santos is 34, lives in Lisbon, speaks Portuguese and English, and works as a nurse.",
    "Kenji Watanabe, 52, a retired engineer from Osaka, speaks Japanese.",
    "Amara Okafor (27) moved to Berlin last year; she speaks English, Igbo and German and is job hunting.",
    "Liam O'Brien is a 41-year-old teacher in Dublin who speaks English and Irish.",
    "Sofia Rossi, 19, studies in Milan and speaks Italian, French and Spanish; she has no job.",
    "Ahmed Hassan, 63, runs a bakery in Cairo and speaks Arabic and English.",
    "Chen Wei is 45, lives in Chengdu, speaks Mandarin and works at a bank.",
    "Olga Ivanova, 30, a Moscow software developer, speaks Russian and English.",
]


EVENT = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "pattern": "^[A-Z][A-Za-z ]{2,40}$"},
        "day": {"type": "string", "format": "date"},
        "starts": {"type": "string", "format": "date-time"},
        "room": {"type": "string", "pattern": "^[A-Z]-[0-9]{3}$"},
    },
    "required": ["title", "day", "starts", "room"],
    "additionalProperties": False,
}
EVENTS = [
    "Quarterly planning on 3 March 2025, starting 09:30 UTC in room B-204.",
    "The design review is on 2025-06-17 at 14:00 Berlin time (+02:00), room A-101.",
    "Team lunch: Friday 12 September 2025 at noon UTC, meet in C-300.",
    "Board meeting, 1 December 2025, 08:00 New York time (-05:00), room D-410.",
    "Release retrospective on 2025-02-28, 16:15 UTC, room B-118.",
    "Hiring sync, 21 July 2025, 10:00 Tokyo time (+09:00), room A-007.",
    "Security training on 5 May 2025 at 13:00 UTC in room C-222.",
    "Customer call on 2025-11-04 at 17:30 London time (+00:00), room D-019.",
]
SCHEMAS = {
    "person": (SCHEMA, PEOPLE, "Extract the person as JSON with the keys name, age, city, languages and "
               "employed."),
    "event": (EVENT, EVENTS, "Extract the event as JSON with the keys title, day (YYYY-MM-DD), starts "
              "(an RFC 3339 date-time with its offset) and room."),
}

# vLLM's plain-text formats (structured_outputs choice and regex): each with the GBNF that says the
# same to llama.cpp, its texts and its system prompt
LABELS = ["positive", "negative", "mixed"]
REVIEWS = [
    "I love this phone, the battery lasts two days and the screen is gorgeous.",
    "Terrible. It broke on day one and support never answered.",
    "Great camera, but the battery barely lasts the morning.",
    "Exactly what I needed; setup took five minutes.",
    "The sound is tinny and the app keeps crashing.",
    "Nice design, shame about the price and the slow charging.",
    "Best purchase this year, my kids use it every day.",
    "Returned it after a week: it overheats constantly.",
]
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
OFFICES = [f"Write a phone number for our {city} office." for city in (
    "Boston", "Denver", "Austin", "Seattle", "Chicago", "Miami", "Phoenix", "Atlanta")]
TEXT_FORMATS = {
    "choice": ({"choice": LABELS}, "root ::= " + " | ".join(f'"{x}"' for x in LABELS), REVIEWS,
               "Classify the review as positive, negative or mixed."),
    "regex": ({"regex": PHONE}, 'root ::= "(" [0-9]{3} ") " [0-9]{3} "-" [0-9]{4}', OFFICES,
              "Answer with a US phone number only, written as (555) 555-5555."),
}


class Masker:
    """Our mask as llama-cpp-python's logits processor, for one answer."""

    def __init__(self, index: Any, grammar: Any) -> None:
        self.index, self.matcher, self.seen = index, grammar.matcher(), -1
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np

        if self.seen < 0:
            self.seen = len(input_ids)  # the prompt
        for tid in input_ids[self.seen:]:
            self.index.feed_token(self.matcher, int(tid))
        self.seen = len(input_ids)
        t = time.perf_counter()
        allowed = self.index.allowed(self.matcher)
        self.times.append(time.perf_counter() - t)
        scores[~allowed] = -np.inf
        return scores


def valid(text: str, schema: dict = SCHEMA) -> bool:
    """The answer fits the schema (jsonschema: patterns too), its dates parsing as Python reads them;
    a plain-text format's answer (``{"choice": ...}`` or ``{"regex": ...}``) is one of the choices,
    or matches the pattern whole."""
    import datetime
    import re

    import jsonschema

    if "choice" in schema:
        return text in schema["choice"]
    if "regex" in schema:
        return re.fullmatch(schema["regex"], text) is not None

    try:
        value = json.loads(text)
        jsonschema.validate(value, schema)
        for name, sub in schema["properties"].items():
            if sub.get("format") == "date" and len(value[name]) != 10:
                return False
            if sub.get("format") == "date":
                datetime.date.fromisoformat(value[name])
            if sub.get("format") == "date-time" and (
                    "T" not in value[name] or datetime.datetime.fromisoformat(value[name]).tzinfo is None):
                return False
    except (ValueError, TypeError, KeyError, jsonschema.ValidationError):
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="catalog id or .gguf path")
    ap.add_argument("--schema", choices=sorted(SCHEMAS) + sorted(TEXT_FORMATS), default="person",
                    help="what to extract: a person (plain fields) or an event (pattern, date, date-time) "
                         "as JSON; or plain text: a review's label (choice) or a phone number (regex)")
    ap.add_argument("--prompts", type=positive_int, default=6,
                    help=f"texts to extract from (at most {len(PEOPLE)})")
    ap.add_argument("--max-tokens", type=positive_int, default=96, help="answer tokens at most")
    ap.add_argument("--threads", type=positive_int, default=2, help="llama.cpp threads")
    args = ap.parse_args(argv)
    plain_text = args.schema in TEXT_FORMATS
    if plain_text:
        schema, gbnf_text, texts, system = TEXT_FORMATS[args.schema]
    else:
        schema, texts, system = SCHEMAS[args.schema]
    if args.prompts > len(texts):
        ap.error(f"--prompts: at most {len(texts)}")

    from llama_cpp import Llama, LlamaGrammar, LogitsProcessorList

    from hybridllm._structured import TokenIndex, parse_response_format, parse_structured_outputs
    from hybridllm.backends.structured import llama_vocabulary
    from hybridllm.models import resolve_gguf

    _, path, _ = resolve_gguf(args.model)
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False)
    t0 = time.perf_counter()
    table, ends = llama_vocabulary(llm)  # what the SDK's llama.cpp backend reads
    index = TokenIndex(table, ends)
    index_s = time.perf_counter() - t0
    if plain_text:
        grammar = parse_structured_outputs(schema)
        gbnf = LlamaGrammar.from_string(gbnf_text, verbose=False)
    else:
        fmt = {"type": "json_schema", "json_schema": {"name": args.schema, "schema": schema}}
        grammar = parse_response_format(fmt)
        gbnf = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    names = ("ours", "gbnf", "plain")
    sides: dict[str, dict[str, float]] = {s: {"tokens": 0, "seconds": 0.0, "valid": 0} for s in names}
    cold: list[float] = []
    warm: list[float] = []
    for k, text_in in enumerate(texts[:args.prompts]):
        messages: Any = [{"role": "system", "content": system}, {"role": "user", "content": text_in}]
        order = names[k % 3:] + names[:k % 3]
        for side in order:
            extra: dict[str, Any] = {}
            masker = None
            if side == "ours":
                masker = Masker(index, grammar)
                extra["logits_processor"] = LogitsProcessorList([masker])
            elif side == "gbnf":
                extra["grammar"] = gbnf
            llm.reset()
            t = time.perf_counter()
            out: Any = llm.create_chat_completion(messages, max_tokens=args.max_tokens, temperature=0.0,
                                                  seed=0, **extra)
            sides[side]["seconds"] += time.perf_counter() - t
            sides[side]["tokens"] += out["usage"]["completion_tokens"]
            text = out["choices"][0]["message"]["content"] or ""
            ended = out["choices"][0]["finish_reason"] == "stop"
            sides[side]["valid"] += ended and valid(text, schema)
            if masker is not None:
                (cold if k == 0 else warm).extend(masker.times)
            if not args.json:
                print(f"{side:4} {out['choices'][0]['finish_reason']:6} {text!r}", file=sys.stderr)
    llm.close()
    rate = {s: v["tokens"] / v["seconds"] if v["seconds"] else None for s, v in sides.items()}
    result = {
        "model": args.model, "schema": args.schema, "prompts": args.prompts, "max_tokens": args.max_tokens,
        "threads": args.threads,
        "vocab_size": index.vocab_size, "index_s": round(index_s, 3),
        "ours_tok_s": rate["ours"], "gbnf_tok_s": rate["gbnf"], "plain_tok_s": rate["plain"],
        "ours_over_gbnf": rate["ours"] / rate["gbnf"] if rate["ours"] and rate["gbnf"] else None,
        "ours_over_plain": rate["ours"] / rate["plain"] if rate["ours"] and rate["plain"] else None,
        "gbnf_over_plain": rate["gbnf"] / rate["plain"] if rate["gbnf"] and rate["plain"] else None,
        # seconds per call (a plain-text answer is a token or a few: the prompt's prefill is most of it)
        "ours_call_s": round(sides["ours"]["seconds"] / args.prompts, 4),
        "gbnf_call_s": round(sides["gbnf"]["seconds"] / args.prompts, 4),
        "plain_call_s": round(sides["plain"]["seconds"] / args.prompts, 4),
        "ours_valid": int(sides["ours"]["valid"]), "gbnf_valid": int(sides["gbnf"]["valid"]),
        "plain_valid": int(sides["plain"]["valid"]),
        "mask_cold_ms": 1000 * sum(cold) / len(cold) if cold else None,
        "mask_warm_ms": 1000 * sum(warm) / len(warm) if warm else None,
    }
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
