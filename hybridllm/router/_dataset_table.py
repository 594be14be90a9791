"""Reading a labelled or prompt file into columns and text cells: CSV dialects, JSON records, prompt cells."""

from __future__ import annotations

import ast
import codecs
import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

from .._exceptions import DataError, InvalidRequestError
from .._types import last_user_text, normalize_messages
from ..prompts import valid_text

PROMPT_COL = "prompt"
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
    "conversations",  # ShareGPT's: a list of {"from": "human" | "gpt", "value": ...} turns
    "conversation_a",  # arena-style judgements: both sides hold the same user turns
)
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
TSV_SUFFIXES = (".tsv", ".tab")
# formats that need a library the SDK does not depend on: converted first, with a hint
BINARY_SUFFIXES = (".parquet", ".arrow", ".feather", ".xlsx", ".xls", ".pkl", ".pickle")


def text_encoding(path: Path) -> str:
    """The encoding to read a data file's text in: UTF-16 where it opens with UTF-16's byte-order
    mark (Windows PowerShell 5 writes it with ``>`` and Out-File, Excel with "Unicode Text"; such a
    file was refused as "not a readable UTF-8 CSV file", byte 0xff, with no word of what it is),
    else UTF-8, a byte-order mark dropped (Excel, some pandas writers)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
    except OSError:  # said by the reader, where it matters
        return "utf-8-sig"
    return "utf-16" if head in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else "utf-8-sig"


NOT_UTF8 = "save it as UTF-8 (Excel: 'CSV UTF-8'; pandas: encoding='utf-8')"


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
            with path.open(newline="", encoding=text_encoding(path)) as fh:
                delimiter, sep_line = ("\t", False) if suffix in TSV_SUFFIXES else _csv_delimiter(path)
                reader = csv.reader(fh, delimiter=delimiter)
                if sep_line:  # Excel's "sep=;" line: not the header (the rows keep their line numbers)
                    next(reader, None)
                columns = next(reader, [])
                _refuse_json(path)
                _refuse_repeated_columns(path, columns)
                return columns, ([] if header_only else _csv_rows(path, reader, columns, delimiter))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise DataError(f"{path} is not a readable UTF-8 CSV file ({exc}); {NOT_UTF8}.") from exc
        except OSError as exc:
            raise DataError(f"{path} cannot be read ({exc.strerror or exc}).") from exc
    try:
        text = path.read_text(encoding=text_encoding(path))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc}); {NOT_UTF8}.") from exc
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


def _refuse_json(path: Path) -> None:
    """A CSV-named file whose first line is a JSON object, or opens a JSON array, holds JSON (a
    .jsonl saved as .csv): read as CSV, its first record became the column names, and the error
    said it had no 'prompt' column while listing '{"prompt": ...' among them."""
    with path.open(encoding=text_encoding(path)) as fh:  # read errors: raised, as the CSV reader's
        line = fh.readline().strip()
    if line == "[" or line.startswith(("[{", '["')):
        suffix = ".json"  # an array
    else:
        try:
            suffix = ".jsonl" if line.startswith("{") and isinstance(json.loads(line), dict) else ""
        except json.JSONDecodeError:
            suffix = ""
    if suffix:
        shown = line if len(line) <= 60 else line[:60] + "..."
        raise DataError(
            f"{path} holds JSON, not CSV (its first line is {shown}); rename it to "
            f"{path.with_suffix(suffix).name} to read it as JSON."
        )


def _refuse_repeated_columns(path: Path, columns: list[str]) -> None:
    """A header naming one column twice (two files' columns pasted side by side) is refused: read
    by name, the later column's cells silently stood for both (pandas reads them as 'weak' and
    'weak.1'). Blank names (a trailing delimiter) may repeat."""
    seen: dict[str, int] = {}
    for i, name in enumerate(columns, start=1):
        if name.strip() and name in seen:
            raise DataError(
                f"{path} has two columns named {name!r} (columns {seen[name]} and {i} of its header); "
                "rename one, so that each model's scores are read from their own column."
            )
        seen.setdefault(name, i)


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
        with path.open(newline="", encoding=text_encoding(path)) as fh:
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
    value = _sharegpt_messages(_valid_strings(value))  # half an emoji should not refuse the whole file
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


_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
                   "bing": "assistant", "model": "assistant"}


def _sharegpt_messages(value: object) -> object:
    """ShareGPT's turns (``{"from": "human", "value": ...}``, as many chat datasets hold their
    conversations) as OpenAI-style messages, else ``value`` as it is: they were refused as "a list
    but not a conversation (messages[0] has role None)", so no such file could train a router."""
    if not (isinstance(value, list) and value and all(
            isinstance(t, dict) and "from" in t and "value" in t and "role" not in t for t in value)):
        return value
    return [{"role": _SHAREGPT_ROLES.get(str(t["from"]).strip().lower(), str(t["from"]).strip().lower()),
             "content": t["value"]} for t in value]


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
