"""Rules that decide whether a candidate value is real: checksums, registries and numbering plans.

Each validator looks at the value alone (digits, letters, parts); what surrounds it in the text,
how it is written and how confident a finding is are the detectors' business
(:mod:`classifiers.signals.pii.detectors`). The tables here are kept by hand from the registries
named beside them.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re


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


_NINO_UNISSUED_PAIRS = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})


def nino_prefix_ok(prefix: str) -> bool:
    """HMRC prefix rules for a UK National Insurance number's two letters.

    Neither letter is D, F, I, Q, U or V, the second is not O, and the pair is not one HMRC never
    issues (BG, GB, KN, NK, NT, TN, ZZ).
    """
    if len(prefix) != 2 or prefix[0] in "DFIQUV" or prefix[1] in "DFIQUVO":
        return False
    return prefix not in _NINO_UNISSUED_PAIRS


# Reserved for documentation and testing (RFC 2606 / RFC 6761): never somebody's mailbox.
_RESERVED_DOMAINS = re.compile(r"(?:^|\.)(?:example\.(?:com|org|net)|example|test|invalid|localhost|local)$", re.I)
# File extensions that are not TLDs: "icon@2x.png", "pkg@1.0.0.tgz" are not addresses.
_FILE_TLDS = frozenset({
    "png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "tif", "tiff", "js", "mjs", "cjs", "ts", "tsx", "jsx",
    "css", "scss", "json", "yaml", "yml", "toml", "txt", "html", "htm", "xml", "lock", "tgz", "gz", "bz2", "whl",
    "jar", "dll", "exe",
})  # fmt: skip


def email_ok(local: str, domain: str) -> bool:
    """RFC 5321 lengths, a domain that is neither reserved nor a file name, and not ``git@host``."""
    if len(local) > 64 or len(domain) > 253 or domain.rpartition(".")[2].lower() in _FILE_TLDS:
        return False
    # git@github.com is the user part of an SSH URL, not a mailbox.
    return _RESERVED_DOMAINS.search(domain) is None and local.lower() != "git"


def shannon_entropy(s: str) -> float:
    """Bits per character of ``s`` (random base62 strings score ~5, English words ~3-4)."""
    if not s:
        return 0.0
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


_RUN_OF_SIX = re.compile(r"(.)\1{5,}")


def random_looking(s: str, min_entropy: float = 3.3) -> bool:
    """A secret's body: mixed letters and digits, high entropy, no long runs of one character."""
    if not (any(c.isdigit() for c in s) and any(c.isalpha() for c in s)):
        return False
    if _RUN_OF_SIX.search(s):  # xxxxxx / 000000 placeholders
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
