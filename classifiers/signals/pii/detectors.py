"""The detectors: per kind, a candidate pattern and the check that turns a match into a finding.

:data:`DETECTORS` is the one registry :func:`~classifiers.signals.pii.scan.find_pii` runs, in order.
Each entry names the kind it reports and what selection needs to know (whether it can only match a
text holding a digit, and a cheap substring gate), so that a scan for a few kinds or over a text that
cannot match skips a detector without running its regex.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from classifiers.signals._fold import _ranges as ranges_class
from classifiers.signals.pii.findings import Finding
from classifiers.signals.pii.validators import (
    IBAN_LENGTHS,
    card_brand,
    country_code_ok,
    email_ok,
    iban_ok,
    jwt_ok,
    luhn_ok,
    nanp_ok,
    nino_prefix_ok,
    random_looking,
    ssn_ok,
)

#: ``check(match, text)``: the finding for a candidate match in ``text``, or None when it fails validation.
MatchCheck = Callable[[re.Match[str], str], Finding | None]


@dataclass(frozen=True, slots=True)
class Detector:
    """One way of finding one kind of personal data or secret.

    ``pattern`` proposes candidates; ``check`` validates each (checksums, registries, context words
    nearby) and builds its :class:`Finding` of kind ``kind``. Selection: the detector runs only when
    ``kind`` is wanted; when ``needs_digit``, only over a text holding a digit; when ``gate`` is
    non-empty, only when one of those substrings occurs in the text (lower-cased first when
    ``gate_lower``): a plain substring test costs ~1 µs per 2 KB, a regex scan ~15-40 µs.
    """

    name: str
    kind: str
    pattern: re.Pattern[str]
    check: MatchCheck
    needs_digit: bool = True
    gate: tuple[str, ...] = ()
    gate_lower: bool = False


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


# --------------------------------------------------------------------------------------------
# Payment cards, IBANs, national ids

# The boundary look-behinds sit after the first character so that the regex engine can still skip
# quickly to candidate characters (a leading look-behind disables that and costs ~3x). That first
# character is [0-9], not \d, in every pattern that starts with a digit: the scanned text holds only ASCII
# digits (the fold makes every decimal digit ASCII), and the engine skips to an ASCII range faster than
# to a Unicode category (2 KB of text with numbers: 25 instead of 31 us for cards, 18 instead of 32 for
# phones).
# Groups are the issuers' (4-4-4-4 with up to 3 more digits, 4-6-5 / 4-6-4) or none, so that the groups
# themselves refuse a number before or after a card ("qty 2 4111 1111 1111 1111" still holds one).
# Whitespace between groups may vary (a card wrapped onto the next line); a punctuation separator
# (- . / _, spaces around it allowed) must be the same throughout: "4111.1111-1111/1111" is not a card.
_CARD_WS = r"(?:[ \t]{1,3}|[ \t]{0,3}\r?\n[ \t]{0,3})"


def _card_groups(first: str, again: str) -> tuple[str, str]:
    """The 4-4-4-4(-1..3) and the 4-6-5 / 4-6-4 groupings after a first digit matched apart, ``first``
    between the first two groups and ``again`` between the others."""
    return (
        rf"\d{{3}}{first}\d{{4}}{again}\d{{4}}{again}\d{{4}}(?:{again}\d{{1,3}})?",
        rf"\d{{3}}{first}\d{{6}}{again}\d{{4,5}}",
    )


def _card_pattern() -> re.Pattern[str]:
    """The candidate pattern: a bare run of 12-19 digits or the issuers' groupings (see above)."""
    spaced = _card_groups(_CARD_WS, _CARD_WS)
    # One capture group per alternative: a back-reference names the separator its alternative captured.
    dotted16, _ = _card_groups(r"[ \t]?(?P<s16>[-./_])[ \t]?", r"[ \t]?(?P=s16)[ \t]?")
    _, dotted15 = _card_groups(r"[ \t]?(?P<s15>[-./_])[ \t]?", r"[ \t]?(?P=s15)[ \t]?")
    shapes = "|".join([r"\d{11,18}", *spaced, dotted16, dotted15])
    # Not a piece of a longer number: no digit, decimal point, comma or minus just before; no digit or
    # separator-and-digit just after (4111.1111.1111.1111.2 reads as one dotted number).
    return re.compile(rf"[0-9](?<![\d.,-]\d)(?<!\d[/_]\d)(?:{shapes})(?![\d-]|[.,/_]\d)")


