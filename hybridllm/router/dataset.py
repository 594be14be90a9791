"""Reading labelled routing files: a prompt column and one score column per model.

The files are CSV (RouteLLM's format) or JSON Lines (``.jsonl``/``.ndjson``, one object per line;
``.json``: an array of objects or JSON Lines). The prompt column is ``prompt``, or the one named
with ``prompt_col``, or else the only one of ``question``, ``query``, ``input``, ``instruction``,
``text``, ``messages``, ``conversation``, ``turns`` the file has. In JSON a prompt may be a
conversation, a list of OpenAI-style messages or of user turns: the router scores the last user
turn at run time, so that is what it is trained on.

A score is correctness (True/False, yes/no, 1/0) or a graded score in [0, 1] (a judge's mark, a
pass rate, a similarity to a reference); graded scores on another scale, say a judge's 1-10, are
mapped to [0, 1] with ``score_range=(1, 10)``. A row whose weak or strong cell is blank was not
labelled (a failed or skipped answer): it is left out and counted in ``skipped``."""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import DataError, InvalidRequestError
from .._types import last_user_text, normalize_messages
from ..prompts import valid_text
from .preference import is_preference, judged_scores, tiers_from

PROMPT_COL = "prompt"
LOGPROB_COL = "edge_mean_logprob"  # written by `hybridllm router label`
CLOUD_TOKENS_COL = "cloud_tokens"  # written by `hybridllm router label`: the cloud answer's tokens
# correctness as graders write it: a judge's "correct"/"incorrect", a test run's "pass"/"fail"
# and Excel's TRUE/FALSE as it writes them in a German, French, Spanish, Italian, Dutch or
# Portuguese locale (the locales whose CSV it writes with ';')
_TRUE = {"true", "1", "yes", "1.0", "correct", "right", "pass", "passed",
         "wahr", "vrai", "verdadero", "vero", "waar", "verdadeiro"}
_FALSE = {"false", "0", "no", "0.0", "incorrect", "wrong", "fail", "failed",
          "falsch", "faux", "falso", "onwaar"}
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")  # 0,75: a ';' file's number (Excel in such a locale)
_BLANK = {"", "nan", "none", "null", "na", "n/a"}
# columns taken as the prompt when a file has no 'prompt' column and exactly one of these
PROMPT_ALIASES = (
    "question",
    "query",
    "input",
    "instruction",
    "text",
    "messages",
    "conversation",
    "turns",
    "conversation_a",  # arena-style judgements: both sides hold the same user turns
)
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
TSV_SUFFIXES = (".tsv", ".tab")
# formats that need a library the SDK does not depend on: converted first, with a hint
BINARY_SUFFIXES = (".parquet", ".arrow", ".feather", ".xlsx", ".xls", ".pkl", ".pickle")
REFERENCE_COL = "(reference)"  # the strong side of a file that grades only the weak model


@dataclass(frozen=True)
class RoutingData:
    """Prompts with the weak and the strong model's scores: correctness (0/1) or graded, in [0, 1]."""

    prompts: list[str]
    weak: np.ndarray  # [n] float64 in [0, 1] ({0, 1} for correctness)
    strong: np.ndarray  # [n] float64 in [0, 1]
    weak_col: str
    strong_col: str
    edge_logprob: np.ndarray | None = None  # [n] mean token logprob of the weak (edge) answer
    skipped: int = 0  # rows left out: a blank weak or strong cell
    prompt_col: str = PROMPT_COL

    @property
    def labels(self) -> np.ndarray:
        """1 where the strong model was needed: it scored higher than the weak one (with
        correctness: the weak one failed and the strong one succeeded)."""
        return (self.strong > self.weak).astype(np.int64)

    @property
    def graded(self) -> bool:
        """Whether any score lies strictly between 0 and 1 (else both columns are correctness)."""
        return bool(np.any((self.weak % 1) != 0) or np.any((self.strong % 1) != 0))


