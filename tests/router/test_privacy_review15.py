"""Review 15 of the PII redactor: German phone styles, Unicode digits, a phone taken for a card,
and questions about a password taken for one."""

import pytest

from hybridllm.router.privacy import detect_pii, pseudonymize_messages, redact_pii


@pytest.mark.parametrize(
    "number",
    [
        "030 / 12 34 56 7",  # DIN 5008's old grouping in twos after the slash
        "(030) 1234567",  # area code in brackets
        "(0711) 123 45 67",
        "(089) 123456-0",  # an extension after the dash
        "030 / 123 456-0",
        "(+49) 30 1234567",  # country code in brackets
        "+49 (0)711 / 123 45-67",  # DIN 5008's old international style, as in e-mail signatures
        "+49 30 / 1234567",
    ],
)
def test_german_phone_styles_are_redacted(number):
    assert redact_pii(f"Ruf mich an unter {number} bitte") == "Ruf mich an unter [PHONE] bitte"


@pytest.mark.parametrize(
    "text",
    [
        "on 12.03.2024 and 2024-03-12",
        "03/12/2024 10 30",
        "invoice 01/2024 1234 EUR",  # a month and a year, then an amount
        "order #030/12345",
        "on 05/12 2024 we met",  # a day and a month, then a year
        "scores 07/10 8 9 10",
        "chapter 03/12 1 2 3 4",
        "ISBN 978-3-16-148410-0",
        "v1.2.3 (2024) 12345678",
        "price (0.99) 123456",
        "see f(030) 1234567",  # a call in code
        "at 12:30 (05) 12",
        "a+1/2/3 and +1 / 2 / 3",
    ],
)
def test_dates_orders_and_code_are_not_phones(text):
    assert detect_pii(text) == []


def test_international_phone_with_luhn_valid_digits_is_a_phone_not_a_card():
    # 4915112345678 has 13 digits, starts with 4 and passes Luhn: a "Visa" only without the "+"
    assert redact_pii("call +49 151 12345678") == "call [PHONE]"


@pytest.mark.parametrize("card", ["４１１１ １１１１ １１１１ １１１１", "٤١١١١١١١١١١١١١١١"])
def test_card_in_other_scripts_digits_is_redacted(card):
    assert redact_pii(f"card {card} ok") == "card [CARD] ok"


def test_one_card_in_two_scripts_gets_one_placeholder():
    out, values = pseudonymize_messages(
        [{"role": "user", "content": "4111 1111 1111 1111 or ４１１１ １１１１ １１１１ １１１１"}])
    assert out[0]["content"] == "[CARD_1] or [CARD_1]"
    assert list(values) == ["[CARD_1]"]


@pytest.mark.parametrize("text", ["what if my password is hacked?", "help, my password is wrong!",
                                  "why my OTP password is sent?"])
def test_a_question_about_a_password_is_not_a_secret(text):
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", ["my password is hunter2!", "password is p@ss?", 'password is "abc?"'])
def test_password_values_with_punctuation_are_still_secrets(text):
    assert [m.kind for m in detect_pii(text)] == ["secret"]
