"""The PII detector measured on a small labelled set of realistic prompts (precision, recall, time),
and two gaps that set showed. Before: a public IP address (personal data: it names a person's
connection) was not detected, so privacy="keep_on_device" sent it to the cloud and "redact" sent it
as written; and a Git remote such as ``git@github.com:org/repo.git`` was taken for an e-mail
address, which kept a harmless coding question on the device."""

from __future__ import annotations

import time

import pytest

from hybridllm.router.privacy import Restorer, detect_pii, pseudonymize_messages

# (prompt, the (kind, value) pairs in it): what a user of a chat assistant writes
LABELLED: list[tuple[str, list[tuple[str, str]]]] = [
    ("Please reply to john.smith@example.co.uk about the refund", [("email", "john.smith@example.co.uk")]),
    ("cc: Jane <jane@corp.io>, thanks", [("email", "jane@corp.io")]),
    ("Call me on +44 20 7946 0958 after five", [("phone", "+44 20 7946 0958")]),
    ("Our office: +1 (415) 555-2671", [("phone", "+1 (415) 555-2671")]),
    ("Ring +33 6 12 34 56 78 if the parcel is late", [("phone", "+33 6 12 34 56 78")]),
    ("my mobile is 07700 900123", [("phone", "07700 900123")]),
    ("Whatsapp +55 11 91234-5678", [("phone", "+55 11 91234-5678")]),
    ("Transfer it to DE89 3704 0044 0532 0130 00 today", [("iban", "DE89 3704 0044 0532 0130 00")]),
    ("IBAN: GB82WEST12345698765432", [("iban", "GB82WEST12345698765432")]),
    ("Charge 4111 1111 1111 1111, exp 12/27", [("card", "4111 1111 1111 1111")]),
    ("card 5555-5555-5555-4444 was declined", [("card", "5555-5555-5555-4444")]),
    ("Amex 3782 822463 10005 please", [("card", "3782 822463 10005")]),
    ("My SSN is 078-05-1120", [("national_id", "078-05-1120")]),
    ("why does sk-proj-abcdEFGH1234ijklMNOP5678qrst fail with 401?",
     [("secret", "sk-proj-abcdEFGH1234ijklMNOP5678qrst")]),
    ("AKIAIOSFODNN7EXAMPLE is rejected by S3", [("secret", "AKIAIOSFODNN7EXAMPLE")]),
    ("export OPENAI_API_KEY=sk-abc123def456ghi789jkl012mno", [("secret", "sk-abc123def456ghi789jkl012mno")]),
    ("my home IP is 81.2.69.160, why is it blocked?", [("ip_address", "81.2.69.160")]),
    ("ssh from 203.0.114.9:51234 was refused", [("ip_address", "203.0.114.9")]),
    ("the log shows client 2a00:1450:4009:81f::200e", [("ip_address", "2a00:1450:4009:81f::200e")]),
    ("mail bob@corp.io from 81.2.69.161", [("email", "bob@corp.io"), ("ip_address", "81.2.69.161")]),
    # harmless prompts: nothing in them is personal
    ("Upgrade from version 1.2.3 to 2.10.0", []),
    ("The meeting is on 2024-03-15 at 10:30", []),
    ("Python 3.11.4 and numpy 1.26.4", []),
    ("The order id is 4111 2222 3333 4444", []),
    ("UUID 123e4567-e89b-12d3-a456-426614174000", []),
    ("ISBN 978-3-16-148410-0", []),
    ("pip install torch==2.1.0+cu121", []),
    ("token = tokenizer.encode(text)", []),
    ("password = getpass()", []),
    ("The population is 8 045 311 447 people", []),
    ("server 192.168.1.20 and 10.0.0.7 cannot reach each other", []),
    ("ping 8.8.8.8 works but ping 1.1.1.1 does not", []),
    ("bump the package to v4.2.1.0", []),
    ("pin foo==1.2.3.4 in requirements", []),
    ("allow 81.2.0.0/16 in the firewall", []),
    ("OID 1.3.6.1.4.1.311 in the certificate", []),
    ("loopback ::1 and link-local fe80::1 on eth0", []),
    ("the job ran at 12:30:45 on mac 00:1A:2B:3C:4D:5E", []),
    ("std::vector<int> v; v.push_back(2);", []),
    ("git clone git@github.com:org/repo.git fails with permission denied", []),
    ("git remote set-url origin ssh://git@gitlab.com/team/app.git", []),
    ("rsync -a build/ deploy@example.org:/srv/www/", []),
]


def _measure() -> tuple[float, float, float, list[str]]:
    tp = fp = fn = 0
    wrong = []
    start = time.perf_counter()
    for text, want in LABELLED:
        got = {(m.kind, m.text) for m in detect_pii(text)}
        tp += len(got & set(want))
        fp += len(got - set(want))
        fn += len(set(want) - got)
        if got != set(want):
            wrong.append(f"{text!r}: got {sorted(got)}, want {sorted(want)}")
    per_prompt_ms = (time.perf_counter() - start) / len(LABELLED) * 1000
    return tp / max(1, tp + fp), tp / max(1, tp + fn), per_prompt_ms, wrong


def test_the_detector_on_a_labelled_set_of_realistic_prompts():
    precision, recall, per_prompt_ms, wrong = _measure()
    # measured: precision 1.00, recall 1.00, about 0.05 ms a prompt on this 2-core machine (before
    # the fix: recall 0.81, the four IP addresses missed; precision 0.85, the three remotes)
    assert precision == 1.0 and recall == 1.0, wrong
    assert per_prompt_ms < 5.0, per_prompt_ms  # generous: a busy CI machine, 100x the measure


@pytest.mark.parametrize("text", [
    "my home IP is 81.2.69.160.",
    "ip:81.2.69.160",
    "[2a00:1450:4009:81f::200e]:443",
    "::ffff:81.2.69.160",
    "allow 81.2.69.160/32",  # one host is an address
])
def test_a_public_ip_address_is_personal_data(text):
    assert [m.kind for m in detect_pii(text)] == ["ip_address"]


def test_an_ip_address_is_redacted_for_the_cloud_and_restored_in_any_spelling():
    msgs = [{"role": "user", "content": "Block 81.2.69.160 and 2A00:1450:4009:81F::200E, "
                                        "then 2a00:1450:4009:81f:0::200e again"}]
    out, placeholders = pseudonymize_messages(msgs)
    # one address in two spellings is one value: one placeholder
    assert out[0]["content"] == "Block [IP_ADDRESS_1] and [IP_ADDRESS_2], then [IP_ADDRESS_2] again"
    answer = Restorer(placeholders).restore("Blocked [IP_ADDRESS_1] and IP_ADDRESS_2.")
    assert answer == "Blocked 81.2.69.160 and 2A00:1450:4009:81F::200E."


def test_an_address_followed_by_a_colon_or_a_port_is_still_an_address():
    assert [m.text for m in detect_pii("Email jane@corp.io: thanks")] == ["jane@corp.io"]
    assert [m.text for m in detect_pii("write to jane@corp.io:now")] == ["jane@corp.io"]
    # a URL's port is not an SCP path: the credentials and host stay one secret
    assert [(m.kind, m.text) for m in detect_pii("postgres://admin:s3cretpass@db.example.com:5432/app")] == [
        ("secret", "admin:s3cretpass@db.example.com")]