def _to_bool(value: str) -> float | None:
    v = value.strip().lower()
    if v in _TRUE:
        return 1.0
    if v in _FALSE:
        return 0.0
    return None


def _to_score(value: str, decimal_comma: bool = False) -> float | None:
    """A cell as a number: True/False as 1/0, a blank as NaN; None when it is neither. With
    ``decimal_comma`` (a file separated by ';'), 0,75 is 0.75."""
    v = value.strip().lower()
    if decimal_comma and _DECIMAL_COMMA.fullmatch(v):
        v = v.replace(",", ".")
    if v in _BLANK:
        return float("nan")
    b = _to_bool(v)
    if b is not None:
        return b
    try:
        f = float(v)
    except ValueError:
        return None
    return f if np.isfinite(f) else None


def _score_columns(
    header: list[str], rows: list[dict[str, str]], prompt_col: str = PROMPT_COL, decimal_comma: bool = False
) -> tuple[dict[str, np.ndarray], set[str]]:
    """Every column whose cells are all numbers or blanks (some not blank), and which of those
    hold only True/False-like cells (``decimal_comma``: see _to_score)."""
    values: dict[str, np.ndarray] = {}
    boolean: set[str] = set()
    for col in header:
        if col in (prompt_col, LOGPROB_COL, CLOUD_TOKENS_COL):
            continue
        cells = [r.get(col) or "" for r in rows]
        parsed = [_to_score(c, decimal_comma) for c in cells]
        if any(v is None for v in parsed):
            continue
        arr = np.asarray(parsed, dtype=np.float64)
        if np.isnan(arr).all():
            continue
        values[col] = arr
        if all(_to_bool(c) is not None for c in cells if c.strip().lower() not in _BLANK):
            boolean.add(col)
    return values, boolean


