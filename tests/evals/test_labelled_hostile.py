"""Training and evaluation data as users really have it: labelled files with the quirks of the tools that
wrote them, and logged traffic with its failures. Each either loads as the data it means or stops with one
line naming the file, line and field (exit code 2, no traceback), through the real ``pointsman`` CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from evals.labelled import FAILED_ANSWER, DataError, load_source
from tests.evals.labelled_files import STRONG, WEAK, rows, write_jsonl
from tests.evals.test_report import eval_config
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess


def pointsman(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


# ----------------------------------------------------------------------------- logged traffic


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    server = FakeUpstream().start()
    yield server
    server.stop()


def _route(name: str, strong: str, weak: str) -> dict[str, Any]:
    # threshold 0: every request goes to the strong model of the route.
    return {"name": name, "policy": "rules", "cost_quality": {"strong": strong, "weak": weak, "threshold": 0.0},
            "record": {"embedding": True, "text": True}}


def test_feedback_on_an_answer_that_failed_is_no_quality_label(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A client thumbs down the 502 it got when the upstream failed: the model the record names never
    answered, so the row must not teach a router that it cannot do the prompt."""
    config = {
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "models": [{"name": "broken", "upstream_name": "always-500"},
                                 {"name": "works", "upstream_name": "ok"}]}],
        "routes": [_route("to-broken", "broken", "works"), _route("to-works", "works", "broken")],
        "classifiers": {"encoder": "static"},
    }
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        ids = {}
        for route, prompt in (("to-broken", "What is 17 * 23?"), ("to-works", "Say hi to Anna.")):
            answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=60, json={
                "model": route, "messages": [{"role": "user", "content": prompt}]})
            ids[route] = answer.headers["x-pointsman-request-id"]
            thumbs = "down" if answer.status_code != 200 else "up"
            posted = httpx.post(f"{gateway.base_url}/feedback", timeout=30,
                                json={"request_id": ids[route], "thumbs": thumbs})
            assert posted.status_code == 200, posted.text
        assert gateway.decision(ids["to-broken"])["status"] == 502
        assert gateway.decision(ids["to-works"])["status"] == 200
    finally:
        gateway.terminate()

    source = load_source(f"logs:sqlite:///{gateway.db_path}")
    assert [(r.request_id, r.qualities) for r in source.rows] == [(ids["to-works"], {"works": 1.0})]
    assert source.skipped == {FAILED_ANSWER: 1}
    # What the user reads when training from the store: one request, of the model that answered.
    trained = pointsman("train", "--data", f"logs:sqlite:///{gateway.db_path}", "--encoders", "static",
                        "--out", str(tmp_path / "routers"), "--no-progress")
    assert "1 row, models: works (skipped: {'" + FAILED_ANSWER + "': 1})" in trained.stdout, trained.stdout


# ----------------------------------------------------------------------------- labelled files


def _cli(command: str, data: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``pointsman train`` or ``pointsman eval`` on one labelled file, as small and quick as they go."""
    if command == "train":
        return pointsman("train", "--data", f"file:{data}", "--encoders", "static", "--out",
                         str(tmp_path / "routers"), "--no-progress", "--no-warm-start")
    config = eval_config(tmp_path / "config.yaml", threshold=0.5)
    return pointsman("eval", "--config", str(config), "--route", "auto", "--data", f"file:{data}", "--out",
                     str(tmp_path / "report"), "--bootstrap", "20", "--no-progress")


def _refused(run: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit code 2 and one line saying ``message``, no traceback."""
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert message in run.stderr, run.stderr


@pytest.mark.parametrize("command", ["train", "eval"])
def test_text_cut_inside_an_emoji_is_named_where_it_is(command: str, tmp_path: Path) -> None:
    """A tool that truncates by UTF-16 units leaves half an emoji, which JSON spells as a lone \\ud83d
    escape: not a character (it cannot be encoded, so it cannot be hashed or embedded)."""
    data = tmp_path / "labels.jsonl"
    whole = r'{"prompt": "Thanks \ud83d\ude00", "scores": {"big-model": 1, "small-model": 1}}'
    cut = (r'{"messages": [{"role": "user", "content": "Great job \ud83d"}], '
           r'"scores": {"big-model": 1, "small-model": 0}}')
    data.write_text(f"{whole}\n{whole}\n{cut}\n", encoding="utf-8")
    _refused(_cli(command, data, tmp_path), f"{data}:3: messages[0].content: \\ud83d is half of a surrogate pair")


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_number_too_long_to_read_is_named_where_it_is(command: str, tmp_path: Path) -> None:
    data = tmp_path / "labels.jsonl"
    data.write_text('{"prompt": "hi", "scores": {"big-model": 1, "small-model": 0}, "costs": {"big-model": '
                    + "9" * 5000 + "}}\n", encoding="utf-8")
    _refused(_cli(command, data, tmp_path), f"{data}:1: not JSON (a number of more than 4300 digits)")


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        # Gemini's shape: no content at all, so the router would have read the empty prompt.
        ({"role": "user", "parts": [{"text": "Prove that sqrt(2) is irrational."}]},
         "messages[0].content must be a string or an array of content parts"),
        ({"role": "user", "content": {"text": "hi"}}, "messages[0].content must be a string or an array"),
        ({"content": "hi"}, "messages[0].role is required and must be a string"),
        ({"role": "human", "content": "hi"}, "messages[0].role must be one of"),
        ({"role": "user", "content": "  "}, "messages hold no text (every content is empty)"),
    ],
)
@pytest.mark.parametrize("command", ["train", "eval"])
def test_messages_the_gateway_would_refuse_are_named_where_they_are(
    command: str, message: dict[str, Any], refused: str, tmp_path: Path
) -> None:
    """Each of these loaded before, and was trained and graded as the empty prompt (or a dict's repr)."""
    data = write_jsonl(tmp_path / "labels.jsonl", [
        *rows(seed=5, n=30), {"messages": [message], "scores": {STRONG: 1, WEAK: 0}}, *rows(seed=6, n=10)])
    _refused(_cli(command, data, tmp_path), f"{data}:31: {refused}")


