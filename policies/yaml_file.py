"""Reading a hand-written YAML config strictly: a key written twice and an alias bomb are errors.

``yaml.safe_load`` keeps the last of two equal keys (two ``routes:`` sections, and the first list of
routes silently disappears; two ``threshold:`` lines, and the later wins) and builds aliases as shared
objects, so nine lines of nested ``&a [*a, *a, ...]`` load instantly and then expand to hundreds of
millions of values in the first walk over the document (environment substitution, validation).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

#: More values than any real config holds (a 3,000-route config is ~100,000): beyond this, aliases.
MAX_EXPANDED_VALUES = 2_000_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a mapping with the same key twice."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, MappingNode):  # "!!map foo": SafeLoader says what is wrong
            return super().construct_mapping(node, deep=deep)
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *defaults" may be repeated by design
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: let SafeLoader say so
                break
            if first is not None:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice (first on line {first.line + 1}); a later one would silently win",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse one YAML document strictly; ``yaml.YAMLError`` for a repeated key, a document that refers to
    itself, or one whose aliases expand to more than :data:`MAX_EXPANDED_VALUES` values."""
    data = yaml.load(text, Loader=_UniqueKeyLoader)
    _expanded_size(data, {}, set())
    return data


def _expanded_size(value: Any, sizes: dict[int, int], open_ids: set[int]) -> int:
    """How many values ``value`` holds once every alias is written out (memoised per shared object)."""
    if not isinstance(value, dict | list):
        return 1
    key = id(value)
    if key in sizes:
        return sizes[key]
    if key in open_ids:
        raise yaml.YAMLError("the document refers to itself through an alias (&a ... *a inside itself)")
    open_ids.add(key)
    children = value.values() if isinstance(value, dict) else value
    size = 1 + sum(_expanded_size(child, sizes, open_ids) for child in children)
    open_ids.discard(key)
    if size > MAX_EXPANDED_VALUES:
        raise yaml.YAMLError(
            f"the document expands to more than {MAX_EXPANDED_VALUES:,} values through its aliases (*name); "
            "write the repeated parts out or reuse fewer of them"
        )
    sizes[key] = size
    return size