_CARD_RE = _card_pattern()
_NON_DIGIT = re.compile(r"\D")


def _after_digits(raw: str, n: int) -> int:
    """The index just after the ``n``-th digit of ``raw`` (which holds at least ``n``)."""
    for i, ch in enumerate(raw):
        if "0" <= ch <= "9":
            n -= 1
            if n == 0:
                return i + 1
    return len(raw)


def _card_brand(digits: str) -> str | None:
    """The issuer of a valid card number ``digits``, or None."""
    if len(set(digits)) < 2 or not luhn_ok(digits):
        return None
    return card_brand(digits)


def _card(m: re.Match[str], text: str) -> Finding | None:
    raw = m.group(0)
    digits = _NON_DIGIT.sub("", raw)
    end = m.end()
    brand = _card_brand(digits)
    if brand is None and len(digits) > 16 and not raw.isdigit():
        # Four groups of four then, after a space or line break, a short number ("4111 1111 1111 1111 01 27":
        # an expiry date, a count): the pattern took it for a fifth group; the card is the first four.
        # After a dot, slash or dash it is read as one longer number, as the pattern reads 4111.1111.1111.1111.22.
        cut = _after_digits(raw, 16)
        if raw[cut].isspace():
            digits, end = digits[:16], m.start() + cut
            brand = _card_brand(digits)
    if brand is None:
        return None
    conf = 0.8 if brand == "maestro" else 0.95
    return Finding("credit_card", m.start(), end, conf, f"…{digits[-4:]} ({len(digits)} digits)", brand)


# The match is the country code and check digits only; the rest is read by a look-ahead, so that a
# candidate running on into the next words ("DE89 3704 0044 0532 0130 00 OR GB82 WEST ...") does not hide
# an IBAN starting among them from the next search. Any case: people type "gb82 west ..." too. It is
# anchored on the first check digit (letters are everywhere in prose, two letters then two digits not).
_IBAN_RE = re.compile(r"[0-9](?<=\b[A-Za-z]{2}[0-9])[0-9](?=((?:[ -]?[A-Za-z0-9]){10,32})\b)")
# How an IBAN is written when not in capitals: in one piece or in the print format's groups of four.
_IBAN_WRITTEN = re.compile(r"[A-Za-z0-9]+|[A-Za-z0-9]{4}(?: [A-Za-z0-9]{4})*(?: [A-Za-z0-9]{1,3})?")
# With dashes (DE89-3704-0044-0532-0130-00, as forms and spreadsheets write it), in any case: only in
# those groups of four, the way dashes are written in order numbers and ids being anything.
_IBAN_DASHED = re.compile(r"[A-Za-z0-9]{4}(?:-[A-Za-z0-9]{4})+(?:-[A-Za-z0-9]{1,3})?")


def _iban(m: re.Match[str], text: str) -> Finding | None:
    start = m.start() - 2
    raw = text[start : m.end()] + m.group(1)
    expected = IBAN_LENGTHS.get(raw[:2].upper())
    if expected is None:
        return None
    # The candidate may run into following words; take exactly the registered length.
    compact_len = 0
    end = start
    for i, ch in enumerate(raw):
        if ch != " " and ch != "-":
            compact_len += 1
            if compact_len == expected:
                end = start + i + 1
                break
    if compact_len != expected:
        return None
    written = text[start:end]
    if "-" in written:
        if not _IBAN_DASHED.fullmatch(written) or (text.startswith("-", end) and text[end + 1 : end + 2].isalnum()):
            return None  # dashes elsewhere than between groups of four, or the dashed number goes on
    elif not written.isupper() and not _IBAN_WRITTEN.fullmatch(written):
        # Lower-case words run together far more often than capitals do: outside capitals, only the
        # shapes IBANs are written in (the mod-97 check alone would pass one candidate in 97).
        return None
    if end < len(text) and text[end].isalnum():
        return None  # the number goes on: not this IBAN
    iban = written.replace(" ", "").replace("-", "").upper()
    if not iban_ok(iban):
        return None
    return Finding("iban", start, end, 0.97, f"{iban[:2]}…{iban[-2:]} ({len(iban)} chars)")