def load_routellm_csv(
    path: str | Path,
    *,
    weak_col: str | None = None,
    strong_col: str | None = None,
    score_range: tuple[float, float] | None = None,
    prompt_col: str | None = None,
    reference_strong: bool = False,
    strong_models: list[str] | None = None,
    weak_models: list[str] | None = None,
) -> RoutingData:
    """Load a labelled routing file: RouteLLM-format CSV, or JSON Lines with the same fields.

    Without ``weak_col``/``strong_col`` the file must hold exactly two True/False model columns,
    or, failing that, exactly two score columns in [0, 1]; the less accurate one is the weak model.
    ``score_range=(lo, hi)`` maps graded scores on that scale to [0, 1] (``(s - lo) / (hi - lo)``);
    then the two columns are the ones named, or the only two numeric columns. ``prompt_col`` names
    the prompt column (default: ``prompt``, else the file's only column named like one).
    ``reference_strong``: a file with one model column grades the weak model against the strong
    model's answers as the reference (RouteLLM's GPT-4-judged data: 1-5 marks of Mixtral's
    answers); the strong model then scores the top of the scale on every prompt (``strong_col``
    is ``"(reference)"``). Files with two model columns load as without it.
    A file of pairwise judgements (a ``winner`` column, or ``winner_model_a``/``winner_model_b``)
    is read with ``strong_models``/``weak_models``, the two tiers' model names or globs (see
    :mod:`hybridllm.router.preference`), unless ``weak_col``/``strong_col`` name score columns.
    """
    p = Path(path)
    if weak_col is not None and weak_col == strong_col:
        raise DataError(f"--weak-col and --strong-col both name {weak_col!r}; name the two models' columns.")
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass a RouteLLM-format CSV or a JSON Lines file with --data.")
    header, rows = _read_table(p, prompt_col=prompt_col)
    if not header:
        raise DataError(f"{p} is empty; it needs a header with 'prompt' and two model columns.")
    prompt_col = _prompt_column(p, header, prompt_col)
    if not rows:
        raise DataError(f"{p} has a header but no rows; add labelled prompts.")
    tiers_given = bool(tiers_from(strong_models) or tiers_from(weak_models))
    if is_preference(header, tiers_given) and not (weak_col or strong_col):  # named score columns win
        return _load_judgements(p, header, rows, prompt_col, strong_models, weak_models)
    for name, col in (("--weak-col", weak_col), ("--strong-col", strong_col)):
        if col is not None and col not in header:
            raise DataError(f"{p} has no column {col!r} for {name}; columns: {', '.join(header)}.")
    semicolons = p.suffix.lower() not in JSON_SUFFIXES + TSV_SUFFIXES and _csv_delimiter(p)[0] == ";"
    numeric, boolean = _score_columns(header, rows, prompt_col, decimal_comma=semicolons)
    for col in (weak_col, strong_col):
        if col is not None and col not in numeric:
            raise DataError(
                f"Column {col!r} of {p} is not all scores: True/False, numbers in [0, 1] (or on "
                "the --score-range scale), or blank for a row that was not labelled."
            )
    values = _scaled(numeric, boolean, score_range)
    if weak_col is None or strong_col is None:
        named = weak_col or strong_col
        if len(boolean) == 2 and (named is None or named in boolean):
            kind, pool = "True/False", [c for c in numeric if c in boolean]
        elif score_range is not None:
            kind, pool = "numeric", list(numeric)
        else:
            kind, pool = "score", list(values)
        candidates = [c for c in pool if c not in (weak_col, strong_col)]
        known = [c for c in (weak_col, strong_col) if c is not None]
        one = len(candidates) + len(known) == 1
        if one and reference_strong and strong_col is None:
            # the file grades the weak model only, against the strong model's answer as the
            # reference (a judge's marks): the strong model scores the top of the scale
            weak_col, strong_col = (known + candidates)[0], REFERENCE_COL
            values[REFERENCE_COL] = np.ones(len(rows))
        elif len(candidates) + len(known) != 2:
            outside = [c for c in numeric if c not in values]
            if len(pool) < 2 and outside:
                raise DataError(
                    f"{p}: {', '.join(outside)} hold numbers outside [0, 1]; if they are graded "
                    "scores, give their scale with --score-range LO,HI (say 1,10), and name the "
                    "models with --weak-col and --strong-col if there are more than two."
                )
            if one and not reference_strong:
                # a column blank in every row (NaN, null) holds no scores: say so, not only "one"
                blank = [c for c in header if c != prompt_col and c not in numeric
                         and all((r.get(c) or "").strip().lower() in _BLANK for r in rows)]
                said = f" ({', '.join(blank)} is blank in every row)" if blank else ""
                raise DataError(
                    f"{p} has one {kind} model column ({', '.join(known + candidates)}){said}; if it "
                    "grades the weak model against the strong model's answers as the reference "
                    "(a judge's marks), pass --reference-strong; else add the other model's column."
                )
            judged = (
                " If its 'winner' column holds judgements, name the tiers with --strong-models and "
                "--weak-models."
                if "winner" in header
                else ""
            )
            if not pool:
                others = [c for c in header if c != prompt_col]
                raise DataError(
                    f"{p} has no model score columns: none of {', '.join(others) or 'its columns'} holds "
                    "only True/False (yes/no, 1/0, correct/incorrect, pass/fail), numbers or blanks. "
                    "Write each model's correctness or score in a column of its own."
                    + _separator_hint(header) + judged
                )
            raise DataError(
                f"{p} has {len(pool)} {kind} model columns ({', '.join(pool)}); "
                "name the two models with --weak-col and --strong-col." + judged
            )
        else:
            pair = known + candidates
            if weak_col is None and strong_col is None:
                weak_col, strong_col = _pick_roles(p, pair, values)
            elif weak_col is None:
                weak_col = next(c for c in pair if c != strong_col)
            else:
                strong_col = next(c for c in pair if c != weak_col)
    if weak_col is None or strong_col is None:  # unreachable: both are set above
        raise DataError(f"{p}: could not tell the weak and the strong model columns apart.")
    for col in (weak_col, strong_col):
        if col not in values:
            lo, hi = np.nanmin(numeric[col]), np.nanmax(numeric[col])
            raise DataError(
                f"Column {col!r} of {p} holds scores from {lo:g} to {hi:g}, outside [0, 1]: pass "
                "their scale with --score-range LO,HI (say 1,10 for a judge's marks)."
            )
    weak, strong = values[weak_col], values[strong_col]
    labelled = ~(np.isnan(weak) | np.isnan(strong))
    if not labelled.any():
        raise DataError(f"No row of {p} has both a {weak_col!r} and a {strong_col!r} score.")
    keep = np.flatnonzero(labelled)
    prompts = _prompts(p, rows, keep, prompt_col)
    logprob = _logprob_column(p, rows, semicolons) if LOGPROB_COL in header else None
    return RoutingData(
        prompts=prompts,
        weak=weak[keep],
        strong=strong[keep],
        weak_col=weak_col,
        strong_col=strong_col,
        edge_logprob=None if logprob is None else logprob[keep],
        skipped=int(len(rows) - len(keep)),
        prompt_col=prompt_col,
    )


