"""The label CSV and the files beside it: its columns, resuming it, its settings, the --answers file."""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import sys
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .._exceptions import DataError
from .dataset import CLOUD_TOKENS_COL, LOGPROB_COL, _to_bool


def _header(edge_col: str, cloud_col: str) -> list[str]:
    return ["prompt", edge_col, cloud_col, LOGPROB_COL, CLOUD_TOKENS_COL]


def _cells(r: dict[str, Any], columns: Sequence[str] | None = None) -> list[Any]:
    """A row's cells; given a resumed file's ``columns``, its own columns after the first three
    (a file without ``cloud_tokens`` got rows one cell longer than its header: refused on load)."""
    if columns is not None:
        return [r["prompt"], r["edge"], r["cloud"], *(r.get(c, "") for c in columns[3:])]
    return [r["prompt"], r["edge"], r["cloud"], r[LOGPROB_COL], r.get(CLOUD_TOKENS_COL, "")]


@dataclass
class LabelRun:
    """What :func:`label_to_csv` did: rows in the file now, rows it added, and failures."""

    out: Path
    num_rows: int = 0
    num_added: int = 0
    num_skipped: int = 0  # already in the file (resumed)
    num_failed: int = 0  # questions left out after retries; a rerun tries them again
    edge_correct: int = 0
    cloud_correct: int = 0
    errors: list[str] = field(default_factory=list)


def _read_done(
    path: Path, header: list[str], run: LabelRun, again: Collection[str] = frozenset(),
    progress: TextIO | None = None,
) -> tuple[set[str], list[str]]:
    """Prompts already labelled in ``path`` (resuming), and the file's columns; the header's first
    three must match this run's.

    A last row cut off mid-write (a killed run: no line end, or a quoted prompt never closed) is
    removed from the file to be labelled again; appended to, it would swallow the rows after it.
    So is a last row with all its cells but no line end whose prompt is in ``again`` (this run's
    questions): rows are written here with their line end, so its last cell may be cut short
    (-0.53 read -0.5, a token count 12 read 1). One that cannot be labelled again is kept, as a
    spreadsheet saves it (said on ``progress``). A quote never closed further up (a hand edit) is
    refused: cutting there lost every row after it. A file saved by a spreadsheet (a byte-order
    mark, TRUE/FALSE) resumes as written."""
    if not path.is_file() or path.stat().st_size == 0:
        return set(), header
    if _only_cut_header(path, header):
        path.write_bytes(b"")  # no row yet: the file starts again, its header written whole
        if progress is not None:
            progress.write(f"{path}: its header was cut off mid-write (a run stopped); it is written again\n")
        return set(), header
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    raw: list[str] = []  # the lines of the record the reader is on

    def lines(fh: TextIO) -> Iterator[str]:
        for line in fh:
            raw.append(line)
            yield line

    done: set[str] = set()
    try:
        with _utf8_lines(path) as fh:
            reader = csv.reader(lines(fh))
            found = next(reader, None)
            if found is None:
                return set(), header
            _check_header(path, found, header)
            text = "".join(raw)
            end = len(text.encode("utf-8"))  # bytes up to the end of the last whole row
            ended = text.endswith(("\n", "\r"))
            line = len(raw) + 1  # the line the next record starts on
            raw.clear()
            for cells in reader:
                text = "".join(raw)
                if text.count('"') % 2 and _holds_rows(raw):
                    raise DataError(
                        f"{path} line {line}: a double quote opened there is never closed, so the "
                        f"rows after it read as one cell; fix or delete that line, then resume."
                    )
                line += len(raw)
                raw.clear()
                if text.count('"') % 2 or not (text.endswith(("\n", "\r")) or len(cells) >= len(found)):
                    break  # half-written, so the last: the reader ran to the end of the file
                if not text.endswith(("\n", "\r")) and cells and cells[0] in again:
                    break  # all its cells, but the last may be cut short: labelled again
                end += len(text.encode("utf-8"))
                ended = text.endswith(("\n", "\r"))
                if len(cells) < 3:
                    continue
                done.add(cells[0])
                run.num_rows += 1
                # True as written here; TRUE, 1 as a spreadsheet saves it (counted wrong: a resumed
                # run reported an edge accuracy of 0 for rows that held TRUE)
                run.edge_correct += _to_bool(cells[1]) == 1.0
                run.cloud_correct += _to_bool(cells[2]) == 1.0
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not a UTF-8 CSV file ({exc}); pass another --out.") from exc
    if progress is not None and end < path.stat().st_size:
        progress.write(f"{path}: its last row has no line end (a run stopped mid-write); it is "
                       "removed, to be labelled again\n")
    elif progress is not None and not ended:
        progress.write(f"{path}: its last row has no line end and is not among these questions, so it "
                       "is kept as written (a run stopped mid-write may have cut its last cell)\n")
    if end < path.stat().st_size or not ended:
        with path.open("r+b") as raw_fh:
            raw_fh.truncate(end)
            if not ended:  # a whole last row without its line end: the next row starts below it
                raw_fh.seek(end)
                raw_fh.write(b"\r\n")
    return done, found


