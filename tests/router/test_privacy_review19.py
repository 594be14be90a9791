"""Review 19: values pasted with Unicode separators, and a URL's password without a user name."""

from __future__ import annotations

import pytest

from hybridllm.router.policy import RoutingPolicy
from hybridllm.router.privacy import detect_pii, pseudonymize_messages, redact_pii

from .fakes import length_router


@pytest.mark.parametrize("text, kind, value", [
    # no-break spaces (web pages, PDFs, French typography's narrow one) and en dashes (a word
    # processor's autocorrect) between the groups: the ASCII patterns missed every one
    ("card 4111\u00a01111\u00a01111\u00a01111 please", "card", "4111\u00a01111\u00a01111\u00a01111"),
    ("card 4111\u20131111\u20131111\u20131111 please", "card", "4111\u20131111\u20131111\u20131111"),
    ("call +44\u00a020\u00a07946\u00a00958 now", "phone", "+44\u00a020\u00a07946\u00a00958"),
    ("appelez le +33\u202f6\u202f12\u202f34\u202f56\u202f78", "phone",
     "+33\u202f6\u202f12\u202f34\u202f56\u202f78"),
    ("\uff0b44 20 7946 0958", "phone", "\uff0b44 20 7946 0958"),
    ("IBAN DE89\u00a03704\u00a00044\u00a00532\u00a00130\u00a000 thanks",
     "iban", "DE89\u00a03704\u00a00044\u00a00532\u00a00130\u00a000"),
    ("jane\uff20example.com", "email", "jane\uff20example.com"),
    # Redis's AUTH without a user name: redis://:password@host
    ("REDIS_URL=redis://:s3cretpass@cache:6379/0", "secret", ":s3cretpass"),
])
def test_separator_forms_are_found(text, kind, value):
    assert [(m.kind, m.text) for m in detect_pii(text)] == [(kind, value)]


def test_redaction_keeps_the_text_around_a_value_with_unicode_separators():
    text = "Pay with 4111\u00a01111\u00a01111\u00a01111 \u2013 thanks, caf\u00e9"
    assert redact_pii(text) == "Pay with [CARD] \u2013 thanks, caf\u00e9"
    out, values = pseudonymize_messages([{"role": "user", "content": text}])
    assert out[0]["content"] == "Pay with [CARD_1] \u2013 thanks, caf\u00e9"
    assert values == {"[CARD_1]": "4111\u00a01111\u00a01111\u00a01111"}


def test_keep_on_device_keeps_a_no_break_space_phone_number():
    p = RoutingPolicy(length_router(threshold=0.0), privacy="keep_on_device")
    d = p.decide([{"role": "system", "content": "Client: +49\u00a0151\u00a012345678"},
                  {"role": "user", "content": "Draft a reply to the client."}])
    assert (d.route, d.pii_kinds) == ("edge", ["phone"])


@pytest.mark.parametrize("text", [
    "pages 120\u2013135 of the 2019\u20132020 report", "1\u00a0234\u00a0567 \u20ac in 2024",
    "ISBN 978\u20133\u201316\u2013148410\u20130", "version 1.2.3\u20134", "https://example.com:8080/x@y",
])
def test_harmless_text_with_the_same_separators_stays_clean(text):
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", ["order #123-456-7890 has not arrived", "see ticket #0171 234 5678"])
def test_a_reference_after_a_hash_is_no_phone_number(text):
    # a number right after "#" is an order or ticket reference: it kept harmless prompts on the device
    assert detect_pii(text) == []


@pytest.mark.parametrize("text, value", [
    ("phone #555-123-4567", "555-123-4567"), ("Phone: #(555) 123-4567", "(555) 123-4567"),
    ("tel# 555-123-4567", "555-123-4567"), ("call 555-123-4567 or #12", "555-123-4567"),
])
def test_a_phone_word_before_the_hash_still_finds_the_number(text, value):
    assert [(m.kind, m.text) for m in detect_pii(text)] == [("phone", value)]