_SSN_RE = re.compile(r"([0-9](?<![\d-]\d)\d\d)([- ]?)(\d{2})\2(\d{4})(?![\d-])")


def _ssn(m: re.Match[str], text: str) -> Finding | None:
    area, sep, group, serial = m.groups()
    if not ssn_ok(area, group, serial):
        return None
    context = _near(_SSN_WORDS, text, m.start(), m.end())
    if not sep and not context:
        return None  # nine bare digits are more often an id or an amount than an SSN
    conf = 0.95 if context else (0.85 if sep == "-" else 0.6)
    return Finding("us_ssn", m.start(), m.end(), conf, f"…{serial[-2:]} (9 digits)")


# The letter classes already leave out the letters HMRC never uses; the never-issued pairs are
# refused by the check. Either case: "ab 12 34 56 c" is typed as often as "AB 12 34 56 C". Anchored on
# the first digit, as the IBAN is: from the letters, a pattern in either case was tried at every
# lower-case letter of prose (2 KB: 39 us instead of 9; from the digit, 12).
_NINO_FIRST = "A-CEGHJ-PR-TW-Za-ceghj-pr-tw-z"
_NINO_SECOND = "A-CEGHJ-NPR-TW-Za-ceghj-npr-tw-z"
_NINO_RE = re.compile(
    rf"[0-9](?<=[A-Za-z ][0-9])"
    rf"(?:(?<=\b[{_NINO_FIRST}][{_NINO_SECOND}][0-9])|(?<=\b[{_NINO_FIRST}][{_NINO_SECOND}] [0-9]))"
    r"\d ?\d{2} ?\d{2} ?[A-Da-d]\b"
)


def _nino(m: re.Match[str], text: str) -> Finding | None:
    start = m.start() - (3 if text[m.start() - 1] == " " else 2)
    raw = text[start : m.end()]
    letters = raw[:2] + raw[-1]
    # One case throughout: "Ab123456c" reads as an identifier someone made up, not a number HMRC wrote.
    if not (letters.isupper() or letters.islower()) or not nino_prefix_ok(raw[:2].upper()):
        return None
    return Finding("uk_nino", start, m.end(), 0.85, f"{raw[:1]}…{raw[-1:]} (9 chars)")


# --------------------------------------------------------------------------------------------
# Contact and network


def _combining_marks() -> tuple[str, str]:
    """Character class bodies for the combining marks (Unicode category M: Mn, Mc, Me) of the Basic
    Multilingual Plane, and for those of the planes beyond, in ranges.

    ``\\w`` holds letters and digits but no marks, and most scripts of South and South-East Asia
    write words with them (the vowel signs and virama of "उपयोगकर्ता"), as does decomposed Latin
    ("mu\\u0308ller"). Computed from :mod:`unicodedata` (the database ``\\w`` itself follows) on
    import: ~8 ms, and ~3 ms to compile the e-mail pattern with them. No mark lies at or beyond
    U+20000 but the variation selectors supplement's.
    """
    codes = [c for c in range(0x300, 0x20000) if unicodedata.category(chr(c))[0] == "M"]
    codes += [c for c in range(0xE0100, 0xE01F0) if unicodedata.category(chr(c))[0] == "M"]
    return ranges_class([c for c in codes if c < 0x10000]), ranges_class([c for c in codes if c >= 0x10000])