def test_content_parts_and_tool_turns_still_load(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "labels.jsonl", [{"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "look", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
    ], "scores": {STRONG: 1, WEAK: 0}}])
    (row,) = load_source(f"file:{data}").rows
    assert "What is in this picture?" in row.text() and row.labelled_for(STRONG, WEAK)


def test_a_spreadsheet_in_a_decimal_comma_locale_loads_like_the_same_rows_in_jsonl(tmp_path: Path) -> None:
    """Excel in a German or French locale saves "CSV UTF-8" with a byte-order mark, CRLF, semicolons between
    cells and decimal commas; people capitalise headers. Before, it was refused as having no score columns
    (or no prompt column), with a hint to name them score:<model>, which they were."""
    items = rows(seed=8, n=40)
    items[0]["prompt"] = "Plan a trip; three days, two cities."  # a semicolon and a comma inside a cell
    items[1]["scores"][WEAK] = 0.25
    items[2]["weight"] = 1.5

    def decimal_comma(value: object) -> str:
        return "" if value is None else str(value).replace(".", ",")

    lines = [f"Prompt;Score:{STRONG};Score:{WEAK};Cost:{STRONG};Cost:{WEAK};Weight"]
    for item in items:
        scores, costs = item["scores"], item["costs"]
        cells = [scores[STRONG], scores[WEAK], costs[STRONG], costs[WEAK], item.get("weight", 1.0)]
        prompt = '"' + item["prompt"] + '"' if ";" in item["prompt"] else item["prompt"]
        lines.append(";".join([prompt, *map(decimal_comma, cells)]))
    excel = tmp_path / "labels.csv"
    excel.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")

    loaded = load_source(f"file:{excel}").rows
    expected = load_source(f"file:{write_jsonl(tmp_path / 'labels.jsonl', items)}").rows
    assert [(r.messages, r.qualities, r.costs, r.weight) for r in loaded] == [
        (r.messages, r.qualities, r.costs, r.weight) for r in expected]
    assert loaded[1].qualities[WEAK] == 0.25 and loaded[0].messages[0]["content"].startswith("Plan a trip; three")
    report = tmp_path / "report"
    run = pointsman("eval", "--config", str(eval_config(tmp_path / "config.yaml", threshold=0.5)), "--route", "auto",
                    "--data", f"file:{excel}", "--out", str(report), "--bootstrap", "20", "--no-progress")
    assert run.returncode == 0, run.stderr
    assert json.loads((report / "report.json").read_text())["rows"]["evaluated"] == 40


def test_numbers_written_as_strings_load_as_the_numbers_and_text_is_named(tmp_path: Path) -> None:
    # A dataframe of strings exported to JSON writes "0.8": read as the same CSV cell is, not "not a quality".
    quoted = write_jsonl(tmp_path / "quoted.jsonl", [
        {"prompt": "Prove it.", "scores": {STRONG: "0.8", WEAK: " 0 "}, "costs": {STRONG: "0.002"}}])
    (row,) = load_source(f"file:{quoted}").rows
    assert row.qualities == {STRONG: 0.8, WEAK: 0.0} and row.costs == {STRONG: 0.002}
    for value, refused in (("good", "'good' is text, not a number"), ("1.5", "1.5 is not a quality in [0, 1]")):
        data = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "hi", "scores": {STRONG: value, WEAK: 0}}])
        _refused(_cli("eval", data, tmp_path), f"{data}:1: scores.{STRONG}: {refused}")


