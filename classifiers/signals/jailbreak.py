"""Jailbreak and prompt-injection score from weighted, well-known attack patterns.

Each rule is a regex with a weight (how strongly a match alone indicates an attack). The score is a
noisy-OR over the rules that matched anywhere in the scanned messages, each rule counted once::

    score = 1 - prod(1 - weight_i)

so one strong rule (``ignore all previous instructions``: 0.85) crosses the suggested 0.5 threshold
on its own, while weak hints (``jailbreak`` as a word, ``stay in character``) need company. Rules
written for *indirect* injection (instructions addressed to "the AI" inside a web page or file)
carry a higher weight when they match inside a tool result, where no legitimate instruction to the
model should appear.

Only user, tool and function messages (and a legacy ``prompt``) are scanned: the system and
developer prompts are the operator's own words ("never reveal your system prompt" is not an
attack), and assistant turns are the model's. The rules read the text as the model does
(:mod:`classifiers.signals._fold`: zero-width characters removed, fullwidth, mathematical and
Cyrillic/Greek look-alike letters made plain), and base64 blobs in it are decoded and scanned too,
so ``Ign\u200bore``, ``Ｉｇｎｏｒｅ`` and an encoded "ignore previous instructions" are caught.

The scan is bounded, so that a long request costs a bounded time (the rules run at ~0.5-1 µs a
character): at most ``max_scan_chars`` (64 Ki) characters per request, the newest messages first,
and of a text longer than ``text_window`` (32 Ki) its first and last 16 Ki characters, where an
instruction to the model is placed to be followed. Instructions buried in the middle of a longer
text, or in older turns beyond the budget, are not seen; ``detail.skipped_chars`` says how much
was not read. (PII detection and redaction, by contrast, always read everything.)

This is a pattern detector: it catches the well-known families and their common paraphrases, not
novel attacks. Measured at the 0.5 threshold on tests/classifiers/data/jailbreak_cases.yaml (50
attacks, 50 benign prompts full of "ignore", "instructions", "system", "developer", "jailbreak"):
the holdout half, before any tuning on it, scored precision 1.00 / recall 0.84 (4 paraphrases
missed, since covered); after tuning on the dev half, both halves 1.00 / 1.00 — optimistic, as the
rules were fixed with those cases in view. False positives on 17,746 real benign prompts (RouteLLM
MMLU, GSM8K, MT-bench; RouterBench ARC, MBPP, Winogrande): 0 (one, an ethics question saying
"violate ethical guidelines", was found and fixed).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from classifiers.messages import TextPiece, iter_message_texts
from classifiers.signals._fold import fold_text
from classifiers.signals.base import Signal

#: The score at or above which a request is considered an attack (what the tests measure).
DEFAULT_THRESHOLD = 0.5
#: How much text one request's scan reads at most, newest text first (a detector, not a promise).
MAX_SCAN_CHARS = 65_536
#: A longer text is read by its first and last half of this many characters.
TEXT_WINDOW = 32_768

_TOOL_ROLES = frozenset({"tool", "function"})
_SCANNED_ROLES = frozenset({"user", "tool", "function"})


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern: ``id`` (reported in detail), ``weight`` and the weight inside tool results.

    ``triggers`` is a cheap necessary condition: the regex runs only when the lower-cased,
    whitespace-collapsed text contains one of these substrings (a substring test costs ~1 µs per
    2 KB, a regex scan 15-40 µs, and on ordinary traffic most rules have no trigger at all).
    """

    id: str
    triggers: tuple[str, ...]  # lower-case substrings (single-spaced), one of which every match contains
    pattern: str
    weight: float
    tool_weight: float | None = None


# Fragments shared by several rules.
_PRIOR = r"(?:previous|prior|preceding|above|earlier|former|foregoing|initial|original|old|existing|all(?:\s+the)?)"
_INSTR = (
    r"(?:instructions?|prompts?|rules|directions|directives|guidelines|guidance|constraints|programming|"
    r"commands|orders|context|restrictions|polic(?:y|ies)|system\s+(?:prompt|message)|messages?)"
)
_FORGET = (
    r"(?:ignore|disregard|forget|skip|override|overrule|bypass|drop|discard|abandon|throw\s+out|set\s+aside|neglect)"
)
_FORGET_TRIGGERS = (
    "ignor", "disregard", "forget", "skip", "overrid", "overrul", "bypass", "drop", "discard", "abandon", "throw",
    "aside", "neglect",
)  # fmt: skip
_AI = r"(?:ai|assistant|llm|language\s+model|model|chatbot|bot|gpt|chatgpt|claude|copilot|agent)"

