"""Personal data and secrets in a request: detection with validation, and redaction.

Every detector is a candidate regex followed by a validator, so that order numbers, version strings
and test fixtures do not count as personal data:

* ``credit_card`` — 13-19 digits (consistently grouped), a known issuer prefix and length, Luhn check.
* ``iban`` — country code with its registered IBAN length, ISO 13616 mod-97 check.
* ``us_ssn`` — SSA rules: area not 000, 666 or 9xx; group not 00; serial not 0000; not a famous
  advertising number. Ungrouped nine-digit runs count only next to an SSN keyword.
* ``uk_nino`` — HMRC prefix rules (no D, F, I, Q, U, V; no O second; not BG, GB, KN, NK, NT, TN, ZZ)
  and suffix A-D.
* ``email`` — RFC-shaped local part, a domain with a letter TLD; reserved example domains
  (RFC 2606/6761) and file-name look-alikes (``logo@2x.png``) are ignored.
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
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import math
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from classifiers.messages import TextPiece, messages_of, rewrite_message_texts
from classifiers.signals._text import SCOPES, iter_texts
from classifiers.signals.base import Signal

_SEP = "\n\x00\n"

#: Kinds this module reports, grouped for policies that care about a family rather than a kind.
PII_CATEGORIES: dict[str, str] = {
    "email": "contact",
    "phone": "contact",
    "ip_address": "network",
    "credit_card": "financial",
    "iban": "financial",
    "us_ssn": "national_id",
    "uk_nino": "national_id",
    "api_key": "secret",
    "private_key": "secret",
    "jwt": "secret",
    "credential": "secret",
}
PII_KINDS: tuple[str, ...] = tuple(PII_CATEGORIES)


@dataclass(frozen=True, slots=True)
class Finding:
    """One validated match in one text: its kind, span, confidence and a masked preview."""

    kind: str
    start: int
    end: int
    confidence: float
    preview: str
    subtype: str | None = None


# --------------------------------------------------------------------------------------------
# Validators


def luhn_ok(digits: str) -> bool:
    """The Luhn (mod 10) check used by payment card numbers."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def card_brand(digits: str) -> str | None:
    """The issuer whose IIN range and length admit ``digits``, or None."""
    n = len(digits)
    p2, p3, p4, p6 = int(digits[:2]), int(digits[:3]), int(digits[:4]), int(digits[:6])
    if digits[0] == "4" and n in (13, 16, 19):
        return "visa"
    if (51 <= p2 <= 55 or 2221 <= p4 <= 2720) and n == 16:
        return "mastercard"
    if p2 in (34, 37) and n == 15:
        return "amex"
    if (p4 == 6011 or 644 <= p3 <= 649 or p2 == 65 or 622126 <= p6 <= 622925) and 16 <= n <= 19:
        return "discover"
    if 3528 <= p4 <= 3589 and 16 <= n <= 19:
        return "jcb"
    if (300 <= p3 <= 305 or p2 in (36, 38, 39)) and 14 <= n <= 19:
        return "diners"
    if p2 == 62 and 16 <= n <= 19:
        return "unionpay"
    if (p2 == 50 or 56 <= p2 <= 69) and 12 <= n <= 19:
        return "maestro"
    return None


#: Registered IBAN lengths per country (SWIFT IBAN registry).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27,
    "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25,
    "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18,
    "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33,
    "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip


def iban_ok(iban: str) -> bool:
    """ISO 13616: registered length for the country and ``int(rearranged) % 97 == 1``."""
    if IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban[2:4].isdigit():
        return False
    rearranged = iban[4:] + iban[:4]
    try:
        number = int("".join(str(int(ch, 36)) for ch in rearranged))
    except ValueError:
        return False
    return number % 97 == 1


def ssn_ok(area: str, group: str, serial: str) -> bool:
    """SSA assignment rules (post-2011 randomisation still never issues these)."""
    if area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000":
        return False
    # Famous numbers printed in advertising / used as samples, never valid for a person.
    return f"{area}{group}{serial}" not in ("078051120", "219099999", "123456789")


