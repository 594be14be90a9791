"""Structured output (OpenAI ``response_format``) in the engine, on a tiny random model whose
vocabulary is JSON pieces (no weights on disk).

Every output of a ``json_object`` request parses to a dict, and every output of a ``json_schema``
request parses and fits the schema (checked here by hand and by ``Grammar.validate``), greedy and
sampled, alone and batched with plain requests, with penalties, with logprobs (which stay the raw
model's), and with speculative decoding (each draft position masked at its own grammar state: the
greedy output is the one without speculation, a sampled one keeps the masked distribution).
Requests without a format take the old path: no mask is computed for them. Before,
SamplingParams had no response_format.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.spec_decode.draft import DraftProposer
from cloud_server.exceptions import InvalidRequestError
from cloud_server.models.config import ModelConfig
from cloud_server.models.loader import assemble_model, convert_weights
from hybridllm._structured import parse_response_format

from ._tiny_model import CPU, tiny_runner, tiny_weights
from .test_fuzz_fake_batching8 import BS, check_invariants, make_engine

# the tiny model's vocabulary: two control tokens, then pieces of JSON text (a two-byte letter and
# its two bytes apart among them, so a character may span tokens)
PIECES = ["<eos>", "<bos>", "{", "}", "[", "]", ":", ",", '"', " ", "\n", *"0123456789", "-", ".", "+",
          *"abcdefghijklmnopqrstuvwxyz", "true", "false", "null", '": ', '"}', '{"', '", "', "},", "],",
          "name", "age", "color", "red", "green", "blue", "flags", "inner", "ok", "note", " }", "é",
          b"\xc3", b"\xa9", "\\", "\\n", "E", "A", "Z", "}}", "]}", "[]", "{}", "10", "true,"]
EOS, BOS = 0, 1
V = len(PIECES)
NUM_BLOCKS = 256
MAX_LEN = 320


def _piece_bytes(i: int) -> bytes:
    p = PIECES[i]
    return p if isinstance(p, bytes) else p.encode("utf-8")


class JsonTokenizer:
    """Ids are PIECES; ``encode`` takes the longest piece at each point (text prompts, the API)."""

    eos_token_ids = [EOS]
    vocab_size = V

    def decode(self, ids: list[int]) -> str:
        return b"".join(_piece_bytes(i) for i in ids if 2 <= i < V).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return _piece_bytes(token_id) if 2 <= token_id < V else b""

    def structured_token_bytes(self) -> list[bytes | None]:
        return [None, None, *(_piece_bytes(i) for i in range(2, V))]

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        data, ids, at = text.encode("utf-8"), [BOS] if add_special else [], 0
        while at < len(data):
            best = max((i for i in range(2, V) if data.startswith(_piece_bytes(i), at)),
                       key=lambda i: len(_piece_bytes(i)), default=None)
            if best is None:  # a byte no piece starts with: a space
                best, at = PIECES.index(" "), at + 1
            else:
                at += len(_piece_bytes(best))
            ids.append(best)
        return ids

    def encode_chat(self, messages: list[dict[str, str]], **_: Any) -> list[int]:
        return self.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:")

    def stop_strings(self, messages: list[dict[str, str]]) -> tuple[str, ...]:
        return ()


CFG = ModelConfig("llama", V, 32, 48, 1, 4, 2, 8)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", "blue"]},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        "note": {"type": "string", "maxLength": 4},
    },
    "required": ["name", "age", "color", "flags", "inner"],
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
JSON_OBJECT = {"type": "json_object"}


def fits_schema(value: Any) -> bool:
    """SCHEMA checked by hand (not by the grammar core)."""
    if not isinstance(value, dict) or not {"name", "age", "color", "flags", "inner"} <= set(value):
        return False
    if not set(value) <= {"name", "age", "color", "flags", "inner", "note"}:
        return False
    inner, flags = value["inner"], value["flags"]
    return (isinstance(value["name"], str) and len(value["name"]) <= 6
            and isinstance(value["age"], int) and not isinstance(value["age"], bool)
            and value["color"] in ("red", "green", "blue")
            and isinstance(flags, list) and len(flags) <= 3 and all(isinstance(f, bool) for f in flags)
            and isinstance(inner, dict) and set(inner) == {"ok"} and isinstance(inner["ok"], bool)
            and (not isinstance(value.get("note"), str) or len(value["note"]) <= 4)
            and ("note" not in value or isinstance(value["note"], str)))


def json_model(scale: float = 1.0, seed: int = 0):
    weights = convert_weights(tiny_weights(CFG, scale=scale, seed=seed), device=CPU, dtype=torch.float32,
                              quantization="none")
    return assemble_model(CFG, weights, device=CPU, dtype=torch.float32, max_position=MAX_LEN)


def json_engine(scale: float = 1.0, seed: int = 0, *, draft: bool = False, method: str | None = None,
                num_blocks: int = NUM_BLOCKS):
    """``make_engine``'s engine (every part real) on a tiny random model of the JSON vocabulary."""
    model = json_model(scale, seed)
    eng = make_engine(num_blocks, max_num_seqs=8, budget=256)
    eng.tokenizer = JsonTokenizer()
    eng.model_config = CFG
    eng.max_model_len = eng.spec.max_model_len = min(MAX_LEN, num_blocks * BS)
    eng.runner = tiny_runner(model, CFG, num_blocks=num_blocks, block_size=BS)
    eng.spec.method = method
    if draft:  # the model drafting for itself
        eng.spec.draft = DraftProposer(tiny_runner(model, CFG, num_blocks=num_blocks, block_size=BS))
    return eng


