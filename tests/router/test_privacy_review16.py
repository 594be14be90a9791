"""Phone numbers after the international prefix 00, and "password: hacked?" as a question."""

from __future__ import annotations

import pytest

from hybridllm.router.privacy import detect_pii


@pytest.mark.parametrize("number", ["0049 30 1234567", "0049 (0)711 / 123 45-67", "0049-30-1234567",
                                    "0044 20 7946 0958", "00354 551 2345"])
def test_a_number_after_the_00_prefix_is_a_phone(number):
    assert [(m.kind, m.text) for m in detect_pii(f"reach me at {number} today")] == [("phone", number)]


@pytest.mark.parametrize("text", ["version 0012 3456", "sizes 0010 0020 0030 0040", "x = 0.0049 30 1234",
                                  "id 00491511234567"])
def test_zero_padded_numbers_are_not_phones(text):
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", ["password: hacked?", "password: hacked?\nwhat now", "Password: wrong!",
                                  "my pwd: stolen?"])
def test_a_question_after_password_colon_is_not_a_secret(text):
    assert detect_pii(text) == []


@pytest.mark.parametrize(("text", "value"), [
    ("password: hunter", "hunter"), ("password: p@ss?", "p@ss?"), ("password: hunter2!", "hunter2!"),
    ('password: "hacked?"', "hacked?"), ("pwd: s3cr3t!", "s3cr3t!")])
def test_password_values_after_a_colon_are_still_secrets(text, value):
    assert [(m.kind, m.text) for m in detect_pii(text)] == [("secret", value)]