def shannon_entropy(s: str) -> float:
    """Bits per character of ``s`` (random base62 strings score ~5, English words ~3-4)."""
    if not s:
        return 0.0
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _random_looking(s: str, min_entropy: float = 3.3) -> bool:
    """A secret's body: mixed letters and digits, high entropy, no long runs of one character."""
    if not (any(c.isdigit() for c in s) and any(c.isalpha() for c in s)):
        return False
    if re.search(r"(.)\1{5,}", s):  # xxxxxx / 000000 placeholders
        return False
    return shannon_entropy(s) >= min_entropy


# Country calling codes in use (ITU-T E.164 assignments), by length.
_CC1 = {"1", "7"}
_CC2 = {
    "20", "27", "30", "31", "32", "33", "34", "36", "39", "40", "41", "43", "44", "45", "46", "47", "48",
    "49", "51", "52", "53", "54", "55", "56", "57", "58", "60", "61", "62", "63", "64", "65", "66", "81",
    "82", "84", "86", "90", "91", "92", "93", "94", "95", "98",
}  # fmt: skip
_CC3 = frozenset({
    "211", "212", "213", "216", "218", "250", "251", "252", "253", "254", "255", "256", "257", "258", "290", "291",
    "297", "298", "299", "370", "371", "372", "373", "374", "375", "376", "377", "378", "380", "381", "382", "383",
    "385", "386", "387", "389", "420", "421", "423", "670", "672", "673", "674", "675", "676", "677", "678", "679",
    "680", "681", "682", "683", "685", "686", "687", "688", "689", "690", "691", "692", "850", "852", "853", "855",
    "856", "870", "878", "880", "881", "882", "883", "886", "888", "992", "993", "994", "995", "996", "998",
    *(f"{block}{d}" for block in ("22", "23", "24", "26", "35", "50", "59", "96", "97") for d in range(10)),
})  # fmt: skip


def country_code_ok(digits: str) -> bool:
    """Whether ``digits`` (an international number without ``+``) starts with an assigned code."""
    if digits[:1] in _CC1 or digits[:2] in _CC2:
        return True
    return digits[:3] in _CC3


def nanp_ok(digits: str) -> bool:
    """North American Numbering Plan: NXX-NXX-XXXX, no N11 area code, not fictional 555-01XX."""
    if len(digits) == 11 and digits[0] == "1":
        digits = digits[1:]
    if len(digits) != 10:
        return False
    area, exch, line = digits[:3], digits[3:6], digits[6:]
    if area[0] in "01" or exch[0] in "01" or area[1:] == "11":
        return False
    return not (exch == "555" and line.startswith("01"))


def jwt_ok(token: str) -> bool:
    """The header segment decodes (base64url) to a JSON object with an ``alg``."""
    head = token.split(".", 1)[0]
    try:
        raw = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
        obj = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and "alg" in obj


# --------------------------------------------------------------------------------------------
# Detectors


def _mask(text: str, keep_start: int = 0, keep_end: int = 0) -> str:
    """``sk-p…(52 chars)`` / ``…1111 (16 digits)``-style preview that reveals nothing usable."""
    shown_start = text[:keep_start]
    shown_end = text[len(text) - keep_end :] if keep_end else ""
    return f"{shown_start}…{shown_end} ({len(text)} chars)"


_PHONE_WORDS = re.compile(r"(?i)\b(?:phone|tel|telephone|mobile|cell|call|text me|whatsapp|fax|contact|number)\b")
_SSN_WORDS = re.compile(r"(?i)\b(?:ssn|social security|social-security|ss#|taxpayer)\b")
_SECRET_WORDS = re.compile(r"(?i)(?:aws_?secret|secret_?access_?key|secret\s*key)")


def _near(rx: re.Pattern[str], text: str, start: int, end: int, window: int = 40) -> bool:
    return rx.search(text, max(0, start - window), min(len(text), end + window)) is not None


Detector = Callable[[str], Iterable[Finding]]

# The boundary look-behinds sit after the first character so that the regex engine can still skip
# quickly to candidate characters (a leading look-behind disables that and costs ~3x).
_CARD_RE = re.compile(r"\d(?<![\d.,-]\d)(?:[ -]?\d){11,18}(?![\d-]|[.,]\d)")
_CARD_GROUPED = re.compile(r"^\d{4}([ -])\d{4}\1\d{4}\1\d{4}(?:\1\d{1,3})?$|^\d{4}([ -])\d{6}\2\d{4,5}$")


