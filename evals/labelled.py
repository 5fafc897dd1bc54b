"""Training data in one table shape: labelled requests, and the loaders that produce them.

A :class:`LabelledRequest` is a conversation with a quality per model (``None`` = not known), a cost
per model, where it came from and how much it weighs. A request is *labelled for a pair* when both
models of the pair have a quality. Every loader returns this shape, so training, evaluation and the
promotion gate read any mix of sources the same way:

- ``bundled``: the RouteLLM data (MMLU, GSM8K, MT-bench; GPT-4-1106 vs Mixtral-8x7B) from the shared
  data directory (``$POINTSMAN_DATA_DIR`` or ``../shared/data``). MT-bench's 1-10 judge scores are
  mapped onto [0, 1] as ``(score - 1) / 9``.
- ``DIR``: a data directory like the shared one (``DIR/routellm/``), or a directory of labelled files
  (every ``*.jsonl`` and ``*.csv`` in it, sorted by name).
- ``file:PATH``: a labelled file, JSONL or CSV (by extension; see :func:`load_file`).
- ``logs:STORE_URL``: logged traffic (``store.open_store_url``): decision records joined with their
  feedback under metric ``quality`` (see :func:`requests_from_logs`). The same fetch also yields the
  *logged single-outcome* rows off-policy evaluation reads (the served model, its propensity and its
  answer's outcome: :func:`evals.offpolicy.outcomes_from_logs`) as :attr:`LoadedSource.logged`.

Qualities are in [0, 1] (1 = a perfect answer). Costs are USD per call (optional).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evals.run_sync import run_sync
from gateway.errors import InvalidRequestError
from gateway.protocol import CHAT, validate_request
from policies.textfile import first_non_utf8

if TYPE_CHECKING:
    from evals.offpolicy import LoggedOutcome

csv.field_size_limit(1 << 30)

#: Characters of the conversation text the encoders see (serving uses the same bound).
MAX_CHARS = 2000


@dataclass(slots=True)  # no per-row __dict__: a 500,000-row file is 500,000 of these
class LabelledRequest:
    """One request of the training table."""

    messages: list[dict[str, Any]]
    qualities: dict[str, float | None]
    costs: dict[str, float]
    source: str
    weight: float = 1.0
    embedding: np.ndarray | None = None  # as stored with the request (logs), with the encoder that made it
    encoder_id: str | None = None
    domain: str | None = None
    request_id: str | None = None

    def quality(self, model: str) -> float | None:
        """The model's quality on this request, or None."""
        return self.qualities.get(model)

    def labelled_for(self, strong: str, weak: str) -> bool:
        """Whether both models of the pair have a quality."""
        return self.qualities.get(strong) is not None and self.qualities.get(weak) is not None

    @property
    def has_text(self) -> bool:
        """Whether the conversation itself is known (not only its stored embedding)."""
        return bool(self.messages)

    def text(self) -> str:
        """The conversation's text as the serving encoder sees it (``conversation_text``)."""
        from classifiers.conversation import conversation_text

        return conversation_text({"messages": self.messages}, max_chars=MAX_CHARS)


@dataclass
class LoadedSource:
    """The rows of one ``--data`` source and a description of them for a version's ``data`` list."""

    spec: str
    rows: list[LabelledRequest]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows left out
    # ``logs:`` sources only: every request with an outcome of its served answer (off-policy rows).
    logged: list[LoggedOutcome] = field(default_factory=list)
    logged_skipped: dict[str, int] = field(default_factory=dict)
    # ``--holdout``: which part of the source ``rows`` are ({fraction, part, seed}; evals.holdout).
    holdout: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        """``{source, sha256, rows}`` (plus what was skipped and the hold-out part): what ``version.json``
        records."""
        out: dict[str, Any] = {"source": self.spec, "sha256": rows_hash(self.rows), "rows": len(self.rows)}
        if self.skipped:
            out["skipped"] = dict(self.skipped)
        if self.holdout:
            out["holdout"] = dict(self.holdout)
        return out


class DataError(ValueError):
    """A source that cannot be read, with the file, line and field that is wrong."""


