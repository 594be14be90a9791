"""Each PII kind is found, and look-alikes (checksum failures, order numbers, versions) are not."""

from __future__ import annotations

import random
import time

import pytest

from hybridllm.router.privacy import (
    Restorer,
    detect_pii,
    iban_ok,
    luhn_ok,
    pii_kinds_in_messages,
    pseudonymize_messages,
    redact_messages,
    redact_pii,
)


def kinds(text: str) -> list[str]:
    return [m.kind for m in detect_pii(text)]


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("write to jane.doe+news@example.co.uk today", "email", "jane.doe+news@example.co.uk"),
        ("call (415) 555-2671 tonight", "phone", "(415) 555-2671"),
        ("my number is +44 20 7946 0958", "phone", "+44 20 7946 0958"),
        ("ring 415-555-2671", "phone", "415-555-2671"),
        ("portable 06 12 34 56 78", "phone", "06 12 34 56 78"),
        ("card 4111 1111 1111 1111 exp 12/29", "card", "4111 1111 1111 1111"),
        ("amex 378282246310005", "card", "378282246310005"),
        ("pay to GB82 WEST 1234 5698 7654 32", "iban", "GB82 WEST 1234 5698 7654 32"),
        ("IBAN DE89370400440532013000", "iban", "DE89370400440532013000"),
        ("my SSN is 123-45-6789", "national_id", "123-45-6789"),
        ("SSN: 123456789", "national_id", "123456789"),
        ("NI number AB 12 34 56 C", "national_id", "AB 12 34 56 C"),
        ("use sk-proj-Abcdefghijklmnopqrstuv1234 for it", "secret",
         "sk-proj-Abcdefghijklmnopqrstuv1234"),
        ("AWS key AKIAIOSFODNN7EXAMPLE", "secret", "AKIAIOSFODNN7EXAMPLE"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "secret",
         "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("config: api_key=a8f9d0c1e2b3f4", "secret", "a8f9d0c1e2b3f4"),
        ('password: "Tr0ub4dor&3x"', "secret", "Tr0ub4dor&3x"),
    ],
)
def test_detects(text, kind, value):
    found = detect_pii(text)
    assert [(m.kind, m.text) for m in found] == [(kind, value)]


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 fails Luhn",  # 16 digits, wrong check digit
        "order number 1234567890123456 shipped",  # 16 digits, no issuer, fails Luhn
        "tracking 9400111899223344556677",  # 22 digits
        "upgrade to version 1.2.3 or python 3.11.4",
        "released 2024-01-15, patched 2024-02-01",
        "server at 192.168.1.1 port 8080",
        "ISBN 978-3-16-148410-0",
        "it cost $1,234,567.89 in 1999-2003",
        "pi is 3.14159265358979",
        "bad IBAN GB82 WEST 1234 5698 7654 33",  # mod-97 fails
        "SSN-like 000-12-3456 and 666-12-3456 are never issued",
        "user@localhost is not an address with a domain",
        "token = tokenizer.encode(text)",
        "password: must be at least eight characters",
        "reach me on @handle",
        "Statement 1 | 12 3456 7890 is false",
        "sk-learn is a typo for scikit-learn",
    ],
)
def test_look_alikes_are_not_flagged(text):
    assert kinds(text) == []


def test_redact_replaces_each_kind_and_keeps_the_rest():
    text = "Mail a@b.io, card 4111111111111111, SSN 123-45-6789."
    assert redact_pii(text) == "Mail [EMAIL], card [CARD], SSN [NATIONAL_ID]."


