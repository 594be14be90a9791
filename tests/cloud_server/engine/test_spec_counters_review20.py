"""Speculative decoding counters and prompt lookup (review 20), fakes only: a ``/metrics`` scrape
reads the counters as one consistent snapshot while the engine thread counts a draft, and the
prompt-lookup window is a named constant that bounds the scan."""

from __future__ import annotations

import threading

from cloud_server.api.metrics import ServerMetrics
from cloud_server.engine.spec_decode import SpecStats

from .test_fuzz_fake_batching8 import make_engine


class _PausingList(list):
    """``accepted_per_pos`` whose first item update waits until the test lets it go: the engine
    thread is then in the middle of ``SpecStats.record`` (totals counted, positions not yet)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.paused, self.go = threading.Event(), threading.Event()
        self.armed = False

    def __setitem__(self, i, v) -> None:
        if self.armed:
            self.armed = False
            self.paused.set()
            assert self.go.wait(10)
        super().__setitem__(i, v)


def _scraped(text: str) -> dict[str, float]:
    """``name{position}`` -> value of the spec-decode series in a Prometheus exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith("hybridllm_spec_decode_"):
            name, value = line.rsplit(" ", 1)
            pos = name.split('position="')[1].split('"')[0] if "position=" in name else ""
            out[name.split("{")[0] + pos] = float(value)
    return out


def test_a_scrape_never_reads_a_half_counted_draft():
    # record() updated the totals and then each position, with /metrics reading the fields one
    # by one from another thread: a scrape in between reported 5 accepted tokens but 2 per
    # position (and, between the totals, accepted tokens without their draft tokens)
    eng = make_engine(16)
    eng.spec.stats.record(2, 2)
    eng.spec.stats.accepted_per_pos = per_pos = _PausingList(eng.spec.stats.accepted_per_pos)
    metrics = ServerMetrics(eng.stats, lambda: "m")
    per_pos.armed = True
    engine = threading.Thread(target=eng.spec.stats.record, args=(3, 3))
    engine.start()
    try:
        assert per_pos.paused.wait(10)
        result: list[bytes] = []
        started = threading.Event()

        def scrape() -> None:
            started.set()
            result.append(metrics.render())

        scraper = threading.Thread(target=scrape)
        scraper.start()
        assert started.wait(10)
        scraper.join(0.5)  # the old code answered at once, with the half-counted draft
    finally:
        per_pos.go.set()
    engine.join(10)
    scraper.join(10)
    got = _scraped(result[0].decode())
    drafts = got["hybridllm_spec_decode_num_drafts_total"]
    tokens = got["hybridllm_spec_decode_num_draft_tokens_total"]
    accepted = got["hybridllm_spec_decode_num_accepted_tokens_total"]
    series = "hybridllm_spec_decode_num_accepted_tokens_per_pos"
    positions = [v for k, v in got.items() if k.startswith(series)]
    assert (drafts, tokens, accepted) in {(1, 2, 2), (2, 5, 5)}
    assert sum(positions) == accepted and accepted <= tokens
    # and after it, the whole second draft
    assert _scraped(metrics.render().decode())["hybridllm_spec_decode_num_accepted_tokens_total"] == 5


def test_snapshot_is_a_copy_of_whole_drafts():
    st = SpecStats()
    st.record(3, 1)
    snap = st.snapshot()
    st.record(3, 3)
    assert snap == {
        "spec_decode_num_drafts": 1,
        "spec_decode_num_draft_tokens": 3,
        "spec_decode_num_accepted_tokens": 1,
        "spec_decode_num_accepted_tokens_per_pos": [1, 0, 0],
    }
    assert st.snapshot()["spec_decode_num_accepted_tokens_per_pos"] == [2, 1, 1]


def test_prompt_lookup_scans_the_named_window_only():
    from cloud_server.engine.spec_decode import ngram

    w = ngram.LOOKUP_WINDOW
    assert w == 2048  # the README's figure
    copy = [5, 6, 7, 8, 9]  # the span "5 6" is followed by "7 8 9"
    filler = [1] * w  # no match in here
    # the earlier "6" is the first of the w tokens before the last: its continuation is proposed
    inside = [*copy, *filler[: w - len(copy)], 5, 6]
    assert ngram.propose_ngram(inside, 3) == [7, 8, 9]
    # one token further back it is never looked at
    outside = [*copy, *filler[: w - len(copy) + 1], 5, 6]
    assert ngram.propose_ngram(outside, 3) == []
    assert ngram.propose_ngram(outside, 3, window=w + 1) == [7, 8, 9]


def test_a_failed_steps_draft_probabilities_go_with_its_requests():
    # the target step failed after the draft model's proposal: verify() never ran, the engine
    # aborted the batch's requests, yet their q ([k, vocab] rows, on the GPU) stayed referenced
    # until some later step succeeded, while the server sat idle after, say, an out-of-memory
    from cloud_server.engine.block_manager import BlockManager
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.scheduler import Scheduler
    from cloud_server.engine.spec_decode import SpecDecoder
    from cloud_server.engine.spec_decode.draft import DraftProposer

    from .test_spec_decoder_review19 import _decoding, _FakeDraftRunner

    bm = BlockManager(16, 4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    spec = SpecDecoder(method="draft", num_speculative_tokens=2, max_model_len=64,
                       draft=DraftProposer(_FakeDraftRunner()))
    seq = _decoding(bm, sch, SamplingParams(max_tokens=40, temperature=1.0, seed=3))
    out = sch.schedule(spec.lookahead)
    sch.add_drafts(out.scheduled, spec.propose(out.scheduled, bm))
    assert seq.seq_id in spec._draft_probs
    sch.rollback(out.scheduled)  # the target's step raised
    spec.release(seq.seq_id)  # the engine aborts the failed batch's requests
    assert spec._draft_probs == {}