# words in a column's name that say which side it is: ``router label`` writes ``edge:<model>`` and
# ``cloud:<model>``; hand-made files often say ``weak``/``strong`` or ``edge``/``cloud``
AMBIGUOUS_MIN_ROWS = 50  # below it the noise estimate itself is too rough to refuse on
_WEAK_WORDS = {"weak", "edge", "device", "local"}
_STRONG_WORDS = {"strong", "cloud", "remote", "server"}


def _side_from_name(col: str) -> str | None:
    words = set(re.split(r"[^a-z0-9]+", col.lower()))
    weak, strong = bool(words & _WEAK_WORDS), bool(words & _STRONG_WORDS)
    return "weak" if weak and not strong else "strong" if strong and not weak else None


def _pick_roles(p: Path, pair: list[str], values: dict[str, np.ndarray]) -> tuple[str, str]:
    """The weak and the strong column of two unnamed model columns: by their names when those say
    it (``edge:``/``cloud:``, weak/strong), else the less accurate one is weak. On a file of
    ``AMBIGUOUS_MIN_ROWS`` rows or more, accuracies too close to tell apart (within two standard
    errors of the mean gain) are refused: a wrong guess trains a router that sends the cloud the
    prompts the edge answers better (MMLU's five math and physics subjects: Mixtral 0.407, GPT-4
    0.399 on 727 rows, and GPT-4 became the weak model). Smaller files keep the accuracy rule."""
    sides = [_side_from_name(c) for c in pair]
    if sorted(s or "" for s in sides) == ["strong", "weak"]:
        weak, strong = pair if sides[0] == "weak" else pair[::-1]
        return weak, strong
    a, b = values[pair[0]], values[pair[1]]
    both = ~(np.isnan(a) | np.isnan(b))
    gain = (b - a)[both]
    weak, strong = sorted(pair, key=lambda c: values[c][both].mean())
    n = len(gain)
    se = float(np.std(gain, ddof=1) / np.sqrt(n)) if n > 1 else float("inf")
    # se 0: every row has one gain (all equal, or one class); the callers say what that means
    if n >= AMBIGUOUS_MIN_ROWS and se > 0 and not abs(float(gain.mean())) > 2 * se:
        acc = ", ".join(f"{c!r} {values[c][both].mean():.3f}" for c in pair)
        raise DataError(
            f"{p}: cannot tell which model is the strong one: their mean scores ({acc} on {n} rows "
            "with both) differ by less than the noise of that many rows. Name them with --weak-col "
            "(the edge, cheap model) and --strong-col (the cloud model)."
        )
    return weak, strong