def run(eng, requests: list[tuple[str, list[int], SamplingParams]]) -> dict[str, Any]:
    """Each request's (text, token ids, finish reason, logprob entries)."""
    got: dict[str, Any] = {rid: ["", [], None, []] for rid, _, _ in requests}
    for rid, prompt, params in requests:
        eng.add_request(rid, prompt, params)
    for _ in range(2000):
        if not eng.has_unfinished():
            break
        for out in eng.step():
            g = got[out.request_id]
            g[0] += out.delta_text
            g[1] += out.delta_token_ids
            g[2] = out.finish_reason if out.finished else None
            g[3] += out.logprobs or []
            assert out.error is None, out.error
        check_invariants(eng)
    assert not eng.has_unfinished()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return got


PROMPTS = [[BOS, 2, 44, 9], [BOS, 11, 12, 13, 9, 50], [BOS, 60, 61, 62], [BOS, 8, 30, 31, 8, 6]]


def _params(fmt: dict | None, **kw: Any) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 280, "response_format": fmt, **kw})


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_json_object_greedy_and_sampled_outputs_parse_to_dicts(scale: float) -> None:
    eng = json_engine(scale)
    reqs = [(f"g{i}", p, _params(JSON_OBJECT)) for i, p in enumerate(PROMPTS)]
    reqs += [(f"s{i}-{seed}", p, _params(JSON_OBJECT, temperature=1.0, seed=seed))
             for i, p in enumerate(PROMPTS) for seed in range(2)]
    reqs += [("plain", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))]
    got = run(eng, reqs)
    stopped = 0
    for rid, _, _ in reqs[:-1]:
        text, _, reason, _ = got[rid]
        if reason == "length" and rid.startswith("s"):
            # a random model sampled at temperature 1 may wander in a string past max_tokens:
            # what it wrote is still a prefix the grammar takes
            assert parse_response_format(JSON_OBJECT).matcher().feed(text.encode()), (rid, text)
            continue
        assert reason == "stop", (rid, text)
        assert isinstance(json.loads(text), dict), (rid, text)
        stopped += 1
    assert stopped >= len(reqs[:-1]) * 3 // 4, stopped  # most end, every greedy one among them
    # the plain request beside them is no JSON: nothing constrained it
    plain = got["plain"][0]
    with pytest.raises(ValueError):
        json.loads(plain)


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_json_schema_outputs_fit_the_schema(scale: float) -> None:
    from hybridllm._structured import parse_response_format

    grammar = parse_response_format(JSON_SCHEMA)
    eng = json_engine(scale, seed=1)
    reqs = [(f"g{i}", p, _params(JSON_SCHEMA)) for i, p in enumerate(PROMPTS)]
    reqs += [(f"s{i}-{seed}", p, _params(JSON_SCHEMA, temperature=1.2, top_p=0.95, seed=seed))
             for i, p in enumerate(PROMPTS) for seed in range(2)]
    # penalties and a bias act inside the grammar's tokens, never outside them
    reqs += [("pen", PROMPTS[1], _params(JSON_SCHEMA, repetition_penalty=1.8, frequency_penalty=1.0,
                                          logit_bias={PIECES.index("red"): -50.0, EOS: 100.0}))]
    got = run(eng, reqs)
    for rid, _, _ in reqs:
        text, _, reason, _ = got[rid]
        assert reason == "stop", (rid, text)
        value = json.loads(text)
        assert fits_schema(value), (rid, text)
        assert grammar.validate(text), (rid, text)
        assert list(value)[:5] == ["name", "age", "color", "flags", "inner"]  # the schema's order
    assert got["pen"][0] and json.loads(got["pen"][0])["color"] != "red"