def _only_cut_header(path: Path, header: list[str]) -> bool:
    """Whether ``path`` holds only the start of this run's header line, short of its line end: a
    run stopped while writing it, before any row. Resumed as it was, its rows got the cut
    header's columns (``...,edge_mean_lo``: every log-probability and token count left out), or it
    was refused as labels of other models (``prompt,edge:m,``)."""
    buf = io.StringIO()
    csv.writer(buf).writerow(header)
    line = buf.getvalue().encode("utf-8")
    try:
        return path.stat().st_size < len(line) and line.startswith(path.read_bytes())
    except OSError:
        return False  # said where the file is read


def _utf8_lines(path: Path) -> io.StringIO:
    """The file's text to read as CSV (``newline=""``), less a character cut off at its very end:
    rows are written whole with their line end, so only a run stopped mid-write (killed, the disk
    full) leaves one, inside its last row, which is then cut off as any half-written row is (read
    strictly, its first byte was "not a UTF-8 CSV file" and the run could not resume). Invalid
    UTF-8 anywhere else still raises :class:`UnicodeDecodeError`."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    return io.StringIO(decoder.decode(path.read_bytes(), final=False), newline="")


def _holds_rows(lines: list[str]) -> bool:
    """Whether the lines after the first of a record whose double quote is never closed hold whole
    label rows (a prompt, then two True/False cells): then the quote is damage up the file, not
    a last row cut off mid-write, whose other lines are the rest of its prompt."""
    for text in lines[1:]:
        cells = next(csv.reader([text]), [])
        if text.endswith(("\n", "\r")) and len(cells) >= 3 and None not in map(_to_bool, cells[1:3]):
            return True
    return False


def check_out_paths(
    out: str | Path, answers_out: str | Path | None = None, *, data: str | Path | None = None
) -> None:
    """Refuse an --out or --answers that cannot be a file, before any model loads: a folder, or a
    path under a file (both ended in "internal error: IsADirectoryError" or FileExistsError, after
    the edge model had loaded); and an --answers that is the --out CSV, its settings file or the
    questions' --data file (``data``), whose answer lines were appended to it: the labels no longer
    loaded, and the questions file gained a question per answer (each line has a prompt and a
    reference), exit 0 both."""
    if answers_out is not None and answers_out != "":
        taken = (("the --out file", out), ("the settings file of --out", settings_path(Path(out))),
                 ("the --data file", data))
        for what, other in taken:
            if other is not None and other != "" and _same_file(answers_out, other):
                raise DataError(f"--answers {answers_out} is {what}; pass another JSON Lines file "
                                "for the answers.")
    for flag, given in (("--out", out), ("--answers", answers_out)):
        if given is None or given == "":
            continue
        path = Path(given)
        if path.is_dir():
            what = "the CSV file" if flag == "--out" else "the JSON Lines file"
            raise DataError(f"{path} is a folder; pass {what} to write with {flag}.")
        refuse_path_under_file(path, f"{flag} {path}")
    if answers_out is not None and answers_out != "":
        _check_answers_file(Path(answers_out))


def refuse_path_under_file(path: Path, said: str) -> None:
    """Refuse a path to write under a file (``data.csv/x``; ``said``: the option as given), before
    any work: writing it failed only at the end, as FileExistsError or "File exists"."""
    above = next((q for q in path.parents if q.exists()), None)
    if above is not None and not above.is_dir():
        raise DataError(f"{said}: {above} is a file, not a folder; pass a path in a folder.")


def _check_answers_file(path: Path) -> None:
    """An --answers file already there must be one a label run wrote: its first line an answer
    line, or the start of one (a run killed while writing it). Any other file (a CSV, notes) had
    the answers appended to it, and its last line cut off when it did not end in a line end (taken
    for a half-written answer)."""
    if not path.is_file():
        return
    try:
        with path.open("rb") as fh:
            first = fh.readline()
    except OSError:
        return  # said where the file is opened, with the reason
    if not first:
        return
    whole = first.endswith(b"\n")
    if (_answer_prompt(first) is not None) if whole else first.startswith(b'{"prompt": '):
        return
    raise DataError(f"--answers {path} is not an answers file of `router label` (its first line is "
                    "not a JSON answer line); it is left as it is: pass another --answers.")


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: the same path once resolved, or one file by two names (a
    link, another spelling)."""
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # either not there yet (nor the same path): not one file
        return False