_M, _M_ASTRAL = _combining_marks()
_M_ALL = _M + _M_ASTRAL
_LOCAL = rf"[\w{_M}!#$%&'*+/=?^`{{|}}~-]"
# Letters and digits of any script (\w, [^\W_]) and combining marks (never first in a domain label or
# a TLD): internationalised addresses (RFC 6531) such as jürgen@müller.de, jane@例え.jp or
# उपयोगकर्ता@उदाहरण.भारत, and TLDs in Unicode or in their xn-- (punycode) form.
# The local part, tried at every word of the text, holds the marks of the BMP (every script in modern
# everyday use writes its marks there); one beyond it (Chakma, Adlam ...) goes on with a run that holds
# them all, after a one-range test for such a character: a class with the ~150 ranges of marks beyond
# the BMP tests them one by one on each character it refuses (the scan of text with an "@" 4x slower).
# The domain, read only after an "@", holds them all. The runs are possessive: a run of marks given back
# one by one to be split between runs is exponential.
_LOCAL_GOES_ON = rf"(?:\.{_LOCAL}++|(?=[\U00010000-\U0010ffff])[\w{_M_ALL}!#$%&'*+/=?^`{{|}}~-]++)"
# The look-behinds refuse a start inside a run of local-part characters (the second one after a mark
# beyond the BMP, one range first): otherwise "@" followed by a long run of "!" or "#" would be re-read
# from every position in it (quadratic: 100 s for 64 KB).
_EMAIL_RE = re.compile(
    rf"(?<![\w{_M}.%+!#$&'*/=?^`{{|}}~-])(?!(?<=[\U00010000-\U0010ffff])(?<=[{_M_ASTRAL}]))"
    rf"({_LOCAL}++{_LOCAL_GOES_ON}*+)"
    rf"@((?:[^\W_](?:[\w{_M_ALL}-]{{0,61}}(?:[^\W_]|[{_M_ALL}]))?\.)+"
    rf"([^\W\d_](?:[^\W\d_]|[{_M_ALL}]){{1,23}}|xn--[A-Za-z0-9-]{{2,59}}))(?![\w{_M_ALL}-]|\.\w)"
)


def _email(m: re.Match[str], text: str) -> Finding | None:
    local, domain = m.group(1), m.group(2)
    if not email_ok(local, domain):
        return None
    return Finding("email", m.start(), m.end(), 0.9, f"{local[:1]}…@…{domain[domain.rfind('.') :]}")


_PHONE_RE = re.compile(r"[+(0-9](?<![\w+.-][+(\d])(?:(?<=\+)\(?\d|(?<=\()\d|(?<=\d))[\d ().-]{5,20}\d(?![\w-]|\.\d)")
_DATE_LIKE = re.compile(r"^\d{1,4}[-./]\d{1,2}[-./]\d{1,4}$")
_DOTTED_QUAD = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
_DIGIT_RUN = re.compile(r"\d+")


#: The trunk 0 of an international number in brackets (``+44 (0)20 ...``): dialled only from inside the country.
_TRUNK_ZERO = re.compile(r"\(0\)")


def _phone_groups_ok(raw: str, intl: bool, nanp: bool) -> bool:
    """Digit groups as people write phone numbers, so that ``1 2 3 4 5 6 7 8 9 10`` is not one.

    After an international country code the area code may be one digit (``+33 6 12 34 56 78``,
    ``+31 6 ...``, ``+46 8 ...``); every later group has two or more."""
    groups = [len(g) for g in _DIGIT_RUN.findall(raw)]
    if len(groups) == 1:
        return True
    if intl:
        return len(groups) <= 6 and all(g >= 2 for g in groups[2:])
    if nanp:
        return groups in ([3, 3, 4], [1, 3, 3, 4], [3, 7])
    return len(groups) <= 5 and all(g >= 2 for g in groups)


def _phone(m: re.Match[str], text: str) -> Finding | None:
    raw = m.group(0)
    if raw.count("(") != raw.count(")") or _DATE_LIKE.match(raw) or _DOTTED_QUAD.match(raw):
        return None
    intl = raw.startswith(("+", "00"))
    if intl:
        raw = _TRUNK_ZERO.sub(" ", raw)  # read as dialled from abroad: without the bracketed trunk 0
    digits = _NON_DIGIT.sub("", raw)
    if raw.startswith("00"):
        digits = digits[2:]
    separated = any(c in raw for c in " ().-")
    context = _near(_PHONE_WORDS, text, m.start(), m.end())
    nanp = not intl and nanp_ok(digits)
    if not _phone_groups_ok(raw, intl, nanp):
        return None
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
    if not ok:
        return None
    return Finding("phone", m.start(), m.end(), conf, f"…{digits[-2:]} ({len(digits)} digits)")


_IPV4_RE = re.compile(r"[0-9](?<![\w.]\d)\d{0,2}(?:\.\d{1,3}){3}(?!\w|\.\d)")
# Global IPv6 unicast addresses start with a hex digit (2000::/3), never with "::".
_IPV6_RE = re.compile(
    r"[0-9A-Fa-f](?<![\w:][0-9A-Fa-f])[0-9A-Fa-f]{0,3}(?::[0-9A-Fa-f]{0,4}){2,7}(?<=[0-9A-Fa-f])(?![\w:])"
)
_VERSION_BEFORE = re.compile(r"(?i)\b(?:v|version|ver\.?)\s*$")


