"""The ONNX Runtime GenAI edge backend on the real SmolLM2 model, prepared from its GGUF.

The int4 folder is built once per session into the session's empty HYBRIDLLM_HOME (about 17 s on
2 cores); every later use finds it.
"""

from __future__ import annotations

import itertools
import json
import threading

import pytest

pytest.importorskip("onnxruntime_genai")

from hybridllm import GenerationParams, ModelNotFoundError  # noqa: E402

pytestmark = pytest.mark.real
MODEL = "smollm2-135m-instruct"
GREEDY = {"temperature": 0.0, "seed": 7}
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def folder():
    from hybridllm.models.onnx_prepare import prepare_onnx

    return prepare_onnx(MODEL)


@pytest.fixture(scope="module")
def edge(folder):
    from hybridllm.backends.onnx import OnnxBackend

    backend = OnnxBackend(MODEL, n_ctx=2048)
    yield backend
    backend.close()


def _params(**kw):
    return GenerationParams(**{"max_tokens": 48, **GREEDY, **kw})


def test_prepared_folder_is_complete_and_self_describing(folder):
    from hybridllm.models.onnx_store import onnx_dir

    assert folder == onnx_dir(MODEL, "int4")
    for name in ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json"):
        assert (folder / name).is_file(), name
    meta = json.loads((folder / "hybridllm.json").read_text())
    assert meta["model_id"] == MODEL and meta["precision"] == "int4"
    assert meta["quantization"]["block_size"] == "32" and meta["chat_template"]
    assert meta["quantization"]["weights"] == "gguf blocks" and meta["quantization"]["matmul_4bit"] > 100
    assert not [p.name for p in folder.parent.iterdir() if p.name.endswith((".tmp", ".old", ".log"))]


def test_loaded_weights_are_advised_onto_huge_pages(edge):
    import sys
    from pathlib import Path

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if sys.platform != "linux" or not thp.is_file() or "[never]" in thp.read_text():
        pytest.skip("transparent huge pages are Linux-only and on here")
    assert edge.huge_page_bytes > 50 * 2**20  # SmolLM2's repacked weights: about 170 MB


def test_capital_of_france(edge):
    g = edge.generate(FRANCE, _params())
    assert "Paris" in g.text
    assert g.finish_reason == "stop" and g.usage.prompt_tokens == edge.count_tokens(FRANCE)
    assert 0 < g.usage.completion_tokens < 48


def test_greedy_tokens_match_the_runtimes_own_search(edge, folder):
    import onnxruntime_genai as og

    ids = edge.tokenize(FRANCE)
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 24, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    ref = []
    while len(ref) < 24:
        gen.generate_next_token()
        ref.append(int(gen.get_next_tokens()[0]))
        if ref[-1] in edge._eos_ids:
            ref.pop()
            break
    g = edge.generate(FRANCE, _params(max_tokens=24))
    assert edge.tokenize(FRANCE, prefix=g.text)[len(ids) :] == ref
    assert g.usage.completion_tokens == len(ref)


def test_stream_is_token_by_token_and_equals_generate(edge):
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three primary colours."},
    ]
    full = edge.generate(msgs, _params(max_tokens=40))
    deltas = list(edge.stream(msgs, _params(max_tokens=40)))
    assert len([d for d in deltas if d.text]) > 3
    assert "".join(d.text for d in deltas) == full.text
    assert deltas[-1].finish_reason == full.finish_reason and deltas[-1].usage == full.usage


def test_max_tokens(edge):
    g = edge.generate(
        [{"role": "user", "content": "Tell me a long story about a dragon."}], _params(max_tokens=5)
    )
    assert g.usage.completion_tokens == 5 and g.finish_reason == "length"


