"""The base of every configuration model: unknown keys, non-finite numbers and booleans-as-numbers are errors.

A config is written by hand and often filled from environment variables; each of these slips is easy to make
and, accepted, fails far from its cause: ``.inf`` as a timeout or a TTL crashed start-up or hung a request,
``threshold: true`` read as 1.0 sent every request to the weak model.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def _is_number_type(annotation: Any) -> bool:
    """Whether a field's type takes a number (``float``, ``int``, optionally in a union) but not a bool."""
    if annotation is bool:
        return False
    if annotation in (float, int):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(annotation)
        return bool not in args and any(_is_number_type(a) for a in args)
    return False


class StrictModel(BaseModel):
    """Unknown keys are errors (a typo must never be silently ignored), and so are ``.inf``/``.nan`` and a
    ``true``/``false`` where a number belongs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # A model-level check: a field-level "*" validator would also sit on discriminator fields,
        # which pydantic refuses.
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                for key in {name, field.alias} - {None}:
                    value = data.get(key)
                    if isinstance(value, bool) and _is_number_type(field.annotation):
                        raise ValueError(f"{key}: expected a number, got {str(value).lower()}")
        return data
