"""The embedded model child's output is read in lines of bounded length.

llama.cpp prints its loading progress as dots with no newline; the gateway kept everything since the last
newline and re-copied it on every 64 KB read, so a child writing without newlines grew the gateway's
memory (and its crash report) without bound.
"""

from __future__ import annotations

import asyncio

from gateway.config import LocalModelConfig
from gateway.local_model import MAX_OUTPUT_LINE, LocalModelServer, OutputLines


async def test_a_child_writing_megabytes_without_a_newline_leaves_one_cut_line_in_the_tail() -> None:
    server = LocalModelServer(LocalModelConfig(enabled=True, n_threads=1))
    reader = asyncio.StreamReader(limit=1 << 16)
    reader.feed_data(b"loading model")
    reader.feed_data(b"." * (20 << 20))  # 20 MB of progress dots, no newline
    reader.feed_data(b"\nmodel loaded\nlast words without a newline")
    reader.feed_eof()
    await server._drain(reader)
    tail = server.output_tail()
    assert tail == ["loading model" + "." * (MAX_OUTPUT_LINE - 13) + " [...]", "model loaded",
                    "last words without a newline"]


def test_lines_are_split_across_chunks_and_cut_at_the_limit() -> None:
    lines = OutputLines(limit=8)
    assert lines.feed(b"abc") == []
    assert lines.feed(b"de\nfgh") == [b"abcde"]
    assert lines.feed(b"ijklmnop") == [b"fghijklm [...]"]  # cut once; the rest up to its newline dropped
    assert lines.feed(b"qrstuvwxyz" * 3) == []
    assert lines.feed(b"\n\n12345678\n123456789\nend") == [b"", b"12345678", b"12345678 [...]"]
    assert lines.close() == [b"end"]
    assert lines.close() == []