def test_a_seed_repeats_its_structured_output_whatever_it_is_batched_with() -> None:
    p = _params(JSON_SCHEMA, temperature=1.0, seed=7)
    alone = run(json_engine(0.5), [("a", PROMPTS[2], p)])["a"][0]
    eng = json_engine(0.5)
    mixed = run(eng, [("x", PROMPTS[0], _params(JSON_OBJECT, temperature=1.0)), ("a", PROMPTS[2], p),
                      ("y", PROMPTS[1], SamplingParams(max_tokens=30))])["a"][0]
    assert alone == mixed and json.loads(alone)


def test_preempted_structured_requests_give_what_they_give_alone() -> None:
    """A pool too small for the batch preempts requests and recomputes them; each one's matcher
    stays at the end of its output, so its answer is the one it gives alone (greedy with prompt
    lookup on; seeded sampled ones without it, since drafts move a seed's draws with the batch)."""
    reqs = [(f"r{i}", p, _params(JSON_SCHEMA if i % 2 else JSON_OBJECT, max_tokens=120, **(
        {"temperature": 1.0, "seed": i, "speculative_method": "none"} if i > 3 else {})))
            for i, p in enumerate(PROMPTS * 2)]
    alone = {rid: run(json_engine(1.0, method="ngram"), [(rid, p, params)])[rid] for rid, p, params in reqs}
    eng = json_engine(1.0, method="ngram", num_blocks=48)
    assert run(eng, reqs) == alone
    assert eng.scheduler.num_preemptions > 0


def test_logprobs_stay_the_raw_models() -> None:
    """The reported log-probability of each token is log_softmax of the unmasked logits (as for
    penalties): a token the grammar forces still shows the model's own, often low, figure."""
    eng = json_engine(1.0)
    text, ids, reason, entries = run(eng, [("lp", PROMPTS[0], _params(JSON_SCHEMA, logprobs=2))])["lp"]
    assert reason == "stop" and fits_schema(json.loads(text))
    every = eng.score(PROMPTS[0] + ids)  # [n, V]: row j predicts token j + 1
    raw = torch.log_softmax(every[len(PROMPTS[0]) - 1 :].float(), dim=-1)
    assert len(entries) == len(ids)
    below = 0
    for j, (tok, entry) in enumerate(zip(ids, entries, strict=True)):
        assert math.isclose(entry.logprob, float(raw[j, tok]), rel_tol=1e-4, abs_tol=1e-5)
        below += entry.logprob < float(raw[j].max()) - 1e-6
    assert below > 0  # the mask moved some tokens off the raw argmax; their figures stay raw