def test_checksums():
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")
    assert iban_ok("GB82WEST12345698765432") and not iban_ok("GB82WEST12345698765433")


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="Unknown PII kind"):
        detect_pii("x", kinds=["dna"])


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        # e-mail: any case, international (IDN) addresses, an apostrophe, spelled out
        ("mail JOHN.DOE@GMAIL.COM now", "email", "JOHN.DOE@GMAIL.COM"),
        ("schreib an jürgen@müller.de", "email", "jürgen@müller.de"),
        ("mail o'brien@example.com", "email", "o'brien@example.com"),
        ("reach john.doe [at] gmail [dot] com", "email", "john.doe [at] gmail [dot] com"),
        ("reach john(at)gmail.com", "email", "john(at)gmail.com"),
        ("it is john dot doe at gmail dot com", "email", "john dot doe at gmail dot com"),
        # phones in more formats
        ("call 555 123 4567", "phone", "555 123 4567"),
        ("call 1-800-555-0199", "phone", "1-800-555-0199"),
        ("ring 020 7946 0958", "phone", "020 7946 0958"),
        ("mobile 07700 900123", "phone", "07700 900123"),
        ("call me on 5551234567", "phone", "5551234567"),
        # IBAN in lower case, with dashes, and a 4-character last group before a word
        ("pay gb82 west 1234 5698 7654 32", "iban", "gb82 west 1234 5698 7654 32"),
        ("pay GB82-WEST-1234-5698-7654-32", "iban", "GB82-WEST-1234-5698-7654-32"),
        ("pay BE68 5390 0754 7034 with care", "iban", "BE68 5390 0754 7034"),
        ("IBAN NL91ABNA0417164300", "iban", "NL91ABNA0417164300"),
        ("nino ab123456c", "national_id", "ab123456c"),
        # secrets: passwords of any shape, names that end in a secret's name, more key formats
        ("password: hunter2", "secret", "hunter2"),
        ("password: correcthorsebatterystaple", "secret", "correcthorsebatterystaple"),
        ("my password is Tr0ub4dor&3 ok", "secret", "Tr0ub4dor&3"),
        ("DB_PASSWORD=supersecretvalue", "secret", "supersecretvalue"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "secret",
         "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("api key: 0123456789abcdef0123456789abcdef", "secret", "0123456789abcdef0123456789abcdef"),
        ("use Bearer abc123def456ghi789 here", "secret", "abc123def456ghi789"),
        ("postgres://admin:s3cretpass@db.example.com:5432/app", "secret",
         "admin:s3cretpass@db.example.com"),
        ("GitLab glpat-abcdefghij1234567890", "secret", "glpat-abcdefghij1234567890"),
        ("Stripe sk_live_51H8abcdefghijklmnopqrstu", "secret", "sk_live_51H8abcdefghijklmnopqrstu"),
        ("HF hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "secret", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"),
        ("key:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE", "secret",
         "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE"),  # pasted without its END line
    ],
)
def test_detects_the_shapes_users_write(text, kind, value):
    found = detect_pii(text)
    assert [(m.kind, m.text) for m in found] == [(kind, value)]


def test_an_authorization_header_is_a_secret_whatever_its_scheme():
    text = "curl -H 'Authorization: Basic dXNlcjpwYXNz' https://api.example.com"
    assert kinds(text) == ["secret"] and "dXNlcjpwYXNz" not in redact_pii(text)


@pytest.mark.parametrize(
    "text",
    [
        "the year 1999 and the 1990s",
        "version 10.2.3.4",
        "order 123-456-7890-12",
        "on 2024-01-15 at 10:30",
        "ISBN 978-0-306-40615-7",
        "look at example dot com",
        "look at the dot com bubble",
        "sign in at google dot com",
        "meet me at the station",
        "password = pwd",
        "    password: str\n",
        "password = self.password",
        'api_key="YOUR_API_KEY"',
        "api_key = os.environ['OPENAI_API_KEY']",
        "secret_key = get_secret()",
        "the password is incorrect",
        "Bearer bonds are risky",
        "the cell 12345678 in the sheet",
        "phone has 128 GB",
    ],
)
def test_more_look_alikes_are_not_flagged(text):
    assert kinds(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "1-" * 150_000,  # an unanchored e-mail pattern rescanned this from every digit (minutes)
        "x@y.com " * 40_000,  # 40,000 matches: merging them pairwise was quadratic
        "password: " * 30_000,
        "Authorization:" * 20_000,
        "ssn" + " " * 300_000,
        "-----BEGIN RSA PRIVATE KEY-----\n" * 10_000,
        "a at b dot " * 30_000,
    ],
)
def test_a_huge_prompt_is_scanned_in_linear_time(text):
    t0 = time.perf_counter()
    detect_pii(text)
    assert time.perf_counter() - t0 < 3.0


