"""Replay a saved fuzz case: ``python -m tests.fuzz.replay FILE [--host H] --port P``.

FILE holds the exact request bytes a failing case sent (the failure message names it). The request
is sent on one connection, followed by the suite's valid follow-up request on the same connection,
and both responses are printed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.fuzz.wire import Connection, ConnectionLost, follow_up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    data = args.file.read_bytes()
    method = data.split(b" ", 1)[0].decode()
    with Connection(args.port, args.host) as conn:
        for name, (raw, verb) in (("fuzzed", (data, method)), ("follow-up", (follow_up().wire(), "POST"))):
            try:
                reply = conn.exchange_bytes(raw, verb)
            except ConnectionLost as exc:
                print(f"{name}: connection lost: {exc}")
                return
            print(f"{name}: HTTP {reply.status}")
            for key, value in reply.headers:
                print(f"  {key}: {value}")
            print(f"  {reply.body[:2000]!r}")


if __name__ == "__main__":
    main()