def _global_ip(m: re.Match[str], text: str) -> Finding | None:
    try:
        ip = ipaddress.ip_address(m.group(0))
    except ValueError:
        return None
    # Private, loopback and documentation ranges are not personal data; "v1.2.3.4" is a version.
    if not ip.is_global or _VERSION_BEFORE.search(text, max(0, m.start() - 10), m.start()):
        return None
    return Finding("ip_address", m.start(), m.end(), 0.7, f"IPv{ip.version} …")


def _ipv6(m: re.Match[str], text: str) -> Finding | None:
    if len([g for g in m.group(0).split(":") if g]) < 3:
        return None  # 12:30:45 is a time, b[::2] a slice
    return _global_ip(m, text)


# --------------------------------------------------------------------------------------------
# Secrets

# Only the BEGIN line is a pattern; _pem finds the matching END line with str.find, bounded by the next
# BEGIN and by PEM_MAX_BODY. A lazy ".*?-----END" in the pattern scanned to the end of the text from every
# BEGIN line without an END: quadratic (64 KB of repeated headers took 1.5 s, 1 MB minutes).
_PEM_RE = re.compile(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY((?: BLOCK)?)-----")
#: The longest private key body searched for its END line (an 8192-bit RSA key in PEM is ~6.5 KB).
PEM_MAX_BODY = 16_384
_JWT_RE = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}")


def _pem(m: re.Match[str], text: str) -> Finding | None:
    """The key from its BEGIN line through its END line (the BEGIN line alone when no END follows)."""
    end_line = f"-----END {m.group(1)}PRIVATE KEY{m.group(2)}-----"
    limit = min(len(text), m.end() + PEM_MAX_BODY)
    next_begin = text.find("-----BEGIN ", m.end(), limit)
    if next_begin >= 0:  # a key's body never holds another BEGIN line
        limit = next_begin
    found = text.find(end_line, m.end(), limit + len(end_line))
    end = found + len(end_line) if found >= 0 else m.end()
    return Finding("private_key", m.start(), end, 0.99, "-----BEGIN …PRIVATE KEY-----", "pem")


def _jwt(m: re.Match[str], text: str) -> Finding | None:
    if not jwt_ok(m.group(0)):
        return None
    return Finding("jwt", m.start(), m.end(), 0.95, _mask(m.group(0), 3), "jwt")


def _api_key(
    subtype: str,
    gate: tuple[str, ...],
    pattern: str,
    *,
    body_group: int,
    min_entropy: float,
    shown: int,
    context: re.Pattern[str] | None = None,
    confidence: float = 0.95,
) -> Detector:
    """A provider key detector: ``pattern``'s ``body_group`` (0: the first group that matched) must be
    random-looking and not AWS's documented ``...EXAMPLE``; ``shown`` leading characters of the key
    (its documented prefix) stay in the preview; with ``context``, a match counts only near it."""

    def check(m: re.Match[str], text: str) -> Finding | None:
        body = m.group(body_group) if body_group else next(g for g in m.groups() if g)
        if body.endswith("EXAMPLE") or not random_looking(body, min_entropy):
            return None
        if context is not None and not _near(context, text, m.start(), m.end(), 60):
            return None
        return Finding("api_key", m.start(), m.end(), confidence, _mask(m.group(0), shown), subtype)

    return Detector(
        f"api_key/{subtype}", "api_key", re.compile(pattern), check, needs_digit=False, gate=gate, gate_lower=True
    )


_CRED_RE = re.compile(
    # The name may carry a prefix (DB_PASSWORD, stripe_api_key): only a letter or digit may not precede it.
    r"(?i)(?<![a-z0-9])(password|passwd|pwd|passphrase|secret|client_secret|api[_-]?key|access[_-]?token|auth[_-]?token)"
    r"\b[\"']?\s*(?:[:=]|=>|\bis\b)\s*([\"']?)([^\s\"'`,;)\]}]{8,128})\2"
)
_PLACEHOLDER = re.compile(
    r"(?i)^(?:<.*>|\$\{?.*|\{\{.*|%.*|your[_-].*|.*(?:xxx|\*\*\*|\.\.\.|changeme|example|redacted|placeholder).*)$"
)


