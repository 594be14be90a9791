"""A fractional token count counts as the next whole token, never less (int() truncated it)."""

from __future__ import annotations

import numpy as np

from hybridllm.router.budget import Budget


def test_record_rounds_a_fraction_up() -> None:
    b = Budget(max_cloud_tokens_per_hour=10)
    b.record(2.9)
    b.record(np.float64(0.2))
    assert b.usage()["tokens_hour"] == 4  # was 2: 2.9 as 2, 0.2 as 0


def test_a_fraction_over_the_limit_spends_it() -> None:
    b = Budget(max_cloud_tokens_per_hour=10)
    b.record(9.5)  # 10 tokens billed: the budget is spent (was 9, one more call let through)
    assert b.exhausted() is not None


def test_reserve_and_settle_round_up() -> None:
    b = Budget(max_cloud_tokens_per_day=100)
    held, why = b.reserve(3.1)
    assert why is None and held is not None and held.tokens == 4
    b.settle(held, 7.01)
    assert b.usage()["tokens_day"] == 8


def test_whole_counts_are_kept_exactly() -> None:
    b = Budget(max_cloud_tokens_per_day=2**62)
    b.record(2**61 + 1)  # past float's 2**53: ceil through a float would change it
    b.record(np.int64(5))
    assert b.usage()["tokens_day"] == 2**61 + 6