def test_every_turn_is_scanned_and_redacted():
    msgs = [
        {"role": "system", "content": "The customer is jane@example.com."},
        {"role": "user", "content": "What is my balance?"},
        {"role": "assistant", "content": "Card 4111 1111 1111 1111 shows 12 EUR."},
        {"role": "tool", "content": "lookup(+44 20 7946 0958) -> ok"},
        {"role": "user", "content": "And SSN 123-45-6789?"},
    ]
    assert pii_kinds_in_messages(msgs) == ["card", "national_id", "email", "phone"]
    red = redact_messages(msgs)
    assert [m["role"] for m in red] == [m["role"] for m in msgs]
    sent = " ".join(m["content"] for m in red)
    for value in ("jane@example.com", "4111", "7946", "123-45-6789"):
        assert value not in sent
    assert red[0]["content"] == "The customer is [EMAIL]."


def test_a_value_split_across_two_turns_is_found_and_redacted_in_both():
    msgs = [{"role": "user", "content": "my card is 4111 1111"},
            {"role": "user", "content": "1111 1111, what is the limit?"}]
    assert detect_pii(msgs[0]["content"]) == [] and detect_pii(msgs[1]["content"]) == []
    assert pii_kinds_in_messages(msgs) == ["card"]
    red = redact_messages(msgs)
    assert [m["content"] for m in red] == ["my card is [CARD]", "[CARD], what is the limit?"]
    ssn = [{"role": "user", "content": "my SSN is"}, {"role": "user", "content": "123456789"}]
    assert pii_kinds_in_messages(ssn) == ["national_id"]


def test_overlapping_matches_leave_no_part_of_either():
    text = "connect to postgres://admin:s3cretpass@db.example.com:5432/app"
    assert redact_pii(text) == "connect to postgres://[SECRET]:5432/app"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_pseudonymize_numbers_each_distinct_value_and_maps_it_back():
    msgs = [{"role": "system", "content": "Account of jane@example.com, card 4111 1111 1111 1111."},
            {"role": "user",
             "content": "Mail Jane@Example.com and bob@example.org; card 4111-1111-1111-1111."}]
    sent, values = pseudonymize_messages(msgs)
    assert [m["content"] for m in sent] == [
        "Account of [EMAIL_1], card [CARD_1].",
        "Mail [EMAIL_1] and [EMAIL_2]; card [CARD_1].",  # the same address and card in another form
    ]
    assert values == {"[EMAIL_1]": "jane@example.com", "[CARD_1]": "4111 1111 1111 1111",
                      "[EMAIL_2]": "bob@example.org"}
    assert [m["role"] for m in sent] == ["system", "user"] and msgs[1]["content"].startswith("Mail Jane")


def test_pseudonymize_keeps_the_numbers_as_a_conversation_grows():
    # the next request resends the earlier turns (with the restored answer): same numbers again
    first = user("Draft a note to ann@example.com.")
    grown = [*first, {"role": "assistant", "content": "Dear ann@example.com, ..."},
             {"role": "user", "content": "Now cc cy@example.com and ann@example.com."}]
    sent, values = pseudonymize_messages(grown)
    assert pseudonymize_messages(first)[1] == {"[EMAIL_1]": "ann@example.com"}
    assert [m["content"] for m in sent] == ["Draft a note to [EMAIL_1].", "Dear [EMAIL_1], ...",
                                            "Now cc [EMAIL_2] and [EMAIL_1]."]
    assert values == {"[EMAIL_1]": "ann@example.com", "[EMAIL_2]": "cy@example.com"}


