"""What a PII scan reports: the kinds it knows, their categories, and one finding."""

from __future__ import annotations

from dataclasses import dataclass

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