def _cards(text: str) -> Iterable[Finding]:
    for m in _CARD_RE.finditer(text):
        raw = m.group(0)
        digits = raw.replace(" ", "").replace("-", "")
        if not 12 <= len(digits) <= 19 or len(set(digits)) < 2:
            continue
        # Grouped numbers must use the issuers' groupings; a bare run is fine, mixed spacing is not.
        if raw != digits and not _CARD_GROUPED.match(raw):
            continue
        brand = card_brand(digits)
        if brand is None or not luhn_ok(digits):
            continue
        conf = 0.8 if brand == "maestro" else 0.95
        yield Finding("credit_card", m.start(), m.end(), conf, f"…{digits[-4:]} ({len(digits)} digits)", brand)


_IBAN_RE = re.compile(r"[A-Z](?<!\w[A-Z])[A-Z]\d{2}(?: ?[A-Z0-9]){10,32}\b")


def _ibans(text: str) -> Iterable[Finding]:
    for m in _IBAN_RE.finditer(text):
        raw = m.group(0)
        expected = IBAN_LENGTHS.get(raw[:2])
        if expected is None:
            continue
        # The candidate may run into following upper-case words; take exactly the registered length.
        compact_len = 0
        end = m.start()
        for i, ch in enumerate(raw):
            if ch != " ":
                compact_len += 1
                if compact_len == expected:
                    end = m.start() + i + 1
                    break
        if compact_len != expected:
            continue
        if end < len(text) and text[end].isalnum():
            continue  # the number goes on: not this IBAN
        iban = text[m.start() : end].replace(" ", "")
        if iban_ok(iban):
            yield Finding("iban", m.start(), end, 0.97, f"{iban[:2]}…{iban[-2:]} ({len(iban)} chars)")


_SSN_RE = re.compile(r"(\d(?<![\d-]\d)\d\d)([- ]?)(\d{2})\2(\d{4})(?![\d-])")


def _ssns(text: str) -> Iterable[Finding]:
    for m in _SSN_RE.finditer(text):
        area, sep, group, serial = m.groups()
        if not ssn_ok(area, group, serial):
            continue
        context = _near(_SSN_WORDS, text, m.start(), m.end())
        if not sep and not context:
            continue  # nine bare digits are more often an id or an amount than an SSN
        conf = 0.95 if context else (0.85 if sep == "-" else 0.6)
        yield Finding("us_ssn", m.start(), m.end(), conf, f"…{serial[-2:]} (9 digits)")


_NINO_RE = re.compile(r"[A-CEGHJ-PR-TW-Z](?<!\w[A-Z])[A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
_NINO_BANNED = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})


def _ninos(text: str) -> Iterable[Finding]:
    for m in _NINO_RE.finditer(text):
        if m.group(0)[:2] in _NINO_BANNED:
            continue
        yield Finding("uk_nino", m.start(), m.end(), 0.85, f"{m.group(0)[:1]}…{m.group(0)[-1:]} (9 chars)")


# The look-behind refuses a start inside a run of local-part characters: otherwise "@" followed by
# a long run of "!" or "#" would be re-scanned from every position in it (quadratic: 100 s for 64 KB).
_EMAIL_RE = re.compile(
    r"(?<![\w.%+!#$&'*/=?^`{|}~-])([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*)"
    r"@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24}))(?![\w-]|\.\w)"
)
_RESERVED_DOMAINS = re.compile(r"(?:^|\.)(?:example\.(?:com|org|net)|example|test|invalid|localhost|local)$", re.I)
# File extensions that are not TLDs: "icon@2x.png", "pkg@1.0.0.tgz" are not addresses.
_FILE_TLDS = frozenset({
    "png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "tif", "tiff", "js", "mjs", "cjs", "ts", "tsx", "jsx",
    "css", "scss", "json", "yaml", "yml", "toml", "txt", "html", "htm", "xml", "lock", "tgz", "gz", "bz2", "whl",
    "jar", "dll", "exe",
})  # fmt: skip


