"""Personal data and secrets in a request: detection with validation, and redaction.

Every detector is a candidate regex followed by a validator, so that order numbers, version strings
and test fixtures do not count as personal data:

* ``credit_card`` — 12-19 digits, bare or in the issuers' groups (4-4-4-4, 4-6-5) between spaces or line
  breaks or one repeated ``-`` ``.`` ``/`` ``_``; a known issuer prefix and length, Luhn check.
* ``iban`` — country code with its registered IBAN length, ISO 13616 mod-97 check; in any case (outside
  capitals only in one piece or in groups of four), groups apart by spaces or by dashes (groups of four).
* ``us_ssn`` — SSA rules: area not 000, 666 or 9xx; group not 00; serial not 0000; not a famous
  advertising number. Ungrouped nine-digit runs count only next to an SSN keyword.
* ``uk_nino`` — HMRC prefix rules (no D, F, I, Q, U, V; no O second; not BG, GB, KN, NK, NT, TN, ZZ)
  and suffix A-D; in capitals or in lower case.
* ``email`` — RFC-shaped local part, a domain with a letter TLD (letters and combining marks of any
  script, RFC 6531, and ``xn--`` TLDs); reserved example domains (RFC 2606/6761) and file-name
  look-alikes (``logo@2x.png``) are ignored.
* ``phone`` — ``+`` / ``00`` international numbers with an assigned country calling code and an
  E.164 length (8-15 digits); NANP numbers (area code and exchange ``[2-9]xx``, not ``N11``, not the
  fictional 555-01xx); other national numbers (trunk prefix 0, 9-11 digits). Numbers without any
  separator or ``+`` count only next to a phone keyword; dates and dotted quads never.
* ``ip_address`` — IPv4/IPv6 that are globally routable (private, loopback and documentation ranges
  are not personal data).
* ``api_key`` — provider keys with their documented shapes: OpenAI ``sk-``, Anthropic ``sk-ant-``,
  AWS ``AKIA``/``ASIA`` ids, GitHub ``ghp_``/``github_pat_``, Slack ``xox?-`` and webhooks, Google
  ``AIza``, Stripe ``sk_live_``; random-looking (entropy) bodies only, so ``sk-xxxx...`` placeholders
  and AWS's documented ``...EXAMPLE`` keys are ignored.
* ``private_key`` — PEM private key blocks; ``jwt`` — three base64url segments whose header decodes
  to JSON with an ``alg``.
* ``credential`` — ``password=`` / ``secret:`` / ``api_key=`` style assignments with a
  random-looking literal value (not code, not a placeholder).

Findings carry a confidence from the strength of their validation (a Luhn-valid card with a known
issuer prefix is stronger than a phone number). ``detail`` never contains the matched text: only a
masked preview.

Modules: :mod:`.findings` (the kinds and the :class:`Finding` record), :mod:`.validators`
(checksums, registries, numbering plans), :mod:`.detectors` (patterns, match checks and the one
:data:`DETECTORS` registry, in precedence order), :mod:`.spans` (merging overlapping findings),
:mod:`.scan` (:func:`find_pii`), :mod:`.redact` (text and request rewriting) and :mod:`.extractor`
(the :class:`PIISignal`). Everything public is importable from this package.
"""

from __future__ import annotations

from classifiers.signals.pii.detectors import DETECTORS, Detector
from classifiers.signals.pii.extractor import PIISignal
from classifiers.signals.pii.findings import PII_CATEGORIES, PII_KINDS, Finding
from classifiers.signals.pii.redact import placeholder, redact, redact_body
from classifiers.signals.pii.scan import find_pii
from classifiers.signals.pii.validators import (
    IBAN_LENGTHS,
    card_brand,
    country_code_ok,
    iban_ok,
    jwt_ok,
    luhn_ok,
    nanp_ok,
    shannon_entropy,
    ssn_ok,
)

__all__ = [
    "DETECTORS",
    "IBAN_LENGTHS",
    "PII_CATEGORIES",
    "PII_KINDS",
    "Detector",
    "Finding",
    "PIISignal",
    "card_brand",
    "country_code_ok",
    "find_pii",
    "iban_ok",
    "jwt_ok",
    "luhn_ok",
    "nanp_ok",
    "placeholder",
    "redact",
    "redact_body",
    "shannon_entropy",
    "ssn_ok",
]