def test_seed_repeats_and_temperature_varies(edge):
    msgs = [{"role": "user", "content": "Write one sentence about cats."}]
    hot = {"max_tokens": 20, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    a = edge.generate(msgs, GenerationParams(seed=11, **hot)).text
    assert a == edge.generate(msgs, GenerationParams(seed=11, **hot)).text
    others = {edge.generate(msgs, GenerationParams(seed=s, **hot)).text for s in range(12, 16)}
    greedy = edge.generate(msgs, _params(max_tokens=20)).text
    assert len(others | {a}) >= 3 and others != {greedy}


def test_top_k_one_is_greedy_at_any_temperature(edge):
    # temperature 0 takes the argmax; top_k=1 keeps one candidate and draws it at any temperature
    greedy = list(edge.stream(FRANCE, _params(max_tokens=16, logprobs=True)))
    sampled = list(edge.stream(FRANCE, GenerationParams(
        max_tokens=16, temperature=1.5, top_k=1, seed=3, logprobs=True)))
    assert [d.text for d in sampled] == [d.text for d in greedy]
    assert [d.logprob for d in sampled] == pytest.approx([d.logprob for d in greedy], abs=1e-5)


def test_stop_string_cuts_without_leaking_a_partial_match(edge):
    full = edge.generate(FRANCE, _params()).text
    assert "Paris" in full
    cut = edge.generate(FRANCE, _params(stop=("Paris",)))
    assert cut.text == full[: full.index("Paris")] and cut.finish_reason == "stop"
    pieces = [d.text for d in edge.stream(FRANCE, _params(stop=("Paris",)))]
    assert not any("P" in p for p in pieces)  # "Par" was held back, never sent


def test_text_held_for_a_stop_string_is_kept_when_the_model_ends(edge):
    """A stop string that starts with the answer's last character holds that character back; the
    model then ends (EOS), the stop string never came, so the character is the answer's own
    (before: it was lost, "...Paris." came back as "...Paris")."""
    full = edge.generate(FRANCE, _params())
    assert full.finish_reason == "stop" and full.text.endswith(".")  # ended by EOS, not the limit
    params = _params(stop=(".\u2603", "zz"))
    held = edge.generate(FRANCE, params)
    assert held.text == full.text and held.finish_reason == "stop" and held.usage == full.usage
    assert "".join(d.text for d in edge.stream(FRANCE, params)) == full.text


def test_an_endoftext_token_ends_the_answer_as_on_llama_cpp(edge, smollm2_path, monkeypatch):
    """SmolLM2's genai_config names <|im_end|> only; llama.cpp also ends on <|endoftext|> (and Qwen
    writes either). When the model drew <|endoftext|>, ONNX went on writing past it."""
    from llama_cpp import llama_cpp as C

    from hybridllm.backends import onnx
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    ref = LlamaCppBackend(str(smollm2_path), n_ctx=256, n_threads=1)
    try:
        endoftext = int(ref._llm.tokenize(b"<|endoftext|>", add_bos=False, special=True)[0])
        assert C.llama_vocab_is_eog(ref._llm._model.vocab, endoftext)
    finally:
        ref.close()
    first3 = edge.generate(FRANCE, _params(max_tokens=3))
    real_sample = onnx._sample
    monkeypatch.setattr(onnx, "_sample", lambda row, params, seed, step, recent: (
        endoftext if step == 3 else real_sample(row, params, seed, step, recent)))
    g = edge.generate(FRANCE, _params())
    assert (g.text, g.finish_reason, g.usage.completion_tokens) == (first3.text, "stop", 3)


def test_a_character_cut_by_max_tokens_is_dropped_not_replaced(edge):
    """SmolLM2 writes each emoji as 3 byte tokens; an answer cut inside one ends before it (no
    U+FFFD), and the streamed pieces join to exactly the final text, as on llama.cpp."""
    emoji = [{"role": "user", "content": "Reply only with emojis: 🎉🔥😀🚀"}]
    full = edge.generate(emoji, _params(max_tokens=12)).text
    assert sum(ord(ch) > 0xFFFF for ch in full) >= 3, full
    texts = [""]
    for n in range(1, 10):
        g = edge.generate(emoji, _params(max_tokens=n))
        streamed = "".join(d.text for d in edge.stream(emoji, _params(max_tokens=n)))
        assert "\ufffd" not in g.text and full.startswith(g.text) and streamed == g.text, (n, g.text)
        assert g.finish_reason == "length" and g.usage.completion_tokens == n
        texts.append(g.text)
    assert sum(a == b for a, b in zip(texts, texts[1:], strict=False)) >= 3, texts  # cut inside ones


def test_logprobs_are_the_models_own(edge):
    g = edge.generate(FRANCE, _params(logprobs=True))
    lps = [d.logprob for d in edge.stream(FRANCE, _params(logprobs=True)) if d.logprob is not None]
    assert len(lps) == g.usage.completion_tokens and all(lp <= 0 for lp in lps)
    assert g.mean_logprob == pytest.approx(sum(lps) / len(lps))
    # greedy picks the argmax, whose probability is at least that of any other token: > 1/vocab
    assert min(lps) > -10.8 and max(lps) > -0.05


def test_leaving_the_loop_stops_generation(edge):
    prompt = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    n_prompt = edge.count_tokens(prompt)
    stream = edge.stream(prompt, _params(max_tokens=200))
    first = next(d for d in stream if d.text)
    assert first.text
    stream.close()
    assert len(edge._cached) <= n_prompt + 1  # no token ran after the one the caller saw


def test_continuation_finishes_a_broken_answer(edge):
    full = edge.generate(FRANCE, _params()).text
    prefix = full[: full.index(" Paris")]  # a stream breaks between tokens: "...is" | " Paris"
    rest = "".join(d.text for d in edge.stream_continuation(FRANCE, prefix, _params()))
    assert (prefix + rest).strip() == full.strip()


def _shared_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_two_interleaved_streams_do_not_corrupt_each_other(edge):
    # Interleaving re-prefills each stream's tokens in chunks, and int4 kernels round a chunk a
    # little differently from one token at a time, so a near-tie late in an answer may flip; a
    # stream reading the other's cache would go wrong within the first tokens instead.
    a_msgs = FRANCE
    b_msgs = [{"role": "user", "content": "Name five animals that live in the ocean."}]
    a_ref = edge.generate(a_msgs, _params(max_tokens=24)).text
    b_ref = edge.generate(b_msgs, _params(max_tokens=24)).text
    sa, sb = edge.stream(a_msgs, _params(max_tokens=24)), edge.stream(b_msgs, _params(max_tokens=24))
    a, b = [], []
    for da, db in itertools.zip_longest(sa, sb):  # one step of each in turn
        a.append(da.text if da else "")
        b.append(db.text if db else "")
    results = {"a": "".join(a), "b": "".join(b)}
    threaded = {}

    def run(key, msgs):
        threaded[key] = edge.generate(msgs, _params(max_tokens=24)).text

    threads = [threading.Thread(target=run, args=(k, m)) for k, m in (("a", a_msgs), ("b", b_msgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for got in (results, threaded):
        assert _shared_prefix(got["a"], a_ref) >= len(a_ref) // 2, (got["a"], a_ref)
        assert _shared_prefix(got["b"], b_ref) >= len(b_ref) // 2, (got["b"], b_ref)


def test_prompt_longer_than_the_context_is_refused(folder):
    from hybridllm import InvalidRequestError
    from hybridllm.backends.onnx import OnnxBackend

    small = OnnxBackend(str(folder), n_ctx=64)
    try:
        assert small.model == MODEL  # the folder's record names its catalog model
        with pytest.raises(InvalidRequestError, match="context holds 64"):
            list(small.stream([{"role": "user", "content": "word " * 100}], _params()))
    finally:
        small.close()


def test_unprepared_model_on_a_light_install_names_the_command(tmp_path, monkeypatch):
    from hybridllm.backends.onnx import OnnxBackend
    from hybridllm.models import onnx_store

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    monkeypatch.setattr(onnx_store, "missing_export_modules", lambda: ["torch", "transformers"])
    with pytest.raises(ModelNotFoundError) as err:
        OnnxBackend(MODEL)
    text = str(err.value)
    assert f"hybridllm models prepare {MODEL} --backend onnx" in text
    assert str(tmp_path / "models" / MODEL / "onnx-int4-cpu") in text and "[export]" in text
    assert not (tmp_path / "models" / MODEL).exists()  # nothing half-made


def test_a_gguf_path_is_pointed_to_llama_cpp(smollm2_path):
    from hybridllm.backends.onnx import OnnxBackend

    with pytest.raises(ModelNotFoundError, match="llama.cpp backend"):
        OnnxBackend(str(smollm2_path))


def test_cli_ask_with_the_onnx_backend_answers_paris(folder, capsys, monkeypatch):
    # the whole pipeline: a cloud is configured (unreachable) so the router decides, the edge
    # answers on ONNX, the cache stores the answer and serves the repeat
    from hybridllm.cli import main

    monkeypatch.setenv("HYBRIDLLM_CLOUD_URL", "http://127.0.0.1:9")
    argv = [
        "ask",
        "--backend",
        "onnx",
        "--temperature",
        "0",
        "--max-tokens",
        "32",
        "What is the capital of France?",
    ]
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Paris" in out.out
    assert "edge" in out.err and MODEL in out.err  # the trace line: route edge, this model
    assert main(argv) == 0
    again = capsys.readouterr()
    assert "Paris" in again.out and "cache hit" in again.err