def _emails(text: str) -> Iterable[Finding]:
    for m in _EMAIL_RE.finditer(text):
        local, domain, tld = m.group(1), m.group(2), m.group(3)
        if len(local) > 64 or len(domain) > 253 or tld.lower() in _FILE_TLDS:
            continue
        if _RESERVED_DOMAINS.search(domain) or local.lower() == "git":  # git@github.com is a URL
            continue
        yield Finding("email", m.start(), m.end(), 0.9, f"{local[:1]}…@…{domain[domain.rfind('.') :]}")


_PHONE_RE = re.compile(r"[+(\d](?<![\w+.-][+(\d])(?:(?<=\+)\(?\d|(?<=\()\d|(?<=\d))[\d ().-]{5,20}\d(?![\w-]|\.\d)")
_DATE_LIKE = re.compile(r"^\d{1,4}[-./]\d{1,2}[-./]\d{1,4}$")
_DOTTED_QUAD = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")


def _phone_groups_ok(raw: str, intl: bool, nanp: bool) -> bool:
    """Digit groups as people write phone numbers, so that ``1 2 3 4 5 6 7 8 9 10`` is not one."""
    groups = [len(g) for g in re.findall(r"\d+", raw)]
    if len(groups) == 1:
        return True
    if intl:
        return len(groups) <= 6 and all(g >= 2 for g in groups[1:])
    if nanp:
        return groups in ([3, 3, 4], [1, 3, 3, 4], [3, 7])
    return len(groups) <= 5 and all(g >= 2 for g in groups)


def _phones(text: str) -> Iterable[Finding]:
    for m in _PHONE_RE.finditer(text):
        raw = m.group(0)
        if raw.count("(") != raw.count(")") or _DATE_LIKE.match(raw) or _DOTTED_QUAD.match(raw):
            continue
        digits = re.sub(r"\D", "", raw)
        intl = raw.startswith(("+", "00"))
        if raw.startswith("00"):
            digits = digits[2:]
        separated = any(c in raw for c in " ().-")
        context = _near(_PHONE_WORDS, text, m.start(), m.end())
        nanp = not intl and nanp_ok(digits)
        if not _phone_groups_ok(raw, intl, nanp):
            continue
        if intl:
            ok = 8 <= len(digits) <= 15 and country_code_ok(digits)
            if digits.startswith("1"):
                ok = ok and nanp_ok(digits)
            conf = 0.9
        elif nanp:
            ok = separated or context
            conf = 0.85 if separated and context else 0.75
        else:
            # National formats elsewhere: trunk prefix 0 then a non-zero digit, 9-11 digits in all.
            ok = 9 <= len(digits) <= 11 and digits[0] == "0" and digits[1] != "0" and (separated or context)
            conf = 0.7 if context else 0.55
        if ok:
            yield Finding("phone", m.start(), m.end(), conf, f"…{digits[-2:]} ({len(digits)} digits)")


_IPV4_RE = re.compile(r"\d(?<![\w.]\d)\d{0,2}(?:\.\d{1,3}){3}(?!\w|\.\d)")
# Global IPv6 unicast addresses start with a hex digit (2000::/3), never with "::".
_IPV6_RE = re.compile(
    r"[0-9A-Fa-f](?<![\w:][0-9A-Fa-f])[0-9A-Fa-f]{0,3}(?::[0-9A-Fa-f]{0,4}){2,7}(?<=[0-9A-Fa-f])(?![\w:])"
)
_VERSION_BEFORE = re.compile(r"(?i)\b(?:v|version|ver\.?)\s*$")


def _ips(text: str) -> Iterable[Finding]:
    for rx in (_IPV4_RE, _IPV6_RE):
        for m in rx.finditer(text):
            raw = m.group(0)
            if rx is _IPV6_RE and len([g for g in raw.split(":") if g]) < 3:
                continue  # 12:30:45 is a time, b[::2] a slice
            try:
                ip = ipaddress.ip_address(raw)
            except ValueError:
                continue
            if not ip.is_global or _VERSION_BEFORE.search(text, max(0, m.start() - 10), m.start()):
                continue
            yield Finding("ip_address", m.start(), m.end(), 0.7, f"IPv{ip.version} …")


_PEM_RE = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY( BLOCK)?-----(?:.*?-----END \1PRIVATE KEY\2-----)?", re.S
)
_JWT_RE = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}")

