"""A token longer than 32 bytes reaches the answer whole on llama.cpp. llama-cpp-python's
``detokenize`` reads each token into a 32-byte buffer and dropped a longer one without a word, so
an answer on the device lost its runs of spaces, dashes or hashes (SmolLM2 has 47 such tokens:
deep indentation in code, separator lines in Markdown)."""

from __future__ import annotations

import pytest

from hybridllm import GenerationParams

pytestmark = pytest.mark.real

RULE = "#" * 64


def test_a_separator_line_of_one_64_byte_token_is_streamed_whole(smollm2_path) -> None:
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.prompts import llama_bytes

    backend = LlamaCppBackend("smollm2-135m-instruct", n_ctx=512, n_threads=1)
    try:
        llm = backend._llm
        [rule_id] = llm.tokenize(RULE.encode(), add_bos=False, special=False)  # one token, 64 bytes
        assert llama_bytes(llm, [rule_id]) == RULE.encode()
        # an answer that opens with separator lines goes on with more of them (greedy: four lines
        # of one 64-byte token and a newline each)
        lines = f"{RULE}\n{RULE}\n{RULE}"
        params = GenerationParams(max_tokens=8, temperature=0.0)
        deltas = list(backend.stream_continuation([{"role": "user", "content": lines}],
                                                  lines + "\n", params))
    finally:
        backend.close()
    text = "".join(d.text for d in deltas)
    assert text.count(RULE) >= 2, repr(text)  # was "\n\n\n\n": each 64-byte token dropped
    assert set(text) <= {"#", "\n"}, repr(text)