def _load_judgements(
    p: Path,
    header: list[str],
    rows: list[dict[str, str]],
    prompt_col: str,
    strong_models: list[str] | None,
    weak_models: list[str] | None,
) -> RoutingData:
    j = judged_scores(p, header, rows, tiers_from(strong_models), tiers_from(weak_models))
    return RoutingData(
        prompts=_prompts(p, rows, j.keep, prompt_col),
        weak=j.weak,
        strong=j.strong,
        weak_col=j.weak_name,
        strong_col=j.strong_name,
        skipped=j.left_out,
        prompt_col=prompt_col,
    )


def _prompts(p: Path, rows: list[dict[str, str]], keep: np.ndarray, prompt_col: str) -> list[str]:
    json_file = p.suffix.lower() in JSON_SUFFIXES
    prompts = [_text_prompt(p, int(i), rows[i].get(prompt_col) or "", json_file) for i in keep]
    if not any(pr.strip() for pr in prompts):
        raise DataError(f"Every prompt in {p} (column {prompt_col!r}) is empty.")
    return prompts


def _text_prompt(p: Path, i: int, cell: str, json_file: bool) -> str:
    """A CSV cell that holds a JSON list of turns or messages (as arena exports write the
    prompt, '["first turn", "second turn"]') is that conversation's last user turn."""
    if json_file or not cell.startswith("[") or not cell.rstrip().endswith("]"):
        return cell
    try:
        value = json.loads(cell)
    except json.JSONDecodeError:
        value = _python_literal(cell)
    if not isinstance(value, list) or not value:
        return cell
    try:
        return _prompt_cell(p, i, value)
    except DataError:
        return cell  # a list, but not a conversation: the text as written


def _python_literal(cell: str) -> object:
    """A list written as Python prints it (pandas' ``to_csv`` of a column of message lists:
    ``[{'role': 'user', 'content': 'hi'}]``), or None. Literals only: nothing is executed."""
    if len(cell) > 1_000_000:
        return None
    try:
        return ast.literal_eval(cell)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def file_columns(path: str | Path) -> list[str]:
    """The columns of a labelled file, or [] when it cannot be read (the loader says why)."""
    try:
        return _read_table(Path(path), header_only=True)[0]
    except (DataError, OSError):
        return []


def _read_table(
    path: Path, *, prompt_col: str | None = None, header_only: bool = False
) -> tuple[list[str], list[dict[str, str]]]:
    """The file's columns and its rows as text cells (JSON values written as the CSV would hold
    them: true as "True", null as blank, a conversation as its last user turn)."""
    suffix = path.suffix.lower()
    if suffix in BINARY_SUFFIXES:
        raise DataError(
            f"{path} is a {suffix[1:]} file; write it as CSV or JSON Lines first (pandas: "
            "df.to_csv('labels.csv', index=False) or df.to_json('labels.jsonl', orient='records', "
            "lines=True))."
        )
    if suffix not in JSON_SUFFIXES:
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        try:  # utf-8-sig: a byte-order mark (Excel, some pandas writers) is not part of the header
            with path.open(newline="", encoding="utf-8-sig") as fh:
                delimiter, sep_line = ("\t", False) if suffix in TSV_SUFFIXES else _csv_delimiter(path)
                reader = csv.reader(fh, delimiter=delimiter)
                if sep_line:  # Excel's "sep=;" line: not the header (the rows keep their line numbers)
                    next(reader, None)
                columns = next(reader, [])
                return columns, ([] if header_only else _csv_rows(path, reader, columns, delimiter))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise DataError(f"{path} is not a readable UTF-8 CSV file ({exc}).") from exc
        except OSError as exc:
            raise DataError(f"{path} cannot be read ({exc.strerror or exc}).") from exc
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc}).") from exc
    except OSError as exc:
        raise DataError(f"{path} cannot be read ({exc.strerror or exc}).") from exc
    records = _json_records(path, text)
    header: list[str] = []
    seen: set[str] = set()
    for rec in records:
        for key in rec:
            if key not in seen:
                seen.add(key)
                header.append(key)
    if header_only:
        return header, []
    prompt_col = _prompt_column(path, header, prompt_col, strict=False)
    rows = []
    for i, rec in enumerate(records):
        row = {}
        for key, value in rec.items():
            row[key] = _prompt_cell(path, i, value) if key == prompt_col else _json_cell(value)
        rows.append(row)
    return header, rows


