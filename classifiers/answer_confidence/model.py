"""The answer-confidence head: P(an answer is good | prompt, answer), for cascades.

A cascade lets the cheap model answer first and escalates to the strong model when this score is low.
Features: the encoder's embedding of :func:`answer_text` (the prompt, then the answer) followed by the
answer checks (:mod:`classifiers.answer_confidence.checks`); a logistic-regression :class:`Head` with
Platt calibration scores them. Scoring one pair is one encode plus one dot product.

Artifacts follow the heads' convention (``manifest.json`` + ``weights.npz``, never pickle); the manifest's
``task`` is ``"answer_confidence"``, ``encoder`` the encoder id the embeddings must come from and
``encoder_name`` the :func:`classifiers.encoders.load_encoder` name that builds it. Bundled artifacts live in
``classifiers/artifacts/answer_confidence/<encoder name>/``; they are built by
``python -m evals.train_answer_confidence``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from classifiers.answer_confidence.checks import CHECK_NAMES, check_vector
from classifiers.conversation import clip_middle  # the renderer's 2:1 head-and-tail clip
from classifiers.encoders.base import Encoder
from classifiers.heads.head import Head, load_head

TASK = "answer_confidence"
ARTIFACTS_DIR = Path(__file__).resolve().parents[1] / "artifacts" / "answer_confidence"
DEFAULT_ENCODER = "static"
PROMPT_CHARS = 800
ANSWER_CHARS = 1200
ANSWER_MARKER = "\n\n[answer] "


def answer_text(prompt: str, answer: str) -> str:
    """The text encoded for a pair: the prompt (at most 800 characters), then ``[answer]`` and the answer
    (at most 1,200 characters). Longer parts keep their head and tail around ``[…]``
    (:func:`clip_middle`), so an answer's final lines always stay in."""
    return clip_middle(prompt.strip(), PROMPT_CHARS) + ANSWER_MARKER + clip_middle(answer.strip(), ANSWER_CHARS)


def answer_features(embeddings: np.ndarray, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """The head's feature matrix: embeddings of :func:`answer_text`, then :data:`CHECK_NAMES` values."""
    emb = np.asarray(embeddings, dtype=np.float32)
    if len(emb) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs for {len(emb)} embeddings")
    checks = np.array([check_vector(p, a) for p, a in pairs], dtype=np.float32).reshape(len(pairs), len(CHECK_NAMES))
    return np.hstack([emb, checks])


class AnswerConfidence:
    """Scores answers: P(this answer is good | prompt, answer), in [0, 1].

    Build it with :meth:`load`. ``prompt`` is the conversation rendered as text
    (:func:`classifiers.conversation.conversation_text` of the request body), ``answer`` the assistant's
    text. An answer with no visible text scores 0.0. Thread-safe as long as the encoder is.

    Attributes:
        encoder_id: Id of the encoder the artifact was trained with (and that this instance uses).
        head: The underlying calibrated head (``manifest`` holds data, metrics and feature schema).
    """

    def __init__(self, head: Head, encoder: Encoder) -> None:
        """Pair a loaded head with an encoder whose id matches the head's manifest (:meth:`load` checks that)."""
        self.head = head
        self.encoder = encoder
        self.encoder_id: str = str(head.manifest.get("encoder", encoder.id))
        n_emb = head.n_features - len(CHECK_NAMES)
        if n_emb != encoder.dim:
            raise ValueError(f"head expects {n_emb}-dimensional embeddings; encoder {encoder.id!r} gives {encoder.dim}")

    @classmethod
    def load(cls, path: str | Path | None = None, *, encoder: Encoder | None = None) -> AnswerConfidence:
        """Load an answer-confidence artifact.

        Args:
            path: The artifact directory (``manifest.json`` + ``weights.npz``). None: the bundled
                ``static`` artifact (``classifiers/artifacts/answer_confidence/static``).
            encoder: An already loaded encoder (e.g. the gateway's shared one). Its ``id`` must equal the
                manifest's ``encoder``. None: the encoder the manifest names is loaded with
                :func:`classifiers.encoders.load_encoder`.

        Raises:
            FileNotFoundError: no artifact at ``path``.
            ValueError: not an answer-confidence artifact, bad weights, or an encoder of another id.
        """
        root = Path(path) if path is not None else ARTIFACTS_DIR / DEFAULT_ENCODER
        if not (root / "manifest.json").is_file():
            raise FileNotFoundError(f"{root}: no answer-confidence artifact (manifest.json missing)")
        head = load_head(root)
        if head.manifest.get("task") != TASK:
            raise ValueError(f"{root}: task {head.manifest.get('task')!r} is not {TASK!r}")
        schema = head.manifest.get("feature_schema", {})
        if list(schema.get("checks", [])) != list(CHECK_NAMES):
            raise ValueError(f"{root}: the artifact's answer checks differ from this version's {CHECK_NAMES}")
        wanted = str(head.manifest["encoder"])
        if encoder is None:
            from classifiers.encoders import load_encoder

            encoder = load_encoder(str(head.manifest["encoder_name"]))
        if encoder.id != wanted:
            raise ValueError(f"{root}: trained with encoder {wanted!r}, given {encoder.id!r}")
        return cls(head, encoder)

    def score(self, prompt: str, answer: str) -> float:
        """P(``answer`` is a good answer to ``prompt``), in [0, 1]."""
        return float(self.score_many([(prompt, answer)])[0])

    def score_many(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """:meth:`score` for many ``(prompt, answer)`` pairs at once (one ``encode`` call); shape ``(n,)``."""
        if not pairs:
            return np.zeros(0, dtype=np.float64)
        emb = self.encoder.encode([answer_text(p, a) for p, a in pairs])
        proba = self.head.predict_proba(answer_features(emb, pairs))[:, 1]
        empty = np.array([not a.strip() for _, a in pairs])
        return np.where(empty, 0.0, np.clip(proba, 0.0, 1.0))