def test_a_jsonl_row_with_missing_cells_reads_like_the_same_csv_row(tmp_path: Path) -> None:
    """pd.concat of two labelled frames, one with a weight (or domain, source) column and one without, leaves
    NaN in the other's rows: to_csv writes an empty cell (weight 1, no domain), to_json null and json.dumps of a
    row NaN. The JSONL was refused whole ('weight: None is not a number >= 0'), or read domain and source 'nan';
    a frame of strings wrote its correct/incorrect and missing cells "True" / "" ('text, not a number')."""
    nan = float("nan")
    frame = [  # prompt, score strong, score weak, weight, domain, source
        ("Prove there are infinitely many primes.", True, False, 2.0, "math", "team-a"),
        ("Say hi to Anna.", 1.0, 1.0, nan, nan, nan),
        ("Solve 3x + 5 = 20.", "True", "false", None, None, None),
        ("Name a colour.", "", "0", "1.5", "chat", ""),
    ]
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text(f"prompt,score:{STRONG},score:{WEAK},weight,domain,source\n" + "".join(
        ",".join("" if v is None or v != v else str(v) for v in row) + "\n" for row in frame))
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text("".join(json.dumps({
        "prompt": p, "scores": {STRONG: s, WEAK: w}, "weight": weight, "domain": domain, "source": source,
    }) + "\n" for p, s, w, weight, domain, source in frame))

    def read(path: Path) -> list[tuple[Any, ...]]:
        return [(r.text(), r.qualities, r.weight, r.domain, r.source.replace(path.name, "FILE"))
                for r in load_source(f"file:{path}").rows]

    from_jsonl = read(jsonl)
    assert from_jsonl == read(csv_path)
    assert [row[1:] for row in from_jsonl] == [
        ({STRONG: 1.0, WEAK: 0.0}, 2.0, "math", "team-a"),
        ({STRONG: 1.0, WEAK: 1.0}, 1.0, None, "file:FILE"),
        ({STRONG: 1.0, WEAK: 0.0}, 1.0, None, "file:FILE"),
        ({STRONG: None, WEAK: 0.0}, 1.5, "chat", "file:FILE"),
    ]


def test_a_frame_mixing_prompt_and_messages_rows_loads_from_jsonl_as_from_csv(tmp_path: Path) -> None:
    """pd.concat of single-prompt rows and conversations: each row has both columns, one of them missing. The
    CSV's empty messages cell falls back to the prompt; the JSONL's null (to_json) or NaN (json.dumps of a row)
    messages was refused as 'messages must be a non-empty list of message objects'."""
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]
    frame = [("Say hi to Anna.", None), ("Solve 3x + 5 = 20.", float("nan")), (None, conversation)]
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": p, "messages": m, "scores": {STRONG: 1, WEAK: 0}}) + "\n"
                             for p, m in frame))
    csv_path = tmp_path / "labels.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["prompt", "messages", f"score:{STRONG}", f"score:{WEAK}"])
        writer.writerows([p or "", json.dumps(m) if isinstance(m, list) else "", 1, 0] for p, m in frame)
    loaded = [r.messages for r in load_source(f"file:{jsonl}").rows]
    assert loaded == [r.messages for r in load_source(f"file:{csv_path}").rows]
    assert loaded == [[{"role": "user", "content": "Say hi to Anna."}],
                      [{"role": "user", "content": "Solve 3x + 5 = 20."}], conversation]


def test_a_json_array_of_rows_loads_as_the_same_rows_in_jsonl(tmp_path: Path) -> None:
    """pandas' to_json(orient="records") writes one JSON array; it was refused line by line ('expected a JSON
    object per line'). It reads as the JSONL of the same rows; an array of other things names the item."""
    rows = [{"prompt": "Solve 3x + 5 = 20.", "scores": {STRONG: 1, WEAK: 0}},
            {"messages": [{"role": "user", "content": "Hi ☃"}], "scores": {STRONG: 1, WEAK: 1}, "weight": 0.5}]
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    array = tmp_path / "labels.json"
    array.write_text("\ufeff  " + json.dumps(rows, ensure_ascii=False), encoding="utf-8")

    def read(path: Path) -> list[tuple[Any, ...]]:
        return [(r.text(), r.qualities, r.weight) for r in load_source(f"file:{path}").rows]

    assert read(array) == read(jsonl) and len(read(array)) == 2
    array.write_text(json.dumps([rows[0], "not a row"]), encoding="utf-8")
    with pytest.raises(DataError, match=r"labels.json: item 1: expected a JSON object"):
        load_source(f"file:{array}")


def test_a_messages_cell_written_with_pythons_quotes_is_refused_saying_how_to_write_it(tmp_path: Path) -> None:
    """pandas' to_csv writes a column of message lists with str(): single quotes, which JSON is not."""
    path = tmp_path / "labels.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["messages", f"score:{STRONG}", f"score:{WEAK}"],
                                  [str([{"role": "user", "content": "Hi"}]), "1", "0"]])
    with pytest.raises(DataError, match=r"labels.csv:2: column messages is not JSON .*write json.dumps\(messages\)"):
        load_source(f"file:{path}")