def _csv_rows(path: Path, reader: Any, columns: list[str], delimiter: str) -> list[dict[str, Any]]:
    """The rows after the header as cells by column (a short row's missing cells None, as
    ``csv.DictReader`` gives them). A row with more cells than the header (a prompt holding an
    unquoted comma: its cells shift into the score columns) or a short row whose last cell runs
    over line breaks (a double quote never closed swallows the rows after it into one cell: 30
    rows of a 60-row file trained as one skipped row) is refused with its line, never read
    shifted or dropped. Extra cells that are all blank (a trailing delimiter) are let through."""
    rows: list[dict[str, Any]] = []
    bad: list[tuple[int, int, int]] = []  # first line, last line, cells
    last = reader.line_num
    for cells in reader:
        first, last = last + 1, reader.line_num
        if not cells:  # a blank line
            continue
        extra = len(cells) > len(columns) and any(c.strip() for c in cells[len(columns) :])
        runs_on = len(cells) < len(columns) and ("\n" in cells[-1] or "\r" in cells[-1])
        if extra or runs_on:
            bad.append((first, last, len(cells)))
            continue
        row: dict[str, Any] = dict(zip(columns, cells, strict=False))
        for col in columns[len(cells) :]:
            row.setdefault(col, None)
        rows.append(row)
    if bad:
        first, last, n = bad[0]
        sep = "tab" if delimiter == "\t" else repr(delimiter)
        where = f"line {first}" if first == last else f"lines {first}-{last}"
        why = (
            "a double quote opened there is never closed, so one cell swallowed the lines after it"
            if n < len(columns)
            else f"a cell holds an unquoted {sep}, so its row has {n} cells where the header has "
            f"{len(columns)} ({', '.join(columns)})"
        )
        more = f" ({len(bad)} such rows)" if len(bad) > 1 else ""
        raise DataError(
            f"{path} {where}: {why}{more}. Put a cell holding a {sep}, a double quote or a line "
            'break in double quotes, its own double quotes doubled (""), as CSV writers do (pandas '
            "to_csv, Python's csv module), or write the file as JSON Lines."
        )
    return rows


def _comma_or_semicolon(first_line: str) -> str:
    """A CSV's delimiter: ';' when its header has semicolons and no comma (Excel's CSV where the
    decimal separator is a comma), a tab when it has tabs and neither (a TSV saved as .csv, or
    Excel's "Unicode Text": read as one column named "prompt\tweak\tstrong"), else ','."""
    if ";" in first_line and "," not in first_line:
        return ";"
    return "\t" if "\t" in first_line and "," not in first_line else ","


def _separator_hint(header: list[str]) -> str:
    """What to say of a file read with ',' whose header holds ';' (Excel's CSV in a locale with
    decimal commas, where a column's name has a comma in it): how to have it read right."""
    if not any(";" in c for c in header):
        return ""
    return (" Its header holds ';' but also a comma, so it was read as separated by ','. If it is "
            "separated by ';' (Excel's CSV where the decimal separator is a comma), put the line "
            "sep=; first, or save it from Excel as 'CSV UTF-8 (Comma delimited)'.")


_SEP_LINE = re.compile(r'"?sep=(.)"?\r?\n?')  # Excel's first line naming the separator: sep=;


