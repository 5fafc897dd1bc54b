"""The PII package's layout: public names, the detector registry, and the value validators."""

from __future__ import annotations

import importlib

import pytest

import classifiers.signals as signals
from classifiers.signals import pii
from classifiers.signals.pii.detectors import DETECTORS
from classifiers.signals.pii.validators import email_ok, nino_prefix_ok, random_looking

# Everything the single-module ``classifiers.signals.pii`` exposed stays importable from that path.
PUBLIC = [
    "PII_CATEGORIES",
    "PII_KINDS",
    "Finding",
    "PIISignal",
    "find_pii",
    "redact",
    "redact_body",
    "placeholder",
    "luhn_ok",
    "card_brand",
    "IBAN_LENGTHS",
    "iban_ok",
    "ssn_ok",
    "shannon_entropy",
    "country_code_ok",
    "nanp_ok",
    "jwt_ok",
    "Detector",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_names_keep_their_import_path(name: str) -> None:
    assert name in pii.__all__
    assert getattr(importlib.import_module("classifiers.signals.pii"), name) is getattr(pii, name)


def test_the_signals_package_re_exports_the_same_objects() -> None:
    for name in ("PII_CATEGORIES", "PII_KINDS", "PIISignal", "find_pii", "redact", "redact_body"):
        assert getattr(signals, name) is getattr(pii, name)


def test_the_registry_covers_every_kind_and_only_known_kinds() -> None:
    assert {d.kind for d in DETECTORS} == set(pii.PII_KINDS)
    names = [d.name for d in DETECTORS]
    assert len(names) == len(set(names))
    for d in DETECTORS:
        if d.gate_lower:  # a gate tested against the lower-cased text can only hold lower case
            assert all(g == g.lower() for g in d.gate), d.name


def test_secrets_claim_their_span_before_numbers_and_contacts() -> None:
    kinds = [d.kind for d in DETECTORS]
    last_secret = max(i for i, k in enumerate(kinds) if pii.PII_CATEGORIES[k] == "secret")
    assert last_secret < kinds.index("credit_card") < kinds.index("phone")


SAMPLE = (
    "mail jane.doe@acme-corp.io, card 4111 1111 1111 1111, call +44 20 7946 0958, SSN 536-22-1234, "
    "NI AB123456C, IBAN GB82WEST12345698765432, from 8.8.4.4 and 2001:4860:4860::8888, "
    "key sk-proj-iK2ZWeqhFWCEPyYngFb51yBMWXaSCrUZoL8g, db_password = 'Tr0ub4dor&3xK'"
)


@pytest.mark.parametrize("kind", pii.PII_KINDS)
def test_asking_for_one_kind_reports_only_that_kind(kind: str) -> None:
    found = pii.find_pii(SAMPLE, [kind])
    assert {f.kind for f in found} <= {kind}
    everything = pii.find_pii(SAMPLE)
    # With nothing else claiming spans first, a kind finds at least what it finds among all kinds.
    assert {(f.start, f.end) for f in everything if f.kind == kind} <= {(f.start, f.end) for f in found}


def test_no_kinds_finds_nothing() -> None:
    assert pii.find_pii(SAMPLE, []) == []


@pytest.mark.parametrize(
    ("prefix", "ok"),
    [("AB", True), ("CE", True), ("DA", False), ("AD", False), ("AO", False), ("OA", True), ("QQ", False)]
    + [(p, False) for p in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ")],
)
def test_nino_prefix_rules(prefix: str, ok: bool) -> None:
    assert nino_prefix_ok(prefix) is ok


def test_email_validator() -> None:
    assert email_ok("jane", "acme-corp.io")
    assert not email_ok("user", "example.com")
    assert not email_ok("user", "mail.test")
    assert not email_ok("logo", "2x.PNG")
    assert not email_ok("git", "github.com")
    assert not email_ok("a" * 65, "acme-corp.io")


def test_random_looking_refuses_placeholders_and_words() -> None:
    assert random_looking("iK2ZWeqhFWCEPyYngFb51yBMWXaSCrUZoL8g")
    assert not random_looking("xxxxxxxxxxxxxxxx1")
    assert not random_looking("onlylettershere")


def test_redacting_a_pem_key_removes_its_body() -> None:
    # The closing line refers back to the optional " BLOCK": as an unmatched group that back-reference
    # never matched, so only the BEGIN line was redacted and the key itself went upstream.
    for kind in ("RSA ", "EC ", "OPENSSH ", ""):
        text = f"key:\n-----BEGIN {kind}PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END {kind}PRIVATE KEY-----\nthanks"
        assert pii.redact(text)[0] == "key:\n[PRIVATE_KEY]\nthanks"
    block = "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----"
    assert pii.redact(block)[0] == "[PRIVATE_KEY]"


def test_each_pem_key_ends_at_its_own_end_line() -> None:
    key = "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"
    assert pii.redact(f"a {key} b {key} c")[0] == "a [PRIVATE_KEY] b [PRIVATE_KEY] c"
    # A BEGIN line with no END before the next BEGIN is redacted alone; the next key whole.
    text = f"x -----BEGIN EC PRIVATE KEY-----\nAAA\n{key} y"
    assert pii.redact(text)[0] == "x [PRIVATE_KEY]\nAAA\n[PRIVATE_KEY] y"
    # Repeated BEGIN lines without END (the shape that made the old pattern quadratic): one each.
    assert len(pii.find_pii("-----BEGIN PRIVATE KEY-----" * 2000)) == 2000