# (subtype, gate, regex, group holding the random body, min entropy). The gate is a set of
# lower-case substrings one of which must occur for the regex to be worth running: a plain substring
# test costs ~1 µs per 2 KB, a regex scan ~15-40 µs.
_KEY_RULES: list[tuple[str, tuple[str, ...], re.Pattern[str], int, float]] = [
    ("anthropic", ("sk-ant-",), re.compile(r"(?<![\w-])sk-ant-(?:api|admin)\d\d-([A-Za-z0-9_-]{40,})"), 1, 3.5),
    (
        "openai",
        ("sk-",),
        re.compile(r"(?<![\w-])sk-(?:(?:proj|svcacct|admin|None)-)?([A-Za-z0-9_-]{20,})(?![\w-])"),
        1,
        3.5,
    ),
    (
        "aws_access_key_id",
        ("akia", "asia", "abia", "acca", "aida", "aroa"),
        re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA|AIDA|AROA)([A-Z0-9]{16})\b"),
        1,
        2.8,
    ),
    (
        "github",
        ("gh", "github_pat_"),
        re.compile(r"\b(?:gh[pousr]_([A-Za-z0-9]{36,255})|github_pat_([A-Za-z0-9_]{70,}))\b"),
        0,
        3.5,
    ),
    ("slack", ("xox",), re.compile(r"\bxox[abposr]-((?:[A-Za-z0-9]+-){1,4}[A-Za-z0-9]{8,})"), 1, 3.0),
    (
        "slack_webhook",
        ("hooks.slack.com",),
        re.compile(r"https://hooks\.slack\.com/services/(T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]{16,})"),
        1,
        3.0,
    ),
    ("google_api_key", ("aiza",), re.compile(r"\bAIza([0-9A-Za-z_-]{35})(?![\w-])"), 1, 3.5),
    ("stripe", ("_live_",), re.compile(r"\b(?:sk|rk)_live_([A-Za-z0-9]{20,})\b"), 1, 3.5),
    (
        "aws_secret_access_key",
        ("secret",),
        re.compile(r"(?<![A-Za-z0-9/+])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"),
        1,
        4.0,
    ),
]
_KEY_PREFIX_SHOWN = {"openai": 3, "anthropic": 7, "aws_access_key_id": 4, "github": 4, "slack": 4,
                     "slack_webhook": 23, "google_api_key": 4, "stripe": 8, "aws_secret_access_key": 0}  # fmt: skip

_CRED_RE = re.compile(
    # The name may carry a prefix (DB_PASSWORD, stripe_api_key): only a letter or digit may not precede it.
    r"(?i)(?<![a-z0-9])(password|passwd|pwd|passphrase|secret|client_secret|api[_-]?key|access[_-]?token|auth[_-]?token)"
    r"\b[\"']?\s*(?:[:=]|=>|\bis\b)\s*([\"']?)([^\s\"'`,;)\]}]{8,128})\2"
)
_PLACEHOLDER = re.compile(
    r"(?i)^(?:<.*>|\$\{?.*|\{\{.*|%.*|your[_-].*|.*(?:xxx|\*\*\*|\.\.\.|changeme|example|redacted|placeholder).*)$"
)


_CRED_GATE = ("pass", "pwd", "secret", "key", "token")


def _secrets(text: str) -> Iterable[Finding]:
    low = text.lower()
    if "private key" in low:
        for m in _PEM_RE.finditer(text):
            yield Finding("private_key", m.start(), m.end(), 0.99, "-----BEGIN …PRIVATE KEY-----", "pem")
    if "eyj" in low:
        for m in _JWT_RE.finditer(text):
            if jwt_ok(m.group(0)):
                yield Finding("jwt", m.start(), m.end(), 0.95, _mask(m.group(0), 3), "jwt")
    for subtype, gate, rx, grp, min_h in _KEY_RULES:
        if not any(g in low for g in gate):
            continue
        for m in rx.finditer(text):
            body = m.group(grp) if grp else next(g for g in m.groups() if g)
            if body.endswith("EXAMPLE") or not _random_looking(body, min_h):
                continue
            if subtype == "aws_secret_access_key" and not _near(_SECRET_WORDS, text, m.start(), m.end(), 60):
                continue  # 40 base64 characters alone could be anything (a hash, a blob)
            conf = 0.8 if subtype == "aws_secret_access_key" else 0.95
            shown = _KEY_PREFIX_SHOWN[subtype]
            yield Finding("api_key", m.start(), m.end(), conf, _mask(m.group(0), shown), subtype)
    if not any(g in low for g in _CRED_GATE):
        return
    for m in _CRED_RE.finditer(text):
        value = m.group(3)
        if _PLACEHOLDER.match(value) or "(" in value or not _random_looking(value, 2.8):
            continue
        yield Finding("credential", m.start(3), m.end(3), 0.75, _mask(value), m.group(1).lower())