def _credential(m: re.Match[str], text: str) -> Finding | None:
    value = m.group(3)
    if _PLACEHOLDER.match(value) or "(" in value or not random_looking(value, 2.8):
        return None  # a placeholder or code, not a literal secret
    return Finding("credential", m.start(3), m.end(3), 0.75, _mask(value), m.group(1).lower())


# --------------------------------------------------------------------------------------------
# The registry

# Order matters: a span claimed by an earlier detector is not reported again by a later one (a card
# number is not also a phone number; a key inside a credential assignment is an api_key).
DETECTORS: tuple[Detector, ...] = (
    Detector("private_key", "private_key", _PEM_RE, _pem, needs_digit=False, gate=("private key",), gate_lower=True),
    Detector("jwt", "jwt", _JWT_RE, _jwt, needs_digit=False, gate=("eyj",), gate_lower=True),
    _api_key(
        "anthropic",
        ("sk-ant-",),
        r"(?<![\w-])sk-ant-(?:api|admin)\d\d-([A-Za-z0-9_-]{40,})",
        body_group=1,
        min_entropy=3.5,
        shown=7,
    ),
    _api_key(
        "openai",
        ("sk-",),
        r"(?<![\w-])sk-(?:(?:proj|svcacct|admin|None)-)?([A-Za-z0-9_-]{20,})(?![\w-])",
        body_group=1,
        min_entropy=3.5,
        shown=3,
    ),
    _api_key(
        "aws_access_key_id",
        ("akia", "asia", "abia", "acca", "aida", "aroa"),
        r"\b(?:AKIA|ASIA|ABIA|ACCA|AIDA|AROA)([A-Z0-9]{16})\b",
        body_group=1,
        min_entropy=2.8,
        shown=4,
    ),
    _api_key(
        "github",
        ("gh", "github_pat_"),
        r"\b(?:gh[pousr]_([A-Za-z0-9]{36,255})|github_pat_([A-Za-z0-9_]{70,}))\b",
        body_group=0,
        min_entropy=3.5,
        shown=4,
    ),
    _api_key(
        "slack",
        ("xox",),
        r"\bxox[abposr]-((?:[A-Za-z0-9]+-){1,4}[A-Za-z0-9]{8,})",
        body_group=1,
        min_entropy=3.0,
        shown=4,
    ),
    _api_key(
        "slack_webhook",
        ("hooks.slack.com",),
        r"https://hooks\.slack\.com/services/(T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]{16,})",
        body_group=1,
        min_entropy=3.0,
        shown=23,
    ),
    _api_key(
        "google_api_key", ("aiza",), r"\bAIza([0-9A-Za-z_-]{35})(?![\w-])", body_group=1, min_entropy=3.5, shown=4
    ),
    _api_key("stripe", ("_live_",), r"\b(?:sk|rk)_live_([A-Za-z0-9]{20,})\b", body_group=1, min_entropy=3.5, shown=8),
    # 40 base64 characters alone could be anything (a hash, a blob): only next to "secret key" words.
    _api_key(
        "aws_secret_access_key",
        ("secret",),
        r"(?<![A-Za-z0-9/+])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        body_group=1,
        min_entropy=4.0,
        shown=0,
        context=_SECRET_WORDS,
        confidence=0.8,
    ),
    Detector(
        "credential",
        "credential",
        _CRED_RE,
        _credential,
        needs_digit=False,
        gate=("pass", "pwd", "secret", "key", "token"),
        gate_lower=True,
    ),
    Detector("credit_card", "credit_card", _CARD_RE, _card),
    Detector("iban", "iban", _IBAN_RE, _iban),
    Detector("us_ssn", "us_ssn", _SSN_RE, _ssn),
    Detector("uk_nino", "uk_nino", _NINO_RE, _nino),
    Detector("email", "email", _EMAIL_RE, _email, needs_digit=False, gate=("@",)),
    Detector("ipv4", "ip_address", _IPV4_RE, _global_ip, gate=(".",)),
    Detector("ipv6", "ip_address", _IPV6_RE, _ipv6, gate=(":",)),
    Detector("phone", "phone", _PHONE_RE, _phone),
)