def test_ignore_eos_still_ends_at_the_end_of_the_value() -> None:
    eng = json_engine(1.0)
    text, ids, reason, _ = run(eng, [("e", PROMPTS[3], _params(JSON_OBJECT, ignore_eos=True))])["e"]
    assert reason == "stop" and isinstance(json.loads(text), dict)
    assert ids.count(EOS) <= 1 and (EOS not in ids or ids[-1] == EOS)


def test_a_finished_value_with_no_eos_ends_with_stop() -> None:
    """A value nothing may follow (the whitespace run after it spent too), with no EOS in the
    index, ends the request there ("stop")."""
    eng = json_engine(1.0)
    eng.tokenizer.eos_token_ids = []  # an instance attribute: this engine's tokenizer only
    text, ids, reason, _ = run(eng, [("n", PROMPTS[1], _params({"type": "json_schema", "json_schema": {
        "name": "c", "schema": {"enum": ["red", "green"]}}}))])["n"]
    assert reason == "stop" and json.loads(text) in ("red", "green") and EOS not in ids


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_on_gives_the_greedy_text_of_speculation_off(method: str) -> None:
    """Structured requests draft too (prompt lookup's proposals cut where the grammar refuses
    one; the model drafting for itself unmasked), each verified position masked as a plain decode
    masks it: the greedy outputs are those without speculation, and drafts were accepted."""
    def reqs(spec: str | None):
        return [(f"j{i}", p, _params(JSON_SCHEMA if i % 2 else JSON_OBJECT, speculative_method=spec,
                                     num_speculative_tokens=3)) for i, p in enumerate(PROMPTS)]

    plain = [("plain", [BOS, 2, 3, 2, 3, 2, 3, 2],
              SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))]
    off = run(json_engine(1.0), reqs("none") + plain)
    eng = json_engine(1.0, draft=method == "draft", method=method)
    assert run(eng, reqs(None)) == {k: v for k, v in off.items() if k != "plain"}  # the server's method
    stats = eng.spec.stats.snapshot()  # structured requests alone drafted, and drafts were accepted
    assert stats["spec_decode_num_draft_tokens"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0
    for i in range(len(PROMPTS)):
        assert isinstance(json.loads(off[f"j{i}"][0]), dict)
    eng = json_engine(1.0, draft=method == "draft", method=method)  # beside a plain request too
    assert run(eng, reqs(None) + plain) == off


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_through_the_rejection_rule_keeps_the_masked_distribution(method: str) -> None:
    """top_k 1 makes the masked distribution one token: sampled through the rejection rule with
    drafts, the output must be the masked greedy one; a seeded sampled request repeats itself
    under speculation and its output fits the schema."""
    greedy = run(json_engine(1.0), [(f"g{i}", p, _params(JSON_SCHEMA)) for i, p in enumerate(PROMPTS)])
    eng = json_engine(1.0, draft=method == "draft", method=method)
    one = run(eng, [(f"g{i}", p, _params(JSON_SCHEMA, temperature=1.0, top_k=1, seed=i))
                    for i, p in enumerate(PROMPTS)])
    assert {k: v[:3] for k, v in one.items()} == {k: v[:3] for k, v in greedy.items()}
    assert eng.spec.stats.snapshot()["spec_decode_num_accepted_tokens"] > 0
    sampled = [("s", PROMPTS[1], _params(JSON_SCHEMA, temperature=1.0, seed=3, num_speculative_tokens=2))]
    first = run(json_engine(1.0, draft=method == "draft", method=method), sampled)["s"]
    again = run(json_engine(1.0, draft=method == "draft", method=method), sampled)["s"]
    assert first == again and fits_schema(json.loads(first[0]))


def test_prompt_lookup_drafts_stop_where_the_grammar_refuses() -> None:
    from cloud_server.engine.structured import grammar_prefix
    from hybridllm._structured import parse_response_format

    eng = json_engine(1.0)
    index = eng._structured_index()
    m = parse_response_format(JSON_OBJECT).matcher()
    ids = {p: PIECES.index(p) for p in ['{"', "a", '": ', "1", "}", ",", "]"]}
    drafts = [ids['{"'], ids["a"], ids['": '], ids["1"], ids["]"], ids["}"]]
    assert grammar_prefix(index, m, drafts) == drafts[:4]  # "]" cannot follow {"a": 1
    assert grammar_prefix(index, m, drafts[:4] + [ids["}"], ids[","]]) == drafts[:4] + [ids["}"]]  # the end
    assert m.done is False  # the request's own matcher is not moved


def test_rows_without_a_format_compute_no_mask(monkeypatch) -> None:
    """Once a structured request built the index, plain requests still cost no mask: the index's
    ``allowed`` is called for structured rows only, and a batch of plain rows takes the sampler's
    path without the grammar step."""
    from cloud_server.layers import sampler as sampler_mod

    eng = json_engine(1.0)
    run(eng, [("j", PROMPTS[0], _params(JSON_OBJECT))])
    index = eng.runner.token_index
    assert index is not None
    calls: list[int] = []

    class Counting:
        def allowed(self, matcher: Any) -> Any:
            calls.append(1)
            return index.allowed(matcher)

    eng.runner.token_index = Counting()
    masked: list[int] = []
    real_mask = sampler_mod._grammar_mask
    monkeypatch.setattr(sampler_mod, "_grammar_mask", lambda lg, ms: masked.append(1) or real_mask(lg, ms))
    plain = [("p", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))]
    before = run(json_engine(1.0), plain)
    assert run(eng, plain) == before and not calls and not masked
    run(eng, [("k", PROMPTS[2], _params(JSON_OBJECT))])
    assert calls and masked  # the counters do count a structured request