def rows_hash(rows: Sequence[LabelledRequest]) -> str:
    """sha256 over the rows' conversations, qualities, costs and weights (names the exact data)."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps(r.messages, sort_keys=True, ensure_ascii=False).encode())
        h.update(json.dumps(sorted(r.qualities.items()), ensure_ascii=False).encode())
        h.update(json.dumps(sorted(r.costs.items()), ensure_ascii=False).encode())
        h.update(repr(float(r.weight)).encode())
        if r.embedding is not None and not r.messages:
            h.update(np.ascontiguousarray(r.embedding, dtype=np.float32).tobytes())
    return h.hexdigest()


def models_of(rows: Iterable[LabelledRequest]) -> list[str]:
    """Every model with at least one known quality, sorted."""
    return sorted({m for r in rows for m, q in r.qualities.items() if q is not None})


def user_messages(prompt: str) -> list[dict[str, Any]]:
    """A one-message conversation."""
    return [{"role": "user", "content": prompt}]


# ----------------------------------------------------------------------------- dispatch


def load_source(spec: str, *, data_dir: str | Path | None = None, metric: str = "quality") -> LoadedSource:
    """Load one ``--data`` source: ``bundled``, ``logs:STORE_URL``, ``file:PATH`` or a directory.

    ``data_dir`` overrides where ``bundled`` reads from (default: ``resolve_data_dir()``); ``metric``
    is the feedback metric a ``logs:`` source reads (default ``quality``).
    Raises :class:`DataError` naming the source when it cannot be read.
    """
    if spec == "bundled":
        from evals.data import resolve_data_dir

        root = resolve_data_dir(data_dir)
        if not (root / "routellm").is_dir():
            raise DataError(
                f"--data bundled: no routellm/ under {root} (set POINTSMAN_DATA_DIR to the shared data directory)"
            )
        return LoadedSource(spec, load_routellm_rows(root))
    if spec.startswith("logs:"):
        url = spec[len("logs:") :]
        if not url:
            raise DataError("--data logs:STORE_URL needs a store URL, e.g. logs:sqlite:///var/lib/pointsman.db")
        from evals.offpolicy import outcomes_from_logs
        from store.errors import StoreError

        try:
            logged = fetch_logged(url)
        except StoreError as exc:
            raise DataError(f"--data logs: {exc}") from None
        labelled, skipped = requests_from_logs(logged.requests, metric=metric, without_feedback=logged.without_feedback)
        outcomes, outcome_skipped = outcomes_from_logs(
            logged.requests, metric=metric, without_feedback=logged.without_feedback
        )
        # The source's name goes into the registry's version.json: never a database password.
        return LoadedSource(display_spec(spec), labelled, skipped, logged=outcomes, logged_skipped=outcome_skipped)
    if spec.startswith("file:"):
        path = Path(spec[len("file:") :]).expanduser()
        return LoadedSource(spec, load_file(path))
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "routellm").is_dir():
            return LoadedSource(spec, load_routellm_rows(path))
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".jsonl", ".csv") and p.is_file())
        if not files:
            raise DataError(f"--data {spec}: a directory with neither routellm/ nor *.jsonl / *.csv labelled files")
        rows: list[LabelledRequest] = []
        for f in files:
            rows.extend(load_file(f))
        return LoadedSource(spec, rows)
    if path.is_file():
        return LoadedSource(spec, load_file(path))
    raise DataError(missing_source(spec))


def missing_source(spec: str) -> str:
    """What ``--data SPEC`` naming neither a source kind nor an existing file or directory is told (a
    mistyped path, most likely)."""
    what = "no such file or directory" if not Path(spec).expanduser().exists() else "not a source"
    return f"--data {spec}: {what}; expected bundled, logs:STORE_URL, file:PATH, a labelled file or a directory"


def display_spec(spec: str) -> str:
    """``spec`` as it may be printed or recorded: a ``logs:`` store URL's password masked."""
    if spec.startswith("logs:"):
        from store.url import masked_store_url

        return "logs:" + masked_store_url(spec[len("logs:") :])
    return spec


def is_source_spec(spec: str) -> bool:
    """Whether ``spec`` names labelled data rather than the legacy shared data directory (``DIR/routellm``)."""
    if spec == "bundled" or spec.startswith(("logs:", "file:")):
        return True
    path = Path(spec).expanduser()
    return path.is_file() or (path.is_dir() and not (path / "routellm").is_dir())


# ----------------------------------------------------------------------------- bundled (RouteLLM)


