"""Personal data written the ways people and clients write it, which the detectors once missed: a number
cut into three content parts or more, addresses in scripts written with combining marks (Devanagari,
Tamil, Thai, decomposed Latin), IBANs with dashes between their groups and UK National Insurance numbers
in lower case. Each is found whole and redacted exactly; what only looks like one stays alone."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from classifiers.signals import PIISignal, find_pii, redact, redact_body
from classifiers.signals._text import SCOPES


def parts(*texts: str) -> dict[str, Any]:
    """A request whose one user message is ``texts`` as text content parts."""
    return {"model": "auto", "messages": [{"role": "user", "content": [{"type": "text", "text": t} for t in texts]}]}


# ----------------------------------------------------------------------------------------------
# Content parts: a model reads a message's text parts as one text


SPLIT = [
    # (parts as sent, kind, parts after redaction)
    (("card 4111", " 1111", " 1111", " 1111 thanks"), "credit_card", ["card [CREDIT_CARD]", "", "", " thanks"]),
    (("card 4111 1111", " 1111", " 1111, ok"), "credit_card", ["card [CREDIT_CARD]", "", ", ok"]),
    (("write to john", ".smith@acme-", "corp.com please"), "email", ["write to [EMAIL]", "", " please"]),
    (("iban DE89", " 3704 0044", " 0532 0130", " 00 ok"), "iban", ["iban [IBAN]", "", "", " ok"]),
]


@pytest.mark.parametrize(("texts", "kind", "redacted"), SPLIT)
def test_a_number_cut_into_several_parts_is_found_once_and_redacted_in_each(
    texts: tuple[str, ...], kind: str, redacted: list[str]
) -> None:
    body = parts(*texts)
    signal = PIISignal().extract(body)
    assert signal.value == [kind]
    assert signal.detail["counts"] == {kind: 1}
    (finding,) = signal.detail["findings"]
    assert (finding["message"], finding["source"]) == (0, "content")
    out = redact_body(body)["messages"][0]["content"]
    assert [p["text"] for p in out] == redacted
    assert [p["text"] for p in body["messages"][0]["content"]] == list(texts)  # the request is not modified


def test_parts_beside_a_cut_number_keep_their_own_findings() -> None:
    body = parts("mail ann@acme-corp.com, card 4111", " 1111", " 1111", " 1111 or bob@acme-corp.com")
    assert PIISignal().extract(body).detail["counts"] == {"email": 2, "credit_card": 1}
    out = [p["text"] for p in redact_body(body)["messages"][0]["content"]]
    assert out == ["mail [EMAIL], card [CREDIT_CARD]", "", "", " or [EMAIL]"]


def test_a_piece_that_reads_as_pii_on_its_own_is_part_of_the_one_finding_it_starts() -> None:
    # "john@acme.co" is an address by itself, and the start of "john@acme.com" read across the parts: one
    # address was written, so one is counted (a rule on the count, e.g. bulk personal data, reads it).
    body = parts("write to john@acme.co", "m please, and card 4111 1111", " 1111 1111")
    signal = PIISignal().extract(body)
    assert signal.detail["counts"] == {"email": 1, "credit_card": 1}
    found = [(f["kind"], f["span"]) for f in signal.detail["findings"]]
    assert found == [("email", [9, 21]), ("credit_card", [19, 28])]
    out = [p["text"] for p in redact_body(body)["messages"][0]["content"]]
    assert out == ["write to [EMAIL]", " please, and card [CREDIT_CARD]", ""]


def test_a_number_cut_across_two_messages_is_not_one_finding() -> None:
    body = {"model": "auto", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "card 4111 1111"}]},
        {"role": "user", "content": [{"type": "text", "text": " 1111 1111"}]},
    ]}  # fmt: skip
    assert PIISignal().extract(body).value == []
    assert redact_body(body) == body


# ----------------------------------------------------------------------------------------------
# IBANs with dashes between the groups


@pytest.mark.parametrize(
    "iban", ["DE89-3704-0044-0532-0130-00", "GB82-WEST-1234-5698-7654-32", "gb82-west-1234-5698-7654-32"]
)
def test_an_iban_with_dashes_between_its_groups_is_found(iban: str) -> None:
    text = f"pay to {iban}, thanks"
    (finding,) = find_pii(text)
    assert (finding.kind, text[finding.start : finding.end]) == ("iban", iban)
    assert redact(text)[0] == "pay to [IBAN], thanks"


@pytest.mark.parametrize(
    "text",
    [
        "ref DE89-3704-0044-0532-0130-00-17",  # the dashed number goes on
        "ref DE89-37040044-05320130-00",  # dashes elsewhere than between groups of four
        "ref DE89 3704-0044-0532-0130-00",  # one separator throughout
        "ref DE89-3704-0044-0532-0130-01",  # fails mod-97
    ],
)
def test_dashed_numbers_that_are_no_iban_are_left_alone(text: str) -> None:
    assert find_pii(text, ["iban"]) == []


# ----------------------------------------------------------------------------------------------
# UK National Insurance numbers in lower case


@pytest.mark.parametrize("nino", ["ab123456c", "ab 12 34 56 c", "AB123456C", "jg 10 37 65 a"])
def test_a_national_insurance_number_in_either_case_is_found(nino: str) -> None:
    text = f"my NI number is {nino}."
    (finding,) = find_pii(text)
    assert (finding.kind, text[finding.start : finding.end]) == ("uk_nino", nino)


@pytest.mark.parametrize(
    "text",
    [
        "qq123456c",  # Q is never used
        "ao123456a",  # O is never second
        "bg123456a",  # a pair HMRC never issues
        "ab123456e",  # suffixes are A-D
        "Ab123456c",  # mixed case: an identifier, not a number HMRC wrote
        "xab123456c",  # inside a longer word
    ],
)
def test_lower_case_keeps_the_prefix_and_suffix_rules(text: str) -> None:
    assert find_pii(f"id {text} here", ["uk_nino"]) == []


# ----------------------------------------------------------------------------------------------
# E-mail addresses in scripts written with combining marks (Unicode category M)

MARKED_ADDRESSES = {
    "Hindi": "उपयोगकर्ता@उदाहरण.भारत",  # vowel signs and a virama; an IDN TLD ending in a vowel sign
    "Hindi, anusvara": "प्रिया.शर्मा@कंपनी.भारत",
    "Tamil": "பயனர்@எடுத்துக்காட்டு.இந்தியா",
    "Thai": "ผู้ใช้@ตัวอย่าง.ไทย",  # marks above and below
    "decomposed Latin": "ju\u0308rgen@mu\u0308ller.de",  # NFD, as macOS file names and some keyboards write it
    # Chakma: marks beyond the BMP, last in the local part and inside the domain
    "Chakma": "\U0001110c\U00011127\U0001111f\U00011134@\U0001110c\U00011127\U0001111f\U00011133\U0001111f.com",
    "Adlam": "\U0001e900\U0001e944\U0001e900.x@acme-corp.com",
}


@pytest.mark.parametrize("address", MARKED_ADDRESSES.values(), ids=MARKED_ADDRESSES.keys())
def test_an_address_written_with_combining_marks_is_found_whole(address: str) -> None:
    text = f"mail {address} today"
    (finding,) = find_pii(text)
    assert (finding.kind, text[finding.start : finding.end]) == ("email", address)
    assert redact(text)[0] == "mail [EMAIL] today"


def test_combining_marks_do_not_make_prose_an_address() -> None:
    # Hindi and Thai prose with an at sign: no domain with a TLD after it, or a mark where a label starts.
    for text in ["कीमत @ ₹500 प्रति किलो", "ราคา@ร้านค้า ไม่มี", "नाम@\u093e\u0915.भारत"]:
        assert find_pii(text, ["email"]) == [], text


def test_runs_of_marks_beyond_the_bmp_are_read_once() -> None:
    """A local part may go on past such a mark; runs of them are not re-read from each position. Both
    finish well within the suite's timeout, read once: split between runs every way (exponential) or
    re-read from each letter (quadratic), they would not."""
    chakma_mark = "\U00011134"
    assert find_pii("a" + chakma_mark * 60 + " x@", ["email"]) == []
    assert find_pii(("a" + chakma_mark) * 200_000 + "@", ["email"]) == []


# ----------------------------------------------------------------------------------------------
# International phone numbers as Europe writes them: a one-digit area code, the trunk 0 in brackets


@pytest.mark.parametrize(
    "phone",
    [
        "+33 6 12 34 56 78",  # French mobile, the way every French signature writes it abroad
        "+33 1 42 68 53 00",  # Paris
        "+31 6 12345678",  # Dutch mobile
        "+46 8 123 456 78",  # Stockholm
        "+353 1 234 5678",  # Dublin
        "0033 6 12 34 56 78",
        "+44 (0)20 7946 0958",  # the UK's trunk 0 in brackets, as on business cards
        "+49 (0)30 12345678",
        "+44 (0) 7700 900123",
    ],
)
def test_an_international_number_with_a_one_digit_area_code_or_a_bracketed_trunk_zero_is_found(phone: str) -> None:
    text = f"Reach me on {phone} after six."
    found = find_pii(text)
    assert [(f.kind, text[f.start : f.end]) for f in found] == [("phone", phone)]
    assert redact(text)[0] == "Reach me on [PHONE] after six."


@pytest.mark.parametrize(
    "text",
    [
        "+3 4 5 6 7 8 9 10",  # single digits after a plus: arithmetic, no number
        "+33 6 1 2 3 4 5 6",  # one-digit groups past the area code
        "+44 (0)",  # a trunk zero alone
        "Score +12 (0) 3",
    ],
)
def test_plus_signs_before_short_digit_groups_are_no_phone(text: str) -> None:
    assert [f.kind for f in find_pii(text)] == []


# ----------------------------------------------------------------------------------------------
# Redaction removes what the pii signal finds, context and all


def chat(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "auto", "messages": list(messages)}


CONTEXT = [
    # The question is in the assistant's turn, the bare number in the user's reply.
    chat({"role": "assistant", "content": "What is the best phone number to reach you?"},
         {"role": "user", "content": "4155552671"}),
    chat({"role": "assistant", "content": "Please confirm your SSN."}, {"role": "user", "content": "536221234"}),
    # The word is in one content part, the number in the next (a model reads them as one text).
    chat({"role": "user", "content": [{"type": "text", "text": "my phone:"}, {"type": "text", "text": "4155552671"}]}),
    # A tool call whose argument is named after what it holds.
    chat({"role": "user", "content": "Save Ann's contact."},
         {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "save_contact", "arguments": '{"name": "Ann", "phone": "4155552671", "ssn": 536221234}'}}]}),
    chat({"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "save", "arguments": '{"contact": {"type": "mobile", "value": "4155552671"}}'}}]}),
    {"model": "auto", "prompt": ["Caller's phone:", "4155552671"]},
]


@pytest.mark.parametrize("body", CONTEXT)
def test_redaction_removes_what_the_signal_finds_with_its_context(body: dict[str, Any]) -> None:
    """The pii signal reads a number with the words around it, in the turn before or the part before
    ('phone', 'SSN'), so a redact rule applied; the redaction read each text alone, found nothing in a
    bare '4155552671', and sent it upstream."""
    kinds = ["phone", "us_ssn"]
    assert PIISignal(kinds=kinds).extract(body).value
    redacted = redact_body(body, kinds)
    assert PIISignal(kinds=kinds).extract(redacted).value == []
    assert "4155552671" not in repr(redacted) and "536221234" not in repr(redacted)
    assert "[PHONE]" in repr(redacted) or "[US_SSN]" in repr(redacted)
    for message in redacted.get("messages", []):
        for call in message.get("tool_calls") or []:
            json.loads(call["function"]["arguments"])  # still JSON


def test_context_redaction_replaces_only_the_number() -> None:
    body = CONTEXT[0]
    redacted = redact_body(body, ["phone"])
    assert redacted["messages"] == [body["messages"][0], {"role": "user", "content": "[PHONE]"}]
    call = redact_body(CONTEXT[3], ["phone", "us_ssn"])["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(call) == {"name": "Ann", "phone": "[PHONE]", "ssn": "[US_SSN]"}
    assert redact_body({"model": "auto", "prompt": ["Caller's phone:", "4155552671"]}, ["phone"])["prompt"] == [
        "Caller's phone:", "[PHONE]"]


_FILLER = ("I will look into the account settings and the delivery schedule for you; this can take a moment "
           "while I check the records on our side and make sure nothing else is pending. ") * 2


def test_redaction_removes_what_a_user_scoped_signal_finds_across_the_assistants_turn() -> None:
    """A ``pii`` signal with ``scope: user`` reads the user turns one after another: "my phone number
    follows" is right before the next user turn's bare number, so a redact rule applied. The redaction
    read the whole conversation, where the assistant's long turn sits between them, found nothing, and
    sent the number upstream."""
    body = {"model": "auto", "messages": [
        {"role": "user", "content": "Please call me back, my phone number follows."},
        {"role": "assistant", "content": _FILLER},
        {"role": "user", "content": "4155552671"},
    ]}
    assert PIISignal(kinds=["phone"], scope="user").extract(body).value == ["phone"]
    redacted = redact_body(body, ["phone"])
    assert redacted["messages"][2] == {"role": "user", "content": "[PHONE]"}
    assert redacted["messages"][:2] == body["messages"][:2]


def test_whatever_the_signal_finds_in_any_scope_is_gone_after_redaction() -> None:
    """Random conversations of labels, numbers and filler in every role: each finding of the signal,
    in every scope, is no longer in its message after redaction (19 of 2,000 leaked before the
    redaction read the scopes' texts as the signal does)."""
    fragments = ["my phone number follows.", "SSN:", "call me at", "order number", "Thanks, noted.",
                 "What is your phone number?", "Please confirm your SSN.", "4155552671", "536-22-1234",
                 "536221234", "(415) 555-2671", "ok", _FILLER, "email me: ann@example.com", "+44 20 7946 0958",
                 "my number is"]
    rng = random.Random(7)
    kinds = ["phone", "us_ssn", "email"]
    leaks = []
    for _ in range(2000):
        messages = [{"role": rng.choice(["user", "user", "assistant", "system"]),
                     "content": " ".join(rng.choice(fragments) for _ in range(rng.randint(1, 2)))}
                    for _ in range(rng.randint(1, 6))]
        body = {"model": "auto", "messages": messages}
        redacted = redact_body(body, kinds)["messages"]
        for scope in SCOPES:
            found = PIISignal(kinds=kinds, scope=scope, max_findings=100).extract(body).detail["findings"]
            for finding in found:
                original = messages[finding["message"]]["content"]
                text = original[finding["span"][0]:finding["span"][1]]
                if redacted[finding["message"]]["content"].count(text) >= original.count(text):
                    leaks.append((scope, text, messages))
    assert leaks == []