def test_the_index_is_built_at_the_first_structured_request_only() -> None:
    eng = json_engine(1.0)
    run(eng, [("p", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=4))])
    assert eng.runner.token_index is None  # no structured request: no index
    run(eng, [("j", PROMPTS[1], _params(JSON_OBJECT))])
    index = eng.runner.token_index
    assert index is not None and index.vocab_size == V
    run(eng, [("k", PROMPTS[2], _params(JSON_SCHEMA))])
    assert eng.runner.token_index is index  # built once


@pytest.mark.parametrize(("fmt", "param"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}},
     "response_format.json_schema.schema.pattern"),
    ({"type": "xml"}, "response_format.type"),
    ("json", "response_format"),
])
def test_a_format_the_core_refuses_names_its_field(fmt: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(response_format=fmt)
    assert err.value.param is not None and err.value.param.startswith(param.split(".pattern")[0])


def test_text_is_no_constraint_and_a_grammar_passes_through() -> None:
    from hybridllm._structured import parse_response_format

    assert SamplingParams(response_format={"type": "text"}).response_format is None
    grammar = parse_response_format(JSON_OBJECT)
    assert SamplingParams(response_format=grammar).response_format is grammar
    assert SamplingParams(response_format=JSON_OBJECT).response_format.key == grammar.key


@pytest.mark.parametrize("style", ["strip", "metaspace", "bytelevel"])
def test_hf_tokenizers_give_each_tokens_bytes_as_an_answer_reads_them(style: str, tmp_path) -> None:
    """The index's token bytes of a Hugging Face tokenizer (byte-level BPE, SentencePiece with
    byte fallback): a text's tokens joined are the text as it reads after a prompt, and the
    special tokens are None (never allowed, EOS aside)."""
    from cloud_server.models.tokenizer import HFTokenizer

    from .test_detok_space_review18 import _byte_level, _sentencepiece

    folder = _byte_level(tmp_path / "bl") if style == "bytelevel" else _sentencepiece(tmp_path / "sp", style)
    tok = HFTokenizer(folder)
    table = tok.structured_token_bytes()
    assert len(table) == tok.vocab_size
    for text in ["hello world", " {\"a\": 1}", "é ü 日本"]:
        ids = tok.encode(text, add_special=False)
        assert b"".join(table[i] or b"<none>" for i in ids) == tok.decode_continuation(ids).encode("utf-8")
    for i in tok.eos_token_ids:
        assert table[i] is None
