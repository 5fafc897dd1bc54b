"""Which requests a router was trained on: a prompt asked again with other capitals, spacing or
Unicode form counts as seen, so the gate and ``pointsman eval`` do not grade a router on it; records
written before keys were normalised are still read, and matched exactly."""

from __future__ import annotations

import json
from pathlib import Path

from evals.labelled import LabelledRequest
from evals.trained_rows import HASH_EXACT, key_hashes, load_trained_rows, trained_mask, write_trained_rows


def _request(text: str) -> LabelledRequest:
    return LabelledRequest(messages=[{"role": "user", "content": text}], qualities={}, costs={}, source="test")


TRAINED = ["Solve 3x + 5 = 20.", "Write a haiku about the sea.", "Ｆｕｌｌｗｉｄｔｈ question?"]
ASKED = [
    "solve 3x  +  5 = 20.",  # capitals and spacing
    "WRITE A HAIKU ABOUT THE SEA.\n",
    "Fullwidth question?",  # NFKC folds the full-width letters
    "Solve 3x + 5 = 21.",  # another question
]


def test_variants_of_a_trained_prompt_count_as_trained(tmp_path: Path) -> None:
    recorded = write_trained_rows(tmp_path, [_request(t) for t in TRAINED])
    trained = load_trained_rows(tmp_path, json.loads(json.dumps(recorded)))  # as version.json keeps it
    assert trained is not None and trained.normalised and len(trained) == 3
    assert trained_mask([_request(t) for t in ASKED], trained).tolist() == [True, True, True, False]
    assert trained_mask([_request(t) for t in ASKED], None).tolist() == [False] * 4


def test_a_record_from_before_normalisation_is_matched_exactly(tmp_path: Path) -> None:
    import numpy as np

    requests = [_request(t) for t in TRAINED]
    np.save(tmp_path / "old.npy", np.unique(key_hashes(requests, normalised=False)), allow_pickle=False)
    old = load_trained_rows(tmp_path, {"file": "old.npy", "count": 3, "hash": HASH_EXACT})
    assert old is not None and not old.normalised
    assert trained_mask(requests, old).tolist() == [True, True, True]
    assert trained_mask([_request(t) for t in ASKED], old).tolist() == [False] * 4