def load_routellm_rows(data_dir: Path) -> list[LabelledRequest]:
    """RouteLLM's MMLU, GSM8K and MT-bench as labelled requests for GPT-4-1106 vs Mixtral-8x7B."""
    from evals.data import STRONG, WEAK, load_routellm

    out = []
    for r in load_routellm(data_dir):
        s, w = r.strong_quality, r.weak_quality
        if r.dataset == "mt_bench":  # judge scores 1-10 onto [0, 1]
            s, w = (s - 1.0) / 9.0, (w - 1.0) / 9.0
        out.append(
            LabelledRequest(
                messages=user_messages(r.prompt),
                qualities={STRONG: float(s), WEAK: float(w)},
                costs={},
                source=f"bundled:{r.dataset}",
                domain=r.domain,
            )
        )
    return out


# ----------------------------------------------------------------------------- labelled files


def load_file(path: Path) -> list[LabelledRequest]:
    """A labelled JSONL or CSV file (by extension: ``.jsonl``/``.json`` or ``.csv``).

    JSONL, one object per line (or one JSON array of them, as pandas' ``to_json(orient="records")``
    writes)::

        {"messages": [{"role": "user", "content": "..."}],     # or "prompt": "..."
         "scores": {"model-a": 0.9, "model-b": false},         # quality in [0, 1] or true/false; null/NaN = unknown
         "costs": {"model-a": 0.002, "model-b": 0.0001},       # optional, USD per call
         "weight": 1.0, "source": "support-tickets", "domain": "code", "id": "req-17"}   # optional

    CSV, one row per request, with a header: ``prompt`` (or ``messages``, a JSON list of messages),
    one ``score:<model>`` column per model (a number or true/false; an empty cell or NaN = unknown),
    optional ``cost:<model>``, ``weight``, ``source``, ``domain`` and ``id`` columns. Every row has as
    many cells as the header (a short or long row is refused: its cells would land in the wrong columns),
    and no column is named twice. Column names and prefixes are read in any case (``Prompt``,
    ``Score:gpt-4o``; a model's name keeps its case). A header with semicolons and no comma makes a
    semicolon-separated file, whose numbers may have a decimal comma (``0,5``), as spreadsheets in such
    locales save them; a tab-separated header likewise.

    Model names lose surrounding spaces; an empty one, or one with a control character, is refused. Errors
    name the file, the line (for a CSV row, the line where it starts) and the field.

    Both are UTF-8; a byte-order mark (as spreadsheets write) is allowed.
    """
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".ndjson", ".csv"):
        raise DataError(f"{path}: unknown labelled file type {suffix!r}; expected .jsonl or .csv")
    try:
        return _load_csv(path) if suffix == ".csv" else _load_jsonl(path)
    except UnicodeDecodeError:
        raise DataError(f"{path}: {first_non_utf8(path.read_bytes())}; save the file as UTF-8") from None


def _default_source(path: Path) -> str:
    return f"file:{path.name}"


def _load_jsonl(path: Path) -> list[LabelledRequest]:
    out = []
    source, names = _default_source(path), ModelNames()
    if _holds_an_array(path):
        # One JSON array of row objects (pandas' to_json(orient="records"), a hand-written .json file).
        rows = _parse_json(path.read_text(encoding="utf-8-sig"), str(path))
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON array of objects or one JSON object per line")
        for index, obj in enumerate(rows):
            where = f"{path}: item {index}"
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object")
            out.append(_row(obj, where, source, names))
        return out
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            obj = _parse_json(line, where)
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object per line")
            out.append(_row(obj, where, source, names))
    return out


def _holds_an_array(path: Path) -> bool:
    """Whether the file's first character past a byte-order mark and white space is ``[``."""
    with path.open(encoding="utf-8-sig") as fh:
        while chunk := fh.read(4096):
            text = chunk.lstrip()
            if text:
                return text[0] == "["
    return False


