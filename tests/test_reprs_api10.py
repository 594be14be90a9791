"""More public objects whose repr held the caller's text (see tests/test_reprs_api9.py):
GenerationParams showed the stop strings (``stop=('Patient Jane Roe:',)``), and the PIIMatch
objects that hybridllm.router.detect_pii returns showed the personal value they found. Their
reprs now give the stops' count and sizes and the match's length; the attributes keep the text."""

from __future__ import annotations

import logging

from hybridllm import GenerationParams
from hybridllm.router import detect_pii

STOP = "Patient Jane Roe:"


def test_generation_params_show_the_stops_count_and_sizes_not_their_text():
    p = GenerationParams(max_tokens=9, stop=[STOP, "END"])
    text = repr(p)
    assert "Jane" not in text and "END" not in text, text
    assert f"stop=<2 strings of {len(STOP)}, 3 chars>" in text
    assert "max_tokens=9" in text and "temperature=0.7" in text
    assert p.stop == (STOP, "END")  # the attribute is whole
    assert p == GenerationParams(max_tokens=9, stop=(STOP, "END")) and hash(p) == hash(
        GenerationParams(max_tokens=9, stop=(STOP, "END")))
    assert "stop=()" in repr(GenerationParams())  # nothing to hide
    assert "stop=<1 string of 17 chars>" in str(GenerationParams(stop=STOP))


def test_a_pii_match_shows_the_values_length_not_the_value(caplog):
    found = detect_pii("write to jane.roe@example.com today")
    assert [m.text for m in found] == ["jane.roe@example.com"]
    with caplog.at_level(logging.INFO, logger="test"):
        logging.getLogger("test").info("found %r", found)
    assert "jane.roe" not in caplog.text
    assert "PIIMatch(kind='email', start=9, end=29, text=<20 chars>)" in caplog.text
