"""Words whose order decides an answer but which an encoder barely sees: units, currencies, languages.

"Convert 30 degrees Celsius to Fahrenheit" and "... Fahrenheit to Celsius", "Translate this from English
to French" and "... French to English", "Port this Python to JavaScript" and the other way round score
0.97-1.0 alike on the encoders, yet want opposite answers. The semantic cache's guard
(:func:`gateway.cache.key.guard_tokens`) keeps every word of :data:`GUARD_WORDS` as its canonical token, in
order among themselves, so a hit needs the same ones in the same order. Spelled-out units map to the short
form the guard already reads after a number ("5 kilometers" = "5 km"), and so do abbreviations and
currency codes standing alone ("How many mb in a gb?", "USD to EUR" = "dollars to euros"); a paraphrase
that changes only the spelling of a unit keeps its guard where both spellings map alike, and otherwise
only misses (a miss costs one upstream call; a wrong hit answers the wrong question).
"""

from __future__ import annotations

from collections.abc import Iterable


def _forms(canonical: str, *words: str) -> dict[str, str]:
    """Each word and its regular plural (``+s``; ``+es`` after s, x, ch, sh) mapped to ``canonical``."""
    table: dict[str, str] = {}
    for word in words:
        table[word] = canonical
        table[word + ("es" if word.endswith(("s", "x", "ch", "sh")) else "s")] = canonical
    return table


def _same(words: Iterable[str]) -> dict[str, str]:
    return {word: word for word in words}


GUARD_WORDS: dict[str, str] = {
    # Temperature scales.
    **_forms("c", "celsius", "centigrade"), **_forms("f", "fahrenheit"), **_forms("k", "kelvin"),
    # Length, mass, volume.
    **_forms("m", "meter", "metre"), **_forms("km", "kilometer", "kilometre"),
    **_forms("cm", "centimeter", "centimetre"), **_forms("mm", "millimeter", "millimetre"),
    **_forms("mi", "mile"), **_forms("ft", "foot"), "feet": "ft", **_forms("in", "inch"), **_forms("yd", "yard"),
    **_forms("g", "gram", "gramme"), **_forms("kg", "kilogram", "kilogramme", "kilo"), **_forms("lb", "pound"),
    **_forms("oz", "ounce"), **_forms("t", "tonne"),
    **_forms("l", "liter", "litre"), **_forms("ml", "milliliter", "millilitre"), **_forms("gal", "gallon"),
    **_forms("qt", "quart"), **_forms("pt", "pint"), **_forms("tbsp", "tablespoon"), **_forms("tsp", "teaspoon"),
    **_forms("cup", "cup"),
    # Time (a conversion's direction: "hours in 3 days" is not "days in 3 hours").
    **_forms("s", "second"), **_forms("min", "minute"), **_forms("h", "hour"), **_forms("day", "day"),
    **_forms("week", "week"), **_forms("month", "month"), **_forms("year", "year"),
    # Data sizes.
    **_forms("kb", "kilobyte"), **_forms("mb", "megabyte"), **_forms("gb", "gigabyte"), **_forms("tb", "terabyte"),
    # Currencies (the signs are read as signs: "$100" and "100 dollars" both give "$").
    **_forms("$", "dollar"), **_forms("€", "euro"), "yen": "¥", **_forms("rupee", "rupee"), "yuan": "yuan",
    # Abbreviations standing alone ("How many mb in a gb?", "mph to kph"): right after a number the guard reads
    # them as a unit anyway. Single letters (m, g, c, f ...) and everyday words (in, min, pt, cup) are left out.
    **_same(("km", "cm", "mm", "kg", "lb", "oz", "ml", "ft", "yd", "gal", "qt", "tbsp", "tsp", "kb", "mb", "gb", "tb",
             "mph", "kph")),
    "lbs": "lb", "kmh": "kph",
    # Currency codes, as the currency they name ("USD to EUR" is "dollars to euros", not "EUR to USD").
    "usd": "$", "eur": "€", "gbp": "£", "jpy": "¥", "cny": "yuan", "rmb": "yuan", "inr": "rupee",
    # (TRY, RUB and CAD are also English words: left to the encoder.)
    **_same(("chf", "aud", "nzd", "hkd", "sgd", "sek", "nok", "dkk", "pln", "mxn", "brl", "krw", "zar", "btc", "eth")),
    # Natural languages (translation direction).
    **_same((
        "english", "french", "german", "spanish", "italian", "portuguese", "dutch", "russian", "chinese",
        "mandarin", "cantonese", "japanese", "korean", "arabic", "hindi", "bengali", "urdu", "turkish", "polish",
        "swedish", "norwegian", "danish", "finnish", "greek", "hebrew", "latin", "vietnamese", "thai",
        "indonesian", "ukrainian", "czech", "hungarian", "romanian", "persian", "swahili",
    )),
    # Programming languages (porting direction); words with a common everyday meaning (go, swift, rust)
    # are left to the encoder.
    **_same((
        "python", "javascript", "typescript", "java", "kotlin", "scala", "ruby", "php", "perl", "haskell",
        "elixir", "erlang", "clojure", "fortran", "cobol", "matlab", "julia", "lua", "dart", "golang", "sql",
        "bash", "powershell",
    )),
}

#: Numbers spelled out, read as the number they name ("two plus three" is "2 plus 3", not "two plus two").
#: "one" is left out: mostly a pronoun ("which one is faster?"), and "one" against another number still
#: differs by the other one.
NUMBER_WORDS: dict[str, str] = {
    word: str(value) for value, word in enumerate((
        "zero", "", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
    )) if word
} | {"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
     "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000"}