def _load_csv(path: Path) -> list[LabelledRequest]:
    """A labelled CSV (see :func:`load_file`). Errors name the line where the bad row starts: a quoted
    prompt may span several lines."""
    out = []
    source, names = _default_source(path), ModelNames()
    delimiter = _csv_delimiter(path)
    # A semicolon file is what a spreadsheet set to a decimal-comma locale writes: its numbers read 0,5.
    number = _decimal_comma if delimiter == ";" else str
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        raw_header = next(reader, [])
        header_line = reader.line_num or 1
        header = [c.strip() for c in raw_header]
        columns = _csv_columns(path, header_line, raw_header)
        score_cols = [(i, name) for i, (kind, name) in columns.items() if kind == "score"]
        cost_cols = [(i, name) for i, (kind, name) in columns.items() if kind == "cost"]
        plain = {name: i for i, (kind, name) in columns.items() if kind == "plain"}
        if not score_cols:
            raise DataError(
                f"{path}: no score:<model> columns (header: {', '.join(header) or 'empty'})"
                + _score_column_hint(path, header, delimiter)
            )
        if "prompt" not in plain and "messages" not in plain:
            raise DataError(f"{path}: needs a prompt or a messages column (header: {', '.join(header)})")
        end = reader.line_num
        for cells in reader:
            start, end = end + 1, reader.line_num  # the physical lines this row spans
            if not cells:  # a blank line, as csv.DictReader skips them
                continue
            where = f"{path}:{start}"
            if len(cells) != len(header):
                raise DataError(
                    f"{where}: {len(cells)} cells, but the header (line {header_line}) has {len(header)} columns; "
                    "a cell holding a comma or a line break must be quoted"
                )
            obj: dict[str, Any] = {
                "scores": {m: _cell_score(number(cells[i]), where, header[i]) for i, m in score_cols},
                "costs": {m: v for i, m in cost_cols
                          if (v := _cell_number(number(cells[i]), where, header[i])) is not None},
            }
            if "messages" in plain and cells[plain["messages"]]:
                obj["messages"] = _parse_json(cells[plain["messages"]], where, "messages")
            else:
                obj["prompt"] = cells[plain["prompt"]] if "prompt" in plain else ""
            for key in ("weight", "source", "domain", "id"):
                if key in plain and cells[plain[key]]:
                    value = cells[plain[key]]
                    obj[key] = _cell_number(number(value), where, key) if key == "weight" else value
            out.append(_row(obj, where, source, names))
    return out