RULES: tuple[Rule, ...] = (
    Rule(
        "ignore_previous",
        _FORGET_TRIGGERS,
        rf"\b{_FORGET}\s+(?:\w+\s+){{0,3}}?{_PRIOR}\s+(?:\w+\s+){{0,2}}?{_INSTR}",
        0.85,
    ),
    Rule(
        "ignore_your_instructions",
        _FORGET_TRIGGERS,
        rf"\b{_FORGET}\s+(?:all\s+|any\s+|of\s+)*(?:your|the\s+system'?s?|the\s+developer'?s?)\s+(?:\w+\s+){{0,2}}?{_INSTR}",
        0.8,
    ),
    Rule(
        "forget_everything",
        ("forget", "disregard", "ignor"),
        r"\b(?:forget|disregard|ignore)\s+(?:everything|all(?:\s+of\s+that)?|anything)\s+"
        r"(?:you\s+(?:were|have\s+been)\s+(?:told|taught|instructed)|(?:said|written|stated|mentioned)\s+"
        r"(?:before|above|earlier|previously)|before|above|prior)",
        0.75,
    ),
    Rule(
        "new_instructions",
        ("your new", "new instruction", "new system", "updated system", "revised system"),
        r"\b(?:your\s+new\s+(?:instructions|task|rules|directive|role)\s+(?:is|are)|new\s+(?:system\s+)?instructions?\s*:|"
        r"(?:updated|new|revised)\s+system\s+(?:prompt|message|instructions?)\s*[:\-])",
        0.55,
        0.8,
    ),
    Rule(
        "dan",
        ("do anything now", "dan mode", "dan prompt", "dan jailbreak", "you are dan", "you are now dan", "act as dan"),
        r"\b(?:do\s+anything\s+now|DAN\s+(?:mode|prompt|jailbreak)|you\s+are\s+(?:now\s+)?DAN\b|act\s+as\s+DAN\b)",
        0.9,
    ),
    Rule(
        "developer_mode",
        ("mode",),
        r"\b(?:(?:developer|dev|god|jailbreak|jailbroken|sudo|admin|debug|maintenance|unrestricted|unfiltered|uncensored)\s+mode\s+"
        r"(?:is\s+)?(?:enabled|activated|engaged|unlocked)|(?:with|enable|activate|enter|simulate)\s+"
        r"(?:the\s+)?(?:DAN|jailbreak|god|unrestricted|unfiltered|uncensored)\s+mode)",
        0.6,
    ),
    Rule(
        "developer_mode_ai",
        ("with developer mode", "developer mode output", "developer mode response"),
        rf"\b{_AI}\s+with\s+developer\s+mode\b|developer\s+mode\s+(?:output|response)s?\b",
        0.7,
    ),
    Rule(
        "no_longer_bound",
        ("bound by", "restricted by", "limited by", "constrained by"),
        r"\b(?:no\s+longer|not|never)\s+(?:be\s+)?(?:bound|restricted|limited|constrained)\s+by\s+(?:any\s+|the\s+|your\s+|its\s+)?"
        r"(?:\w+\s+){0,2}?(?:rules|polic(?:y|ies)|guidelines|restrictions|limitations|ethics|morals|filters|instructions|programming)",
        0.8,
    ),
    Rule(
        "freed_from_rules",
        ("free from", "freed from", "liberated from", "released from", "escaped from"),
        r"\b(?:freed?|liberated|released|broken\s+free|escaped)\s+from\s+(?:all\s+|any\s+|the\s+|your\s+|its\s+|her\s+|his\s+|their\s+)?"
        r"(?:typical\s+|usual\s+)?(?:confines|restrictions|rules|limitations|shackles|chains|constraints|guidelines|censorship|programming)",
        0.7,
    ),
    Rule(
        "no_ethics",
        ("ethical", "moral", "safety", "content", "unfiltered", "uncensored"),
        r"\b(?:without|no|free\s+of|ignor(?:e|ing))\s+(?:any\s+)?(?:ethical|moral|safety|content)\s+"
        r"(?:guidelines|constraints|restrictions|limitations|filters?|considerations|boundaries|polic(?:y|ies)|concerns)|"
        r"\b(?:amoral|unethical|unfiltered|uncensored)\s+(?:ai|assistant|chatbot|model|persona|character)\b",
        0.55,
    ),
    Rule(
        "policy_bypass",
        ("bypass", "circumvent", "evade", "break", "violate", "ignor", "disable", "turn off", "get around"),
        r"\b(?:bypass|circumvent|evade|break|violate|ignore|disable|turn\s+off|get\s+around)\s+"
        r"(?:your|the\s+model'?s|(?:the\s+)?openai'?s?|(?:the\s+)?anthropic'?s?)\s+(?:\w+\s+)?"
        r"(?:polic(?:y|ies)|filters?|guidelines|guardrails|restrictions|rules|safety|censorship)\b|"
        r"\b(?:bypass|circumvent|evade|disable|turn\s+off|get\s+around)\s+(?:the\s+|all\s+|any\s+)?(?:content|safety|ethical|usage)\s+"
        r"(?:polic(?:y|ies)|filters?|guidelines|guardrails|restrictions|rules)",
        0.7,
    ),
    Rule(
        "system_prompt_exfil",
        ("prompt", "message", "instruction", "rules", "guideline", "configuration"),
        r"\b(?:reveal|show|print|repeat|output|display|leak|dump|disclose|share|tell\s+me|give\s+me|write(?:\s+out|\s+down)?(?:\s+the\s+text\s+of)?|recite|spell\s+out|"
        r"what\s+(?:is|are|was|were))\s+(?:me\s+)?(?:exactly\s+)?(?:your|the\s+(?:hidden|secret|initial|original|confidential))\s+"
        r"(?:\w+\s+){0,2}?(?:system\s+prompt|system\s+message|prompt|instructions|initial\s+prompt|rules|guidelines|configuration)\b",
        0.7,
    ),
    Rule(
        "repeat_above",
        ("above", "before this", "preceding", "prior to this", "starting with"),
        r"\b(?:repeat|print|output|copy|reproduce|translate)\s+(?:all\s+|everything\s+|the\s+)?(?:words|text|everything|content|lines?)\s+"
        r"(?:\w+\s+){0,2}?(?:above|before\s+this|preceding|prior\s+to\s+this)|\bstarting\s+with\s+[\"'`]?you\s+are\b",
        0.6,
    ),
    Rule(
        "roleplay_override",
        (
            "pretend",
            "imagine",
            "act as if",
            "behave as if",
            "roleplay as",
            "role-play as",
            "you are now",
            "from now on",
        ),
        r"\b(?:pretend|imagine|act\s+as\s+if|behave\s+as\s+if|roleplay\s+as|role-play\s+as|you\s+are\s+now|from\s+now\s+on,?\s+you\s+(?:are|will\s+be))\s+"
        r"(?:\S+\s+){0,6}?(?:no\s+(?:rules|restrictions|limits|filters|guidelines|boundaries)|without\s+(?:any\s+)?(?:rules|restrictions|limits|filters)|"
        r"unrestricted|unfiltered|uncensored|evil|amoral|rogue|not\s+an\s+ai|not\s+bound|can\s+do\s+anything|anything\s+goes)",
        0.7,
    ),
    Rule(
        "rules_revoked",
        ("cancel", "lifted", "removed", "suspended", "void", "disabled", "revoked", "deactivated", "gone", "null"),
        r"\byour\s+(?:\w+\s+)?(?:guidelines|rules|restrictions|policies|filters|limitations|safety\s+settings)\s+(?:are|have\s+been)\s+"
        r"(?:now\s+)?(?:cancell?ed|lifted|removed|suspended|void|disabled|revoked|deactivated|gone|null)",
        0.65,
    ),
    Rule(
        "persona_no_refusal",
        ("refuse", "decline", "say no", "deny"),
        r"\b(?:never|not|cannot|can'?t|won'?t|doesn'?t|does\s+not|will\s+not)\s+(?:ever\s+)?(?:refuse|decline|say\s+no|deny)\s+"
        r"(?:a|any|an?y?\s*)?(?:request|question|prompt|order|anything)",
        0.45,
    ),
    Rule(
        "refusal_suppression",
        ("apologi", "warning", "disclaimer", "caveat", "can't", "cannot", "not able", "unable"),
        r"\b(?:do\s+not|don'?t|never|without)\s+(?:apologi[sz]e|(?:add|include|give|adding|including)\s+(?:any\s+)?(?:warnings?|disclaimers?|caveats)|"
        r"(?:say|saying|tell\s+me)\s+(?:that\s+)?(?:you\s+)?(?:can(?:no|')t|cannot|are\s+(?:not\s+able|unable)))",
        0.3,
    ),
    Rule(
        "stay_in_character",
        ("in character", "break character", "breaking character"),
        r"\b(?:stay|remain|keep)\s+in\s+character\b|\bbreak(?:ing)?\s+character\b",
        0.3,
    ),
    Rule(
        "dual_response",
        ("[jailbreak", "[dan]", "[developer", "🔓", "two responses", "two different"),
        r"\[(?:🔓\s*)?(?:JAILBREAK|DAN|DEVELOPER\s+MODE)\]|\(🔓|two\s+(?:different\s+)?responses?.{0,60}\b(?:normal|classic)\b.{0,60}\b(?:jailbreak|DAN|unfiltered)",
        0.7,
    ),
    Rule("jailbreak_word", ("jail",), r"\bjail\s*-?\s*br(?:eak|oken)\b", 0.25),
    Rule(
        "grandma_exploit",
        ("deceased", "dead grand", "late grand", "dead mother", "late mother", "dead father", "late father"),
        r"\b(?:deceased|dead|late)\s+(?:grand(?:ma|mother|pa|father)|mother|father)\s+(?:\w+\s+){0,3}?(?:used\s+to|would)\s+"
        r"(?:tell|read|recite|explain)",
        0.5,
    ),
    Rule(
        "fake_system_tag",
        ("<|", "inst]", "sys", "##"),
        r"<\|(?:im_start|im_end|system|endoftext)\|>|\[/?INST\]|<<\s*/?SYS\s*>>|</?\s*system\s*>|"
        # [ \t] rather than \s at a line start: \s also matches newlines, and a run of them would be
        # re-scanned from every line start (quadratic: 10 s for 32 Ki newlines).
        r"^[ \t]*#{2,}[ \t]*(?:system|instruction|new[ \t]+instructions?)[ \t]*:?[ \t]*$|"
        r"^[ \t]*(?:SYSTEM|System)[ \t]*(?:override|message|prompt)?[ \t]*:",
        0.5,
        0.8,
    ),
    Rule(
        "addressed_to_ai",
        ("important", "attention", "note", "message", "instruction", "if you are", "dear", "hey"),
        rf"\b(?:important|attention|note|message|instructions?)\s*(?:!|:)?\s*(?:to|for)\s+(?:the\s+|any\s+|all\s+)?{_AI}s?\b|"
        rf"\b(?:if\s+you\s+are\s+an?|dear|hey)\s+{_AI}\b[^.\n]{{0,80}}\b(?:must|should|need\s+to|will|are\s+instructed)",
        0.35,
        0.85,
    ),
    Rule(
        "exfiltrate_data",
        ("://", "@", "the following", "this url", "this address", "this endpoint"),
        r"\b(?:send|forward|email|post|upload|exfiltrate|leak|transmit)\s+(?:\w+\s+){0,3}?(?:conversation|chat\s+history|"
        r"user'?s?\s+(?:data|emails?|files|credentials|password)|credentials|api\s+keys?|passwords?|secrets?|tokens?|"
        r"private\s+(?:data|information))\s+(?:\w+\s+){0,3}?(?:to|at)\s+(?:https?://|\S+@|the\s+following|this\s+(?:url|address|endpoint))",
        0.5,
        0.85,
    ),
    Rule(
        "markdown_exfil", ("](http",), r"!\[[^\]]*\]\(https?://[^)\s]*[?&][\w-]*=\{?[^)\s]*(?:\{|%7B|\$|<)", 0.6, 0.85
    ),
    Rule(
        "tool_hijack",
        ("immediately", "now", "without asking", "without telling", "without confirmation", "do not"),
        r"\b(?:call|invoke|use|run|execute)\s+(?:the\s+)?[\w.-]+\s+(?:tool|function)\s+(?:\w+\s+){0,4}?(?:immediately|now|without\s+(?:asking|telling|confirmation))|"
        r"\bdo\s+not\s+(?:tell|inform|mention\s+(?:this\s+)?to|alert|notify)\s+(?:the\s+)?user\b",
        0.45,
        0.85,
    ),
    Rule(
        "obfuscation",
        ("base64", "base-64", "rot13", "rot-13", "hex", "binary", "morse", "reversed"),
        r"\b(?:decode|decipher|translate|convert)\s+(?:this|the\s+following)\s+(?:\w+\s+){0,2}?(?:base64|base-64|rot13|rot-13|hex|binary|morse|reversed)\b"
        r"[^.\n]{0,80}\b(?:follow|execute|obey|do\s+(?:what|as)|act\s+on|carry\s+out|and\s+then\s+do)|"
        r"\b(?:respond|answer|reply)\s+only\s+in\s+(?:base64|rot13|hex|binary)",
        0.6,
    ),
    Rule(
        "leetspeak",
        ("1gn", "ign0", "ignor3", "pr3v", "v1", "0ns", "1nstruct"),
        r"\b(?:1gn[o0]r[e3]|ign0r[e3]|ignor3|pr3v[i1][o0]us|pr[e3]v1[o0]us|[i1]nstruct[i1]0ns|1nstruct[i1][o0]ns)\b",
        0.6,
    ),
    Rule(
        "hypothetical_unrestricted",
        ("hypothetical", "fictional", "imaginary"),
        r"\b(?:hypothetical(?:ly)?|fictional|imaginary)\s+(?:\w+\s+){0,4}?(?:ai|model|assistant|world|scenario)\s+"
        r"(?:\w+\s+){0,6}?(?:no|without)\s+(?:rules|restrictions|filters|ethics|limits|guidelines|content\s+polic(?:y|ies))",
        0.55,
    ),
)