# Order matters: a span claimed by an earlier detector is not reported again by a later one (a card
# number is not also a phone number; a key inside a credential assignment is an api_key).
_DETECTORS: dict[str, Detector] = {
    "secrets": _secrets,
    "credit_card": _cards,
    "iban": _ibans,
    "us_ssn": _ssns,
    "uk_nino": _ninos,
    "email": _emails,
    "ip_address": _ips,
    "phone": _phones,
}
_DETECTOR_KINDS: dict[str, tuple[str, ...]] = {
    "secrets": ("api_key", "private_key", "jwt", "credential"),
    "credit_card": ("credit_card",),
    "iban": ("iban",),
    "us_ssn": ("us_ssn",),
    "uk_nino": ("uk_nino",),
    "email": ("email",),
    "ip_address": ("ip_address",),
    "phone": ("phone",),
}
#: A cheap character-class gate per detector: skip a scan outright when its text cannot match.
_GATES: dict[str, Callable[[str], bool]] = {
    "email": lambda t: "@" in t,
    "ip_address": lambda t: "." in t or ":" in t,
}


_DIGIT = re.compile(r"\d")


def find_pii(text: str, kinds: Iterable[str] | None = None) -> list[Finding]:
    """Validated findings in ``text``, sorted by position, without overlaps."""
    wanted = set(kinds) if kinds is not None else None
    found: list[Finding] = []  # sorted by start
    starts: list[int] = []
    has_digit = _DIGIT.search(text) is not None
    for det_name, det in _DETECTORS.items():
        det_kinds = _DETECTOR_KINDS[det_name]
        if wanted is not None and not wanted.intersection(det_kinds):
            continue
        if det_name not in ("secrets", "email") and not has_digit:
            continue
        gate = _GATES.get(det_name)
        if gate is not None and not gate(text):
            continue
        for f in det(text):
            if wanted is not None and f.kind not in wanted:
                continue
            # Claimed spans never overlap, so sorted starts let each check look at two neighbours
            # (a linear scan here made a 100 KB text with 15k findings take a second).
            i = bisect_right(starts, f.start)
            if (i and found[i - 1].end > f.start) or (i < len(found) and found[i].start < f.end):
                continue
            starts.insert(i, f.start)
            found.insert(i, f)
    return found


def placeholder(kind: str) -> str:
    """The typed placeholder a finding is replaced with, e.g. ``[EMAIL]``."""
    return f"[{kind.upper()}]"


def redact(text: str, kinds: Iterable[str] | None = None) -> tuple[str, list[Finding]]:
    """Replace every finding in ``text`` with its typed placeholder; return the text and findings.

    Spans in the returned findings refer to the *original* text.
    """
    findings = find_pii(text, kinds)
    if not findings:
        return text, findings
    out: list[str] = []
    pos = 0
    for f in findings:
        out.append(text[pos : f.start])
        out.append(placeholder(f.kind))
        pos = f.end
    out.append(text[pos:])
    return "".join(out), findings


def redact_body(body: Mapping[str, Any], kinds: Iterable[str] | None = None) -> dict[str, Any]:
    """A copy of a chat request whose message texts are redacted; everything else is untouched.

    Redacted: string ``content``, ``text`` of content parts, the legacy ``prompt``, and the string
    values inside tool-call ``arguments`` (parsed as JSON, redacted value by value and re-serialised,
    so the arguments stay valid JSON; arguments that are not JSON are redacted as text). Not
    redacted: roles, names, ids, tool definitions, images, ``refusal`` parts and every request
    parameter. The input is never modified; what holds no finding is shared with it, not copied.
    """
    wanted = tuple(kinds) if kinds is not None else None

    def redacted(piece: TextPiece) -> str:
        if piece.source == "tool_call":
            return _redact_arguments(piece.text, wanted)
        return redact(piece.text, wanted)[0]

    return rewrite_message_texts(body, redacted)