def _csv_delimiter(path: Path) -> str:
    """``;`` when the header line has semicolons and no comma (a spreadsheet in a decimal-comma locale saves
    CSV so), a tab likewise, else ``,``."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        first = fh.readline()
    if "," not in first:
        for delimiter in (";", "\t"):
            if delimiter in first:
                return delimiter
    return ","


_DECIMAL_COMMA = re.compile(r"\s*[+-]?\d*,\d+\s*")


def _decimal_comma(cell: str) -> str:
    """A number written with a decimal comma (``0,5``) with a decimal point; any other cell as it is."""
    return cell.replace(",", ".") if _DECIMAL_COMMA.fullmatch(cell) else cell


#: A ``\uD800``-``\uDFFF`` escape: JSON can spell half of a UTF-16 surrogate pair, which is no character.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


_PYTHON_REPR = re.compile(r"\s*\[\s*\{\s*'")


def _parse_json(text: str, where: str, column: str | None = None) -> Any:
    """``text`` (a JSONL line, or the cell of CSV column ``column``) as JSON; :class:`DataError` at ``where``
    for what is not JSON, and for a string holding half a surrogate pair: JSON's escapes can spell one (a
    text cut inside an emoji by a tool counting UTF-16 units), but it is no character, so it could not be
    hashed, encoded or sent (the gateway refuses such a body)."""
    what = f"column {column} is " if column else ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = ""
        if column and _PYTHON_REPR.match(text):
            # pandas' to_csv writes a column of lists with str(): Python's quotes, not JSON's
            hint = "; it looks like Python's str() of a list: write json.dumps(messages) into the column"
        raise DataError(f"{where}: {what}not JSON ({exc.msg}){hint}") from None
    except ValueError:  # an integer of more digits than Python converts
        raise DataError(f"{where}: {what}not JSON (a number of more than {sys.get_int_max_str_digits()} "
                        "digits)") from None
    if _SURROGATE_ESCAPE.search(text):  # a valid pair decodes to one character: only a lone half stays one
        found = _lone_surrogate(value, column or "")
        if found is not None:
            name, char = found
            raise DataError(f"{where}: {name or 'the line'}: \\u{ord(char):04x} is half of a surrogate pair, not a "
                            "character (a text cut inside an emoji?)")
    return value


def _lone_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """The field (a dotted path) of the first string in ``value`` holding a lone surrogate, and that character."""
    if isinstance(value, str):
        return next(((path, c) for c in value if "\ud800" <= c <= "\udfff"), None)
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _lone_surrogate(item, f"{path}[{i}]")) is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            field_ = f"{path}.{key}" if path else str(key)
            if (found := _lone_surrogate(key, f"a name in {path or 'the object'}")) is not None:
                return found
            if (found := _lone_surrogate(item, field_)) is not None:
                return found
    return None


def _csv_columns(path: Path, line: int, header: Sequence[str]) -> dict[int, tuple[str, str]]:
    """Each named column of a labelled CSV header: ``(kind, name)`` by position, kind ``score``, ``cost``
    (name = the model, its case kept) or ``plain`` (name = the column), spaces around names dropped; the
    known columns and prefixes in any case (``Prompt``, ``Score:gpt-4o``). Refuses a column named twice
    and a model name that :func:`check_model_name` refuses, naming the header line and the column as
    written."""
    columns: dict[int, tuple[str, str]] = {}
    seen: dict[tuple[str, str], str] = {}
    for i, written in enumerate(header):
        column = written.strip()
        if not column:
            continue  # an unnamed column (a trailing comma): nothing reads it
        # Spreadsheets and pandas capitalise headers; a model's name keeps its case (it names the model).
        lower = column.lower()
        kind, name = "plain", lower if lower in _KNOWN_COLUMNS else column
        for prefix in ("score:", "cost:"):
            if lower.startswith(prefix):
                kind = prefix[:-1]
                # Spreadsheets keep stray spaces: "score: gpt-4o " is gpt-4o, as in the other columns.
                name = check_model_name(column[len(prefix) :], f"{path}:{line}: column {written!r}")
        if (kind, name) in seen:
            raise DataError(f"{path}:{line}: column {written!r} repeats column {seen[kind, name]!r}; keep one")
        seen[kind, name] = written
        columns[i] = (kind, name)
    return columns


def check_model_name(name: object, where: str) -> str:
    """A model name from a labelled file, without surrounding spaces; :class:`DataError` at ``where`` for
    one that is empty or holds a control character (a tab, a line break: never a real model's name, and
    they would break the one-line reports that print it)."""
    text = str(name).strip()
    if not text:
        raise DataError(f"{where}: an empty model name")
    if any(unicodedata.category(c) == "Cc" for c in text):
        raise DataError(f"{where}: model name {text!r} holds a control character")
    return text


#: Columns of a labelled CSV that are never a model's outcome.
_KNOWN_COLUMNS = frozenset({"prompt", "messages", "weight", "source", "domain", "id"})


def _score_column_hint(path: Path, header: Sequence[str], delimiter: str = ",", sample: int = 50) -> str:
    """A hint naming the columns that look like per-model outcomes (every cell of the first rows a number,
    a true/false or empty), as RouteLLM's and RouterBench's exports have them, with the rename they need."""
    # A cost column (RouterBench's ``<model>|total_cost``) holds small numbers too: not a quality.
    candidates = [c for c in header if c and c.lower() not in _KNOWN_COLUMNS and "cost" not in c.lower()]
    looks_like_score = dict.fromkeys(candidates, False)
    with path.open(encoding="utf-8-sig", newline="") as fh:
        for i, cells in enumerate(csv.DictReader(fh, delimiter=delimiter)):
            if i >= sample:
                break
            for c in list(looks_like_score):
                cell = (cells.get(c) or "").strip()
                if not cell:
                    continue
                try:
                    number = _cell_score(cell, "", c)
                except DataError:
                    del looks_like_score[c]
                    continue
                if number is not None and not 0.0 <= float(number) <= 1.0:
                    del looks_like_score[c]
                else:
                    looks_like_score[c] = True
    models = [c for c, seen in looks_like_score.items() if seen]
    if not models:
        return "; name each model's quality column score:<model>"
    renamed = ", ".join(f"{m!r} -> 'score:{m}'" for m in models[:4])
    more = f" and {len(models) - 4} more" if len(models) > 4 else ""
    count = len(models)
    return f"; {count} columns look like per-model qualities: rename them ({renamed}{more}), costs to cost:<model>"


def _cell_score(cell: str | None, where: str, column: str) -> float | bool | None:
    """A score cell: a number, or ``true``/``false`` as spreadsheets and pandas write a correct/incorrect column."""
    if cell is not None and cell.strip().lower() in _BOOL_CELLS:
        return _BOOL_CELLS[cell.strip().lower()]
    return _cell_number(cell, where, column)


_BOOL_CELLS = {"true": True, "false": False}


def _cell_number(cell: str | None, where: str, column: str) -> float | None:
    if cell is None or cell.strip() == "":
        return None
    try:
        return float(cell)
    except ValueError:
        raise DataError(f"{where}: column {column}: {cell!r} is not a number") from None


def _scale_hint(q: object) -> str:
    """What a score above 1 probably is, and how to map it (judges often score 1-10, people 1-5 or %)."""
    if isinstance(q, bool) or not isinstance(q, int | float) or not math.isfinite(q) or not 1.0 < q <= 100.0:
        return ""
    if q <= 5.0:
        return " (a 1-5 rating? map it as (s - 1) / 4)"
    if q <= 10.0:
        return " (a 1-10 judge score? map it as (s - 1) / 9, as MT-bench's are)"
    return " (a percentage? divide by 100)"


def _number_in_quotes(value: object, where: str, *, booleans: bool = False) -> object:
    """A number written as a string (``"0.8"``: a spreadsheet or a dataframe of strings exported to JSON)
    read as the number, as the same cell of a CSV file is (and, with ``booleans``, ``"True"``/``"false"`` as
    the bool); any other value as it is. A blank string is a missing value (None), as an empty CSV cell."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return None
    if booleans and text.lower() in _BOOL_CELLS:
        return _BOOL_CELLS[text.lower()]
    try:
        return float(text)
    except ValueError:
        raise DataError(f"{where}: {value!r} is text, not a number") from None