def _csv_delimiter(path: Path) -> tuple[str, bool]:
    """A CSV file's delimiter, and whether its first line is Excel's "sep=X" line that names it."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            first = fh.readline()
            m = _SEP_LINE.fullmatch(first)
            return (m.group(1), True) if m else (_comma_or_semicolon(first), False)
    except (UnicodeDecodeError, OSError):  # said by the reader, where it matters
        return ",", False


def _json_records(path: Path, text: str, *, strings: bool = False) -> list:
    """The objects of a JSON array or JSON Lines file (``strings``: bare strings too)."""
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith("["):
        try:
            records = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} is not valid JSON ({exc}).") from exc
        lines = [(i + 1, r) for i, r in enumerate(records)]
        what = "item"
    else:
        lines = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                lines.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path} line {n} is not valid JSON ({exc.msg}); JSON Lines holds one object a line."
                ) from exc
        what = "line"
    for n, rec in lines:
        if not isinstance(rec, dict) and not (strings and isinstance(rec, str)):
            raise DataError(
                f"{path} {what} {n} is a {type(rec).__name__}, not an object with a prompt and scores."
            )
    return [rec for _, rec in lines]


def _json_cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value
    return json.dumps(value)  # a list or an object: never a score


def _prompt_cell(path: Path, index: int, value: object) -> str:
    """A JSON prompt: a string, or a conversation (messages or user turns) as its last user turn."""
    if value is None or isinstance(value, str):
        return value or ""
    value = _valid_strings(value)  # half an emoji in one turn should not refuse the whole file
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return value[-1] if value else ""  # user turns, as RouteLLM's conversation prompts hold them
    if isinstance(value, list):
        try:
            return last_user_text(normalize_messages(value, allow_empty=True))
        except InvalidRequestError as exc:
            raise DataError(
                f"{path} record {index + 1}: the prompt is a list but not a conversation ({exc})"
            ) from exc
    raise DataError(
        f"{path} record {index + 1}: the prompt is a {type(value).__name__}; give a string, a list of "
        "user turns, or a list of {'role', 'content'} messages."
    )


def _valid_strings(value: object) -> object:
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, list):
        return [_valid_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: _valid_strings(v) for k, v in value.items()}
    return value


def _prompt_column(path: Path, header: list[str], given: str | None, *, strict: bool = True) -> str:
    if given is not None:
        if given not in header and strict:
            raise DataError(f"{path} has no column {given!r} for --prompt-col; columns: {', '.join(header)}.")
        return given
    if PROMPT_COL in header:
        return PROMPT_COL
    aliases = [c for c in header if c.strip().lower() == PROMPT_COL]  # 'Prompt', as a spreadsheet heads it
    aliases = aliases or [c for c in header if c.lower() in PROMPT_ALIASES]
    if len(aliases) == 1:
        return aliases[0]
    if not strict:
        return PROMPT_COL
    raise DataError(
        f"{path} has no '{PROMPT_COL}' column (columns: {', '.join(header)}); name the prompt "
        "column with --prompt-col, or use RouteLLM's format: 'prompt' plus one True/False column "
        "per model." + _separator_hint(header)
    )


def _scaled(
    numeric: dict[str, np.ndarray], boolean: set[str], score_range: tuple[float, float] | None
) -> dict[str, np.ndarray]:
    """The columns usable as scores in [0, 1]: as they are, or mapped from ``score_range``
    (True/False columns stay 0/1)."""
    if score_range is None:
        return {c: v for c, v in numeric.items() if np.nanmin(v) >= 0.0 and np.nanmax(v) <= 1.0}
    lo, hi = (float(b) for b in score_range)
    if not hi > lo:
        raise DataError(f"--score-range needs LO < HI, got {lo:g},{hi:g}.")
    out = {}
    for col, v in numeric.items():
        if col in boolean:
            out[col] = v
        elif np.nanmin(v) >= lo and np.nanmax(v) <= hi:
            out[col] = (v - lo) / (hi - lo)  # a mark on [lo, hi] as a fraction of the scale
    return out


def _logprob_column(p: Path, rows: list[dict[str, str]], decimal_comma: bool = False) -> np.ndarray | None:
    """The edge answers' mean log-probabilities (blank cells become NaN), or None when no cell
    holds one. A cell that is not a number, or above 0 (a probability, not its log: the floor
    calibrated on it escalated every answer), is refused with its row: one such cell dropped the
    whole column without a word, and the cascade kept the default floor. ``decimal_comma``: -0,31
    in a ';' file (Excel's CSV where the decimal separator is a comma) is -0.31, as for scores."""
    out = np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        cell = (r.get(LOGPROB_COL) or "").strip()
        if decimal_comma and _DECIMAL_COMMA.fullmatch(cell):
            cell = cell.replace(",", ".")
        if cell.lower() in _BLANK:
            continue
        try:
            out[i] = float(cell)
        except ValueError:
            out[i] = np.inf  # refused below, as not a number
        # 1e-6: a mean of log-probabilities computed in float32 may come out a hair above 0
        if not (out[i] <= 1e-6 or np.isnan(out[i])):
            raise DataError(
                f"{p} row {i + 1}: {LOGPROB_COL} is {cell!r}, not a mean token log-probability (a "
                "number <= 0, blank where unknown); a probability p is written as its log, ln(p)."
            )
    return out if np.isfinite(out).any() else None


def read_prompts(path: str | Path, prompt_col: str | None = None) -> list[str]:
    """Unlabelled prompts (for calibration): JSON Lines or a JSON array (each item a string, or an
    object whose prompt is read as in a labelled file: ``prompt_col``, else ``prompt``, else the
    first of the usual names it has), CSV or TSV (the prompt column as in a labelled file), or any
    other text file, one prompt a line. Blank prompts are dropped."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass a file of prompts with --prompts.")
    suffix = p.suffix.lower()
    if suffix in JSON_SUFFIXES:
        try:
            text = p.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            raise DataError(f"{p} is not UTF-8 text ({exc}).") from exc
        prompts = []
        for i, rec in enumerate(_json_records(p, text, strings=True)):
            if isinstance(rec, str):
                prompts.append(rec)
                continue
            keys = [k for k in (prompt_col or PROMPT_COL, *PROMPT_ALIASES) if k in rec]
            if not keys or (prompt_col and keys[0] != prompt_col):
                wanted = repr(prompt_col) if prompt_col else f"'{PROMPT_COL}', {', '.join(PROMPT_ALIASES)}"
                raise DataError(
                    f"{p} record {i + 1} has no {wanted} field (fields: {', '.join(rec) or 'none'}); "
                    "name the prompt field with --prompt-col."
                )
            prompts.append(_prompt_cell(p, i, rec[keys[0]]))
    elif suffix in TSV_SUFFIXES or suffix == ".csv" or suffix in BINARY_SUFFIXES:
        header, rows = _read_table(p)
        col = _prompt_column(p, header, prompt_col)
        prompts = [_text_prompt(p, i, r.get(col) or "", False) for i, r in enumerate(rows)]
    else:
        try:
            prompts = p.read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError as exc:
            raise DataError(f"{p} is not UTF-8 text ({exc}).") from exc
    prompts = [t for t in prompts if t.strip()]
    if not prompts:
        raise DataError(f"{p} holds no prompts.")
    return prompts


def texts_digest(texts: list[str]) -> str:
    """A short content hash of a list of prompts (keys the feature cache)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:20]


def prompt_hashes(texts: list[str]) -> np.ndarray:
    """``[n]`` uint64 hashes of prompts, case and whitespace folded ("What is 2+2?" and
    "what is  2+2? " are one question): which of a held-out file's prompts a router was trained on."""
    out = np.empty(len(texts), dtype=np.uint64)
    for i, t in enumerate(texts):
        key = " ".join(t.split()).casefold().encode("utf-8", "surrogatepass")
        out[i] = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return out