def _redact_arguments(args: str, kinds: tuple[str, ...] | None) -> str:
    if not find_pii(args, kinds):
        return args  # keep the client's exact bytes when there is nothing to hide
    try:
        parsed = json.loads(args)
    except (ValueError, RecursionError):  # not JSON, or nested beyond what can be walked: plain text
        return redact(args, kinds)[0]

    def walk(obj: Any) -> Any:
        if isinstance(obj, str):
            return redact(obj, kinds)[0]
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, int) and not isinstance(obj, bool) and find_pii(str(obj), kinds):
            return placeholder(find_pii(str(obj), kinds)[0].kind)  # a card number sent as a JSON number
        return obj

    try:
        return json.dumps(walk(parsed), ensure_ascii=False)
    except RecursionError:  # arguments nested too deep to rebuild: redact them as text instead
        return redact(args, kinds)[0]


class PIISignal:
    """``value``: sorted list of PII kinds found anywhere in the request (falsy when none).

    ``detail``: ``findings`` (kind, subtype, message index, role, where in the message, confidence,
    masked preview — never the matched text), ``counts`` per kind and ``categories`` (contact,
    financial, national_id, secret, network). Confidence: the highest finding confidence, or 1.0
    when nothing was found. ``kinds`` limits detection to a subset of :data:`PII_KINDS`; ``scope``
    (``all`` by default: every message incl. the system prompt, tool results and tool-call
    arguments; or ``user``, ``last_user``, ``system``) limits where to look — e.g. ``user`` when the
    operator's own system prompt legitimately carries a support address.
    """

    def __init__(
        self, name: str = "pii", kinds: Iterable[str] | None = None, max_findings: int = 20, scope: str = "all"
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        self.name = name
        self.scope = scope
        self.kinds: tuple[str, ...] | None = None
        if kinds is not None:
            ks = tuple(kinds)
            unknown = [k for k in ks if k not in PII_CATEGORIES]
            if unknown:
                raise ValueError(f"unknown PII kind(s) {unknown}; known: {', '.join(PII_KINDS)}")
            self.kinds = ks
        self.max_findings = max_findings

    def extract(self, body: Mapping[str, Any]) -> Signal:
        """Scan every message (content, tool results, tool-call arguments) for personal data."""
        pieces = list(iter_texts(body, self.scope))
        # One scan over all texts joined (far cheaper than ~10 scans per message), then each finding
        # is mapped back to its message. The separator holds a NUL so that no detector pattern
        # (all of which stop at whitespace or control characters) joins two messages into one match.
        starts: list[int] = []
        pos = 0
        for p in pieces:
            starts.append(pos)
            pos += len(p.text) + len(_SEP)
        joined = _SEP.join(p.text for p in pieces)
        findings: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        best = 0.0
        for f in find_pii(joined, self.kinds):
            i = bisect_right(starts, f.start) - 1
            piece = pieces[i]
            start = f.start - starts[i]
            if start >= len(piece.text):
                continue  # inside a separator
            counts[f.kind] = counts.get(f.kind, 0) + 1
            best = max(best, f.confidence)
            if len(findings) < self.max_findings:
                findings.append(
                    {
                        "kind": f.kind,
                        "subtype": f.subtype,
                        "message": piece.message,
                        "role": piece.role,
                        "source": piece.source,
                        "span": [start, min(f.end - starts[i], len(piece.text))],
                        "confidence": f.confidence,
                        "preview": f.preview,
                    }
                )
        kinds = sorted(counts)
        detail = {
            "findings": findings,
            "counts": counts,
            "categories": sorted({PII_CATEGORIES[k] for k in kinds}),
            "messages_scanned": len(messages_of(body)),
        }
        return Signal(self.name, kinds, best if kinds else 1.0, detail)
