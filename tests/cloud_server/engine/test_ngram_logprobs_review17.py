"""Prompt lookup on repeated text, and top logprobs with NaN (no model)."""

from __future__ import annotations

import math

import torch

from cloud_server.engine.logprobs import token_logprobs
from cloud_server.engine.spec_decode.ngram import propose_ngram


def test_ngram_copy_running_into_the_end_continues_with_its_period():
    # the latest match overlaps the suffix: before, only the tokens up to the end were proposed
    assert propose_ngram([7] * 10, 4) == [7, 7, 7, 7]
    assert propose_ngram([1, 2] * 5, 5) == [1, 2, 1, 2, 1]
    assert propose_ngram([1, 2, 3, 1, 2, 3], 8) == [1, 2, 3, 1, 2, 3, 1, 2]
    assert propose_ngram([5, 1, 2, 1], 4, fallback_k=3) == [2, 1, 2]  # the fallback too
    # unchanged: a copy that does not reach the end, no match, k 0, too short a text
    assert propose_ngram([5, 6, 7, 8, 9, 1, 6, 7, 3, 6, 7], 3) == [3, 6, 7]
    assert propose_ngram([1, 2, 3, 4], 3) == []
    assert propose_ngram([7] * 10, 0) == []
    assert propose_ngram([3, 3], 4) == []  # a bigram needs an earlier occurrence
    assert propose_ngram([3], 4) == [] and propose_ngram([], 4) == []


def _ids(entry):
    return [t for t, _ in entry.top]


def test_top_logprobs_match_topk_on_distinct_values_and_keep_nan():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(4, 1000, generator=g).log_softmax(dim=-1)
    vals, idx = rows.topk(7, dim=-1)
    entries = token_logprobs(rows, [1, 2, 3, 4], 7)
    for j, e in enumerate(entries):
        assert _ids(e) == idx[j].tolist() and [v for _, v in e.top] == vals[j].tolist()
        assert e.logprob == rows[j, e.token_id].item()
    (entry,) = token_logprobs(torch.full((1, 6), math.nan), [2], 3)  # overflowed logits
    assert len(entry.top) == 3 and all(math.isnan(v) for _, v in entry.top)
