"""Registry version ids are matched whole: an id with a trailing newline (``$`` in a Python pattern accepts
one) or digits of another script is not a version id, wherever it comes from (a command line, active.json,
a directory under versions/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from classifiers.registry import ACTIVE_FILE, RegistryError, RouterRegistry, is_version_id, resolve_routers_dir
from tests.fakes.routers import add_version

P = {("big", "small"): 0.9}


@pytest.mark.parametrize(
    "text",
    [
        "v0001-0123abcd\n",
        "v\u0660\u0660\u0660\u0661-0123abcd",
        " v0001-0123abcd",
        "v0001-0123abcd ",
        "v0001-0123ABCD",
        "v001-0123abcd",
    ],
)
def test_only_a_whole_version_id_is_one(text: str) -> None:
    assert is_version_id("v0001-0123abcd") and is_version_id("v12345-0123abcd")
    assert not is_version_id(text)


def test_an_id_with_a_trailing_newline_names_no_version(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    version = add_version(registry, P)
    with pytest.raises(KeyError, match="is not a version id"):
        registry.version_dir(version + "\n")


def test_active_json_naming_an_id_with_a_newline_is_called_corrupt_in_one_line(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    version = add_version(registry, P)
    active = registry.root / ACTIVE_FILE
    active.write_text(json.dumps({**json.loads(active.read_text()), "version": version + "\n"}))
    with pytest.raises(RegistryError) as raised:
        resolve_routers_dir(registry.root)
    message = str(raised.value)
    assert message.startswith(f"{active}: ") and "is not a version id" in message and "\n" not in message


def test_a_directory_named_like_an_id_with_a_newline_is_no_version(tmp_path: Path) -> None:
    # A copy made by hand (a script's "$name" with the newline of a read line): listed as the newest version,
    # it numbered the next one after itself and could be promoted.
    registry = RouterRegistry(tmp_path / "routers")
    first = add_version(registry, P)
    shutil.copytree(registry.version_dir(first), registry.root / "versions" / "v0007-0123abcd\n")
    assert registry.version_ids() == [first]
    second = add_version(registry, {("big", "small"): 0.1})
    assert second.startswith("v0002-")
