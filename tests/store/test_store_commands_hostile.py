"""Operator commands on a store (``pointsman forget``) pointed at awkward stores: a DSN whose password is
in the query string, a database a newer release has migrated."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.fakes.upstream import free_port


def forget_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "forget", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_password_in_the_dsn_query_is_not_printed() -> None:
    # asyncpg (like libpq) takes the password as a query parameter too.
    url = f"postgresql://ops@127.0.0.1:{free_port()}/pointsman?password=s3cret-pw&sslmode=disable"
    done = forget_command("--store", url, "--tenant", "acme")
    assert done.returncode == 2
    assert "forget failed" in done.stderr and "password=***" in done.stderr
    assert "s3cret-pw" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?sslmode=require&PASSWORD=pw", "postgresql://u@h/db?sslmode=require&PASSWORD=***"),
        ("postgresql://u@h/db?mypassword=x", "postgresql://u@h/db?mypassword=x"),
    ],
)
def test_masked_store_url(url: str, masked: str) -> None:
    from store.url import masked_store_url

    assert masked_store_url(url) == masked
