"""Reference logits from llama.cpp on the same GGUF file, one token per decode call.

(llama-cpp-python 0.3.36 crashes on multi-token batches that request logits on this machine,
so the reference decodes token by token, which is also exactly llama.cpp's generation path.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class LlamaCppReference:
    def __init__(self, path: Path, n_ctx: int = 512) -> None:
        import llama_cpp

        self._lib = llama_cpp
        from hybridllm._cpus import usable_cpus

        # every usable CPU (llama.cpp's default is half of them): a thread computes whole rows of
        # a matmul, so the logits are bitwise the same for any count (measured: 1 vs 2 threads on
        # both models), and the 20 prompts' decodes take 13 s, not 18 (SmolLM2), 25 s, not 39 (Gemma)
        cpus = usable_cpus()
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, verbose=False, n_threads=cpus, n_threads_batch=cpus
        )
        self._ctx = self.llm._ctx.ctx
        self.n_vocab = self.llm.n_vocab()
        self._batch = llama_cpp.llama_batch_init(1, 0, 1)

    def close(self) -> None:
        self._lib.llama_batch_free(self._batch)

    def _decode(self, token: int, pos: int) -> np.ndarray:
        b = self._batch
        b.token[0], b.pos[0], b.n_seq_id[0], b.logits[0], b.n_tokens = token, pos, 1, 1, 1
        b.seq_id[0][0] = 0
        if self._lib.llama_decode(self._ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        ptr = self._lib.llama_get_logits_ith(self._ctx, 0)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def greedy(self, prompt_ids: list[int], num_tokens: int) -> tuple[list[int], np.ndarray]:
        """llama.cpp's greedy continuation and its logits at each continuation step.

        Returns (continuation ids [num_tokens], logits [num_tokens, vocab]) where logits[i] is
        the distribution that chose continuation[i].
        """
        mem = self._lib.llama_get_memory(self._ctx)
        self._lib.llama_memory_clear(mem, True)
        logits = None
        for pos, tok in enumerate(prompt_ids):
            logits = self._decode(tok, pos)
        out_ids, out_logits = [], []
        for i in range(num_tokens):
            out_logits.append(logits)
            nxt = int(np.argmax(logits))
            out_ids.append(nxt)
            if i + 1 < num_tokens:
                logits = self._decode(nxt, len(prompt_ids) + i)
        return out_ids, np.stack(out_logits)