def check_resumable(
    out: str | Path, *, edge_col: str, cloud_col: str, settings: dict[str, Any] | None = None
) -> None:
    """What :func:`label_to_csv` refuses in an existing --out, checked without writing anything, so
    that the CLI says it before the edge model is pulled and loaded: a file that is not a label
    CSV, one of other models, or (given ``settings``) one with rows made with other settings."""
    path, header = Path(out), _header(edge_col, cloud_col)
    if not path.is_file() or path.stat().st_size == 0 or _only_cut_header(path, header):
        return
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            found = next(reader, None)
            has_rows = found is not None and next(reader, None) is not None
    except (UnicodeDecodeError, csv.Error):
        return  # said by label_to_csv, with the rest of its reading
    if found is None:
        return
    _check_header(path, found, header)
    if settings is not None and has_rows:
        _refuse_changed(path, settings)


def _check_header(path: Path, found: list[str], header: list[str]) -> None:
    """A resumed file's first line must be a label CSV header of this run's models."""
    # Excel's "CSV UTF-8" starts with a byte-order mark: read as "\ufeffprompt", the file was
    # refused as labels "for other models" that were these very ones
    if found[0].removeprefix("\ufeff") != header[0]:
        # not a label CSV at all (--out named the questions file, or notes): said to hold
        # labels "for other models", named by two fragments of its first line
        raise DataError(
            f"{path} is not a label CSV (its first line does not start with "
            f"'{header[0]},'); it is left as it is: pass another --out."
        )
    if [found[0].removeprefix("\ufeff"), *found[1:3]] != header[:3]:
        raise DataError(
            f"{path} already holds labels for other models ({', '.join(found[1:3])}); "
            "pass another --out, or the same --edge and --cloud-model to resume it."
        )


def settings_path(out: Path) -> Path:
    """Where a label run keeps the settings its rows were made with: ``OUT.settings.json``."""
    return out.with_name(out.name + ".settings.json")


def _check_settings(path: Path, settings: dict[str, Any], has_rows: bool) -> None:
    """Refuse to append to labels made with other settings; record them for a new file.

    The columns name the models, but not what else decides a grade: ``cloud:default`` is whatever
    model the server runs, and a longer --max-tokens grades answers that the first run cut off.
    Rows from two settings in one file train on labels of two pairs. A file with rows but no
    settings beside it (made before they were kept, or copied without them) is resumed with only
    its columns checked (the models' names, by :func:`_read_done`), and this run's settings are
    recorded for it: left absent, every later resume with other settings went unchecked."""
    side = settings_path(path)
    # written whole or not at all: a half-written one would read as absent
    if not has_rows or not side.is_file():
        tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        tmp.replace(side)
        return
    _refuse_changed(path, settings)


def _refuse_changed(path: Path, settings: dict[str, Any]) -> None:
    """Refuse ``settings`` that differ from those recorded beside ``path`` (none recorded, or an
    unreadable record: nothing to compare)."""
    side = settings_path(path)
    try:
        before = json.loads(side.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return  # absent or unreadable
    if not isinstance(before, dict):
        return
    changed = [
        f"{key} {before[key]!r} then, {value!r} now"
        for key, value in settings.items()
        if key in before and before[key] != value
    ]
    if changed:
        raise DataError(
            f"{path} holds labels made with other settings ({'; '.join(changed)}, per {side.name}); "
            "rerun with the same ones to resume it, or pass another --out for these (or, if the "
            f"same models answer as before, say the cloud only moved, delete {side.name})."
        )


def _append_lines(path: Path) -> tuple[TextIO, set[str]]:
    """``path`` opened to append JSON lines, a half-written last line (a killed run) cut off: the
    next line would run into it; and the prompts it already holds answers for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.stat().st_size:
        with path.open("r+b") as fh:
            data = fh.read()
            if not data.endswith(b"\n"):
                data = data[: data.rfind(b"\n") + 1]
                fh.truncate(len(data))
        if _keep_latest_answers(path):  # duplicates an earlier version left
            data = path.read_bytes()
        prompts = {p for line in data.splitlines() if (p := _answer_prompt(line)) is not None}
        return path.open("a", encoding="utf-8"), prompts
    return path.open("a", encoding="utf-8"), set()


def _answer_prompt(line: bytes) -> str | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    prompt = rec.get("prompt") if isinstance(rec, dict) else None
    return prompt if isinstance(prompt, str) else None


def _keep_latest_answers(path: Path) -> bool:
    """Keep one line per prompt in an --answers file, the latest (a question labelled again, its
    row cut off or deleted from the CSV, had two; the grading check read both); whether any went.
    Rewritten whole or not at all."""
    lines = path.read_bytes().splitlines(keepends=True)
    last = {p: i for i, line in enumerate(lines) if (p := _answer_prompt(line)) is not None}
    keep = [line for i, line in enumerate(lines) if (p := _answer_prompt(line)) is None or last[p] == i]
    if len(keep) == len(lines):
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(b"".join(keep))
    tmp.replace(path)
    return True

