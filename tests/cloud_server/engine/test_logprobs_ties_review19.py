"""Top logprobs on ties are deterministic (review 19), no model.

``torch.topk`` returns equal values in its kernel's order, and picks which of the tokens tied at
the N-th place make the list by its own rule: a flat distribution of 50 tokens listed ids
35, 32, 33, 34, 31. Ties go lowest token id first now, the lowest ids taking the last places.
"""

from __future__ import annotations

import torch

from cloud_server.engine.logprobs import token_logprobs


def test_a_flat_distribution_lists_the_lowest_ids_in_order():
    rows = torch.zeros(1, 50).log_softmax(-1)
    (entry,) = token_logprobs(rows, [7], 5)
    assert [t for t, _ in entry.top] == [0, 1, 2, 3, 4]
    assert entry.token_id == 7 and abs(entry.logprob - rows[0, 7].item()) < 1e-9


def test_ties_inside_and_at_the_cut():
    rows = torch.tensor([[5.0, 1.0, 3.0, 3.0, 0.0, 3.0], [0.0, 2.0, 2.0, 9.0, 2.0, 2.0]]).log_softmax(-1)
    a, b = token_logprobs(rows, [3, 0], 3)
    assert [t for t, _ in a.top] == [0, 2, 3]  # 2, 3 and 5 tie for the last two places
    assert [t for t, _ in b.top] == [3, 1, 2]
    assert [v for _, v in b.top] == sorted((v for _, v in b.top), reverse=True)


def test_a_long_row_with_many_ties():
    pattern = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    rows = pattern.repeat(300).unsqueeze(0).repeat(2, 1).log_softmax(-1)
    for entry in token_logprobs(rows, [3, 1], 5):
        assert [t for t, _ in entry.top] == [1, 2, 4, 5, 6]