# The look-behind sits after the first character so the engine keeps its fast first-character scan.
_B64_BLOB = re.compile(r"[A-Za-z0-9+/](?<![A-Za-z0-9+/=][A-Za-z0-9+/])[A-Za-z0-9+/]{23,}={0,2}(?![A-Za-z0-9+/=])")
# Joins the texts of one group so each rule scans once; the NUL keeps matches from spanning messages
# in practice, and every group match is re-checked message by message before it counts.
_SEP = "\n\x00\n"
#: Extra weight when a rule matched inside a decoded base64 blob: hiding instructions is itself a tell.
_B64_PAYLOAD_WEIGHT = 0.8


class JailbreakSignal:
    """``value``: jailbreak / prompt-injection score in [0, 1] (noisy-OR of matched rule weights).

    ``detail``: ``rules`` (matched rule ids, strongest first), ``messages`` (indices of the
    messages that matched), ``in_tool_output`` (a rule matched inside a tool result: indirect
    injection), ``threshold`` (the suggested decision threshold). Confidence is the distance from
    the decision boundary, ``|score - 0.5| * 2``, capped at 0.9: regex rules can miss paraphrases.
    """

    def __init__(
        self,
        name: str = "jailbreak",
        threshold: float = DEFAULT_THRESHOLD,
        max_scan_chars: int = MAX_SCAN_CHARS,
        text_window: int = TEXT_WINDOW,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"jailbreak threshold must be in (0, 1], got {threshold}")
        if max_scan_chars < 1 or text_window < 2:
            raise ValueError("jailbreak max_scan_chars must be >= 1 and text_window >= 2")
        self.name = name
        self.threshold = threshold
        self.max_scan_chars = max_scan_chars
        self.text_window = text_window
        # IGNORECASE: attackers vary case ("IGNORE ALL PREVIOUS INSTRUCTIONS", "dan mode").
        self._rules = [(r, re.compile(r.pattern, re.IGNORECASE | re.MULTILINE)) for r in RULES]
        self._literals = sorted({t for r in RULES for t in r.triggers})

    def _scan_group(
        self, texts: list[tuple[int, str, bool]], in_tool: bool, hits: dict[str, float], where: set[int]
    ) -> bool:
        """Match every rule against one group of texts (user side or tool results).

        ``texts`` holds (message index, text, decoded-from-base64). Returns whether any rule matched.
        """
        joined = _SEP.join(t for _, t, _ in texts)
        low = " ".join(joined.lower().split())
        present = {t for t in self._literals if t in low}  # each distinct literal tested once
        matched = False
        for rule, rx in self._rules:
            if present.isdisjoint(rule.triggers) or rx.search(joined) is None:
                continue
            sources = [(idx, dec) for idx, t, dec in texts if rx.search(t) is not None]
            if not sources:
                continue  # matched only across a message boundary
            w = rule.tool_weight if (in_tool and rule.tool_weight is not None) else rule.weight
            hits[rule.id] = max(w, hits.get(rule.id, 0.0))
            if any(dec for _, dec in sources):
                hits["base64_payload"] = _B64_PAYLOAD_WEIGHT
            where.update(idx for idx, _ in sources)
            matched = True
        return matched

    def extract(self, body: Mapping[str, Any]) -> Signal:
        """Score the user turns, tool results and legacy prompt of ``body``."""
        user: list[tuple[int, str, bool]] = []
        tool: list[tuple[int, str, bool]] = []
        pieces = list(iter_message_texts(body, roles=_SCANNED_ROLES, tool_calls=False))
        windows, skipped = self._windows(pieces)
        for piece, text in windows:
            text = fold_text(text)  # zero-width characters, fullwidth and look-alike letters: as read
            group = tool if piece.role in _TOOL_ROLES else user
            group.append((piece.message, text, False))
            for blob in _B64_BLOB.findall(text):
                decoded = _decode_b64(blob)
                if decoded:
                    group.append((piece.message, decoded, True))
        hits: dict[str, float] = {}
        where: set[int] = set()
        if user:
            self._scan_group(user, False, hits, where)
        in_tool_output = bool(tool) and self._scan_group(tool, True, hits, where)
        miss = 1.0
        for w in hits.values():
            miss *= 1.0 - w
        score = round(1.0 - miss, 4)
        detail = {
            "rules": sorted(hits, key=lambda k: (-hits[k], k)),
            "messages": sorted(where),
            "in_tool_output": in_tool_output,
            "threshold": self.threshold,
            "skipped_chars": skipped,
        }
        confidence = min(0.9, abs(score - 0.5) * 2)
        return Signal(self.name, score, round(confidence, 4), detail)


    def _windows(self, pieces: list[TextPiece]) -> tuple[list[tuple[TextPiece, str]], int]:
        """The text of each piece that is scanned (newest first) and how many characters are not.

        Within ``max_scan_chars`` in all, newest text first; a text longer than ``text_window`` (or
        than what is left of the budget) is scanned by its head and its tail, half each.
        """
        budget = self.max_scan_chars
        windows: list[tuple[TextPiece, str]] = []
        skipped = 0
        for piece in reversed(pieces):
            text = piece.text
            room = min(budget, self.text_window)
            if room <= 0:
                skipped += len(text)
                continue
            if len(text) > room:
                half = room // 2
                skipped += len(text) - 2 * half
                text = text[:half] + _SEP + text[len(text) - half :]
            budget -= len(text)
            windows.append((piece, text))
        windows.reverse()
        return windows, skipped


def _decode_b64(blob: str) -> str | None:
    """The blob as text when it is base64 of mostly printable ASCII, else None."""
    try:
        raw = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    printable = sum(1 for c in text if c.isprintable() or c in "\n\t")
    return text if text and printable / len(text) > 0.95 and " " in text else None