def _missing(value: object) -> bool:
    """Whether a JSON value is a missing cell: null, or NaN as json.dumps of a pandas row writes one."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _optional_text(value: object) -> str | None:
    """An optional text field (``source``, ``domain``, ``id``): None when missing or empty (an empty CSV cell,
    null or NaN from a dataframe), else the value as text."""
    return None if _missing(value) or value == "" else str(value)


class ModelNames(dict[str, str]):
    """The model names one file has written, each as :func:`check_model_name` returned it: a name is checked
    once per file, not once per row, and every row shares one string per model."""

    def checked(self, raw: object, where: str) -> str:
        """``check_model_name(raw, where)``, remembered for a name written as a string."""
        if isinstance(raw, str):
            known = self.get(raw)
            if known is None:
                known = self[raw] = check_model_name(raw, where)
            return known
        return check_model_name(raw, where)


def _row(obj: Mapping[str, Any], where: str, default_source: str, names: ModelNames | None = None) -> LabelledRequest:
    """Validate one JSON-shaped row (the CSV reader builds the same shape). ``names``: the file's checked model
    names so far (see :class:`ModelNames`)."""
    names = ModelNames() if names is None else names
    own_messages = False  # built here, so not copied below
    # A missing messages cell (null, NaN: a frame mixing conversations and single prompts) falls back to the
    # prompt, as an empty CSV cell does.
    if not _missing(obj.get("messages")):
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise DataError(f"{where}: messages must be a non-empty list of message objects")
        _check_servable(messages, where)
    elif isinstance(obj.get("prompt"), str) and obj["prompt"].strip():
        messages, own_messages = user_messages(obj["prompt"]), True
    else:
        raise DataError(f"{where}: needs messages (a list) or prompt (a non-empty string)")
    scores = obj.get("scores")
    if not isinstance(scores, dict) or not scores:
        raise DataError(f"{where}: scores must be an object {{model: quality}} with at least one model")
    qualities: dict[str, float | None] = {}
    written: dict[str, object] = {}
    for raw_model, q in scores.items():
        model = _model_key(raw_model, written, f"{where}: scores", names)
        # NaN is how pandas (and json.dumps of a pandas row) spells a missing value: unknown, like null; so is
        # "NaN" or "" in quotes, as the same CSV cell. "True"/"false" in quotes is the label, as in the CSV.
        q = _number_in_quotes(q, f"{where}: scores.{model}", booleans=True)
        if _missing(q):
            qualities[model] = None
            continue
        if isinstance(q, bool):  # a correct/incorrect label
            qualities[model] = float(q)
            continue
        if not isinstance(q, int | float) or not math.isfinite(q) or not 0.0 <= q <= 1.0:
            raise DataError(f"{where}: scores.{model}: {q!r} is not a quality in [0, 1]{_scale_hint(q)}")
        qualities[model] = float(q)
    costs_raw = obj.get("costs") or {}
    if not isinstance(costs_raw, dict):
        raise DataError(f"{where}: costs must be an object {{model: USD per call}}")
    costs: dict[str, float] = {}
    written = {}
    for raw_model, c in costs_raw.items():
        model = _model_key(raw_model, written, f"{where}: costs", names)
        c = _number_in_quotes(c, f"{where}: costs.{model}")
        if _missing(c):
            continue  # unknown cost, as an empty CSV cell
        if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c < 0:
            raise DataError(f"{where}: costs.{model}: {c!r} is not a cost >= 0")
        costs[model] = float(c)
    weight = _number_in_quotes(obj.get("weight"), f"{where}: weight")
    if _missing(weight):  # no weight, or a missing cell (a frame concatenated with one that has none): 1
        weight = 1.0
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
        raise DataError(f"{where}: weight: {weight!r} is not a number >= 0")
    return LabelledRequest(
        messages=messages if own_messages else [dict(m) for m in messages],
        qualities=qualities,
        costs=costs,
        source=_optional_text(obj.get("source")) or default_source,
        weight=float(weight),
        domain=_optional_text(obj.get("domain")),
        request_id=_optional_text(obj.get("id")),
    )


def _check_servable(messages: list[dict[str, Any]], where: str) -> None:
    """Refuse a conversation the gateway would refuse (a role it does not know, a ``content`` that is not a
    string or a list of content parts: another API's shape, such as ``parts``) or one without any text: the
    serving encoder reads nothing in it, so every such row would be trained and graded as the empty prompt."""
    try:
        validate_request({"model": "labelled", "messages": messages}, CHAT)
    except InvalidRequestError as exc:
        raise DataError(f"{where}: {exc.message}") from None
    from classifiers.conversation import conversation_text

    if not conversation_text({"messages": messages}, max_chars=MAX_CHARS).strip():
        raise DataError(f"{where}: messages hold no text (every content is empty)")


def _model_key(raw: object, written: dict[str, object], where: str, names: ModelNames) -> str:
    """A model name of a row's ``scores`` or ``costs``: checked (:func:`check_model_name`, once per file:
    ``names``) and not the same name as one before it once stripped (``"m1"`` and ``" m1 "``). ``written``
    maps the names seen so far to how they were written, and gets this one."""
    model = names.checked(raw, where)
    if model in written:
        raise DataError(f"{where}: {written[model]!r} and {raw!r} name the same model (spaces around a name are "
                        "dropped); keep one")
    written[model] = raw
    return model


# ----------------------------------------------------------------------------- logged traffic


def load_logs(
    url: str, *, route: str | None = None, since: float | None = None, metric: str = "quality"
) -> tuple[list[LabelledRequest], dict[str, int]]:
    """Logged traffic from the store at ``url`` as labelled requests (see :func:`requests_from_logs`)."""
    logged = fetch_logged(url, route=route, since=since)
    return requests_from_logs(logged.requests, metric=metric, without_feedback=logged.without_feedback)


@dataclass(frozen=True)
class Logged:
    """What :func:`fetch_logged` read: the requests that have feedback, and how many have none."""

    requests: list[Any]  # store.LoggedRequest, oldest first
    without_feedback: int  # decisions with no feedback at all: counted, never read


def fetch_logged(url: str, *, route: str | None = None, since: float | None = None) -> Logged:
    """The ``store.LoggedRequest`` s of the store at ``url`` that have feedback
    (``DecisionStore.logged_requests``), and a count of the decisions that have none; works inside or
    outside a running event loop. A conversation text past its retention is read as deleted
    (:func:`without_expired_text`).

    Only requests with feedback are read: nothing else can be a label or an outcome, and on a busy
    store they are a small share of the decisions (a compared 10%, say), the rest of which would not fit
    in memory (about 6 KB a decision read: 200,000 took 1.2 GB)."""

    async def fetch() -> Logged:
        from store.url import opened_store

        async with opened_store(url) as store:
            requests = list(await store.logged_requests(route=route, since=since, with_feedback=True))
            return Logged(requests, await store.count_without_feedback(route=route, since=since))

    logged = run_sync(fetch, name="pointsman-load-logs")
    without_expired_text(logged.requests)
    return logged


def without_expired_text(logged: list[Any], now: float | None = None) -> list[Any]:
    """``logged`` with every conversation text whose ``expires_at`` is past (at ``now``, default the
    current time) dropped, its embedding kept: retention ends at the expiry, not when the gateway's
    purge (every 10 minutes, and only while it runs) gets round to it, nor in a copy of the store."""
    import time

    cutoff = time.time() if now is None else now
    for item in logged:
        conversation = item.conversation
        if conversation is not None and conversation.text is not None and conversation.expires_at is not None \
                and conversation.expires_at <= cutoff:
            conversation.text = None
    return logged


def requests_from_logs(
    logged: Iterable[Any], *, metric: str = "quality", without_feedback: int = 0
) -> tuple[list[LabelledRequest], dict[str, int]]:
    """Turn ``store.LoggedRequest`` s into labelled requests; returns the rows and what was skipped.

    Per model, the quality is the mean of every ``metric`` (default ``quality``) feedback about it:
    feedback with ``model == ""`` is about the served answer (the record's ``model``), comparisons
    (judge) name their model. Other metrics are ignored. The conversation comes from the stored text (JSON of the
    messages, when the route keeps it) or, failing that, the stored embedding with its encoder id
    (training checks the id against its encoder). Requests with no quality feedback, or with neither
    text nor embedding, are skipped and counted.

    Feedback about the served answer of a request that failed (:func:`answer_failed`: a 5xx, a broken
    stream) is no quality label: the model named by the record never answered, so a thumbs-down on the
    error would teach that it cannot do the prompt. Such requests are skipped and counted (rows about
    another model's answer, from a comparison, still count).
    """
    rows: list[LabelledRequest] = []
    skipped: dict[str, int] = defaultdict(int)
    if without_feedback:
        skipped[f"no {metric} feedback"] += without_feedback
    for item in logged:
        record, conversation = item.record, item.conversation
        scores: dict[str, list[float]] = defaultdict(list)
        costs: dict[str, float] = {}
        failed = answer_failed(record)
        for fb in item.feedback:
            if fb.metric != metric:
                continue
            model = fb.model or record.model
            if not model or (failed and model == record.model):
                continue
            scores[model].append(float(fb.score))
            cost = (fb.metadata or {}).get("cost_usd")
            if fb.model and isinstance(cost, int | float):
                costs[fb.model] = float(cost)
        if not scores:
            skipped[FAILED_ANSWER if failed else f"no {metric} feedback"] += 1
            continue
        if record.model and record.cost_usd is not None:
            costs.setdefault(record.model, float(record.cost_usd))
        messages = _logged_messages(conversation.text) if conversation is not None and conversation.text else []
        embedding = None
        encoder_id = None
        if conversation is not None and conversation.embedding:
            embedding = np.frombuffer(conversation.embedding, dtype="<f4").astype(np.float32)
            encoder_id = conversation.encoder_id
        if not messages and embedding is None:
            skipped["neither text nor embedding stored"] += 1
            continue
        rows.append(
            LabelledRequest(
                messages=messages,
                qualities={m: float(np.mean(v)) for m, v in sorted(scores.items())},
                costs=costs,
                source=f"logs:{record.route}" if record.route else "logs",
                embedding=embedding,
                encoder_id=encoder_id,
                domain=_signal_value(record.signals.get("domain")),
                request_id=record.request_id,
            )
        )
    return rows, dict(skipped)


#: Why a logged request whose served answer failed is no labelled row (see :func:`requests_from_logs`).
FAILED_ANSWER = "the answer failed (upstream error): its feedback is no quality label"


def answer_failed(record: Any) -> bool:
    """Whether a logged request got no complete answer from its model: an error the client saw (a 5xx
    after the upstream failed, a refusal before any was asked) or a stream that broke after its 200."""
    return record.outcome in ("error", "stream_error")


def _logged_messages(text: str) -> list[dict[str, Any]]:
    """The messages of a stored conversation text: a JSON list of messages, a body with
    ``messages``, or (anything else) the text as one user message."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return user_messages(text)
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        value = value["messages"]
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return [dict(m) for m in value]
    if isinstance(value, str):
        return user_messages(value)
    return user_messages(text)


def _signal_value(signal: Any) -> str | None:
    if isinstance(signal, dict):
        signal = signal.get("value")
    return signal if isinstance(signal, str) else None


def encoder_matches(stored: str | None, encoder_id: str) -> bool:
    """Whether an embedding stored under ``stored`` was made by the encoder ``encoder_id``.

    The stored id may carry the encoder's name or a version around the id (``static:minilm-static-256``,
    ``minilm-static-256@1``): the id must be one of its ``:``/``@``-separated parts.
    """
    if not stored:
        return False
    if stored == encoder_id:
        return True
    parts = stored.replace("@", ":").split(":")
    return encoder_id in parts


def load_sources(specs: Sequence[str], *, data_dir: str | Path | None = None) -> list[LoadedSource]:
    """Load every ``--data`` source in order."""
    return [load_source(spec, data_dir=data_dir) for spec in specs]