def test_pseudonymize_skips_names_the_prompt_already_holds():
    sent, values = pseudonymize_messages(user("Keep [EMAIL_1] and Email_2 as they are; a@example.com"))
    assert sent[0]["content"] == "Keep [EMAIL_1] and Email_2 as they are; [EMAIL_3]"
    assert values == {"[EMAIL_3]": "a@example.com"}


def test_pseudonymize_a_value_split_across_turns_gets_a_placeholder_per_part():
    msgs = [{"role": "user", "content": "my card is 4111 1111"},
            {"role": "user", "content": "1111 1111, what is the limit?"}]
    sent, values = pseudonymize_messages(msgs)
    assert [m["content"] for m in sent] == ["my card is [CARD_1]", "[CARD_2], what is the limit?"]
    assert Restorer(values).restore("[CARD_1] [CARD_2]") == "4111 1111 1111 1111"


def test_pseudonymize_without_pii_returns_the_messages_and_no_map():
    msgs = user("What is 2 + 2?")
    assert pseudonymize_messages(msgs) == (msgs, {})


VALUES = {"[EMAIL_1]": "jane@example.com", "[EMAIL_12]": "x@example.org", "[PHONE_1]": "415-555-2671"}


@pytest.mark.parametrize(
    ("answer", "restored"),
    [
        ("Write to [EMAIL_1].", "Write to jane@example.com."),
        ("[email_1] or [Email_1]", "jane@example.com or jane@example.com"),
        ("Dear <EMAIL_1>, call PHONE_1.", "Dear <jane@example.com>, call 415-555-2671."),
        ("EMAIL_12 is not EMAIL_1", "x@example.org is not jane@example.com"),
        # what is not one of ours, or only looks like part of one, is left as written
        *[(s, s) for s in ("[EMAIL_2]", "MY_EMAIL_1", "EMAIL_1x", "EMAIL 1", "[EMAIL-1]")],
    ],
)
def test_restorer_puts_the_values_back(answer, restored):
    assert Restorer(VALUES).restore(answer) == restored


def test_restorer_gives_the_same_text_however_a_stream_is_cut():
    answer = "To [EMAIL_1] (cc EMAIL_12), ring PHONE_1 or [phone_1]; not [EMAIL_2] nor [EMAIL_1x] E"
    whole = Restorer(VALUES).restore(answer)
    rng = random.Random(7)
    for _ in range(500):
        cuts = sorted(rng.sample(range(1, len(answer)), rng.randint(1, 12)))
        pieces = [answer[i:j] for i, j in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
        r = Restorer(VALUES)
        shown = [r.feed(p) for p in pieces] + [r.flush()]
        assert "".join(shown) == whole, pieces
        # (a piece shown before its end arrived would have left a placeholder in the joined text)


def test_restorer_holds_back_only_a_possible_placeholder():
    r = Restorer(VALUES)
    assert r.feed("Write to [EMA") == "Write to "
    assert r.feed("IL_1] today, ") == "jane@example.com today, "
    assert r.feed("EMAIL_1") == ""  # may yet become EMAIL_12
    assert r.feed("2.") == "x@example.org."
    assert r.feed("a [b") == "a [b"  # "[b" cannot grow into a placeholder
    assert r.feed("EMAIL_1") == "EMAIL_1"  # "bEMAIL_1" is one word, not a name
    assert r.feed(" EMAIL_1") == " "
    assert r.flush() == "jane@example.com" and r.flush() == ""


def test_restorer_keeps_its_values_out_of_repr_and_does_nothing_without_a_map():
    assert "jane" not in repr(Restorer(VALUES))
    empty = Restorer({})
    assert empty.feed("[EMAIL_1] as is") == "[EMAIL_1] as is" and empty.flush() == ""
