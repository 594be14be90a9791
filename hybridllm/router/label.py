"""Labelling your own model pair: run the edge and the cloud model on questions with reference
answers and write a RouteLLM-format CSV (``prompt``, one True/False column per model, and the edge
answer's mean token log-probability for calibrating the cascade).

Grading. The final answer is what follows the answer's last cue ("answer is", "answer:"; for a
short reference also "option is", "choice:"), as the prompt asks the models to end; without a cue,
the whole answer. A number
reference (GSM8K's ``#### N``: commas, a sign, decimals, "$" or "%" allowed; "3/4" is 0.75) must equal the
final answer's first number (the last one after an "=" there: "3 * 4 = 12"), or, without a cue,
the answer's last number, as RouteLLM grades GSM8K. A short reference (a multiple-choice letter,
yes/no) must be the final answer's first word; without a cue, the answer must open with it (a
letter as an option: "B", "(B) ...", "B. ...", not the article in "A farmer ..."; after a cue,
"option B" too, and not "B and C", a hedge). A longer one
(a word or a name) must appear whole in the final answer.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .._exceptions import CloudError, DataError, EdgeError
from ..prompts import valid_text
from .dataset import CLOUD_TOKENS_COL, LOGPROB_COL, _to_bool


@dataclass(frozen=True)
class Answer:
    text: str
    mean_logprob: float | None = None  # mean token log-probability (the edge side)
    num_tokens: int | None = None  # completion tokens
    finish_reason: str | None = None  # "length" when max_tokens cut the answer off


# prompt -> Answer, or (answer text, mean logprob or None)
Generate = Callable[[str], "Answer | tuple[str, float | None]"]

# Brief on purpose: a long chain of thought costs cloud tokens (and labelling time: on a 2-core CPU
# Qwen2.5-Coder-1.5B averaged 270 tokens per GSM8K answer when told to think step by step, 64 with
# this prompt) and gets cut off at --max-tokens, which grades a right answer wrong.
SYSTEM_PROMPT = (
    "Solve the problem. Show the calculation in at most four short lines of plain "
    "text (no LaTeX), then end with 'The answer is X'."
)
# questions failing one after another, no row written between: the endpoint is down, stop
MAX_FAILED_IN_A_ROW = 20
# the cloud refused the request itself (key, path, model name): every question would fail alike
_CONFIG_STATUS = (401, 403, 404)
# seconds to open a connection to the cloud: a wrong or firewalled address hung for the whole
# --timeout (15 min by default, meant for a long answer) on each of the 3 tries of each question
CONNECT_TIMEOUT_S = 10.0
# a fraction "3/4" (one number, 0.75: read as 3 it graded "3/4" right for a reference of 3), a
# number "1,000", "-2.5", or one without its leading zero ".5" (read as 5)
_NUMBER = re.compile(r"-?(?:\d+/\d+(?![\d,.]*\d)|\d[\d,]*(?:\.\d+)?|(?<![\w.])\.\d+)")
# a reference that is one number: "18", "-3", "1,000", "2.5", ".5", "3/4", "$40", "-$5", "25%"
_NUMBER_REFERENCE = re.compile(r"^\s*\$?\s*-?\$?(?:\d+/\d+|\d[\d,]*(?:\.\d+)?|\.\d+)\s*%?\s*$")
# a minus before a dollar sign, "-$5": the number is -5 (read as 5, a loss graded as the gain)
_MINUS_DOLLAR = re.compile(r"(?<!\S)-\s*\$(?=\s*[\d.])")
# where a reply states its final answer: the part after the last of these ("option is" and
# "choice is" only for a letter: "one option is 3 boxes" is a step of a worked answer)
_CUE = re.compile(r"\banswer\**\s*(?:is\b|:|=)\s*:?", re.IGNORECASE)
_LETTER_CUE = re.compile(r"\b(?:answer|option|choice)\**\s*(?:is\b|:|=)\s*:?", re.IGNORECASE)
# the end of the final answer's first clause: a line end, ";", "(" before a word, or a full stop
_CLAUSE_END = re.compile(r"\n|;|\((?=[^\d\-$])|\.(?=\s|$)")
# a letter opening a reply as an option: "B", "(B) ...", "B. ...", "**B**", "B Paris", not "A farmer"
_OPTION = r"^[\s*_(\[]*{}(?:[).:\]*,]|\s*$|\s+(?![\sa-z]))"
# a final answer naming a letter, then another one as an option: "B and C", "B, D", "(A) or (C)"
_OPTION_HEDGE = r"^[\s*_(\[]*[{}][)\].:*]*\s*(?:,|/|&|\band\b|\bor\b)" + _OPTION[1:].format("[A-Za-z]")


@dataclass(frozen=True)
class Question:
    prompt: str
    reference: str


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    return _number(found[-1]) if found else None


def _number(token: str) -> float | None:
    try:
        if "/" in token:
            num, den = token.split("/")
            return int(num) / int(den)
        return float(token.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _normalize(text: str) -> str:
    return re.sub(r"[^\w ]", "", text.lower()).strip()


def reference_answer(raw: str) -> str:
    """GSM8K references end with ``#### 42``; keep what follows the marker."""
    return raw.split("####")[-1].strip() if "####" in raw else raw.strip()


def _final_part(answer: str, cue: re.Pattern[str] = _CUE) -> str | None:
    """What follows the answer's last cue ("The answer is 7."), or None when it has none."""
    cues = list(cue.finditer(answer))
    return answer[cues[-1].end() :] if cues else None


def _final_number(answer: str) -> float | None:
    """The number a reply gives as its answer: the first one of the final part's first clause
    (after its last "=", when it shows the sum), else the reply's last number."""
    final = _final_part(answer)
    if final is not None:
        clause = _CLAUSE_END.split(final, maxsplit=1)[0]
        found = _NUMBER.findall(clause.rsplit("=", 1)[-1])
        if found:
            return _number(found[0])
    return _last_number(answer)


def is_correct(answer: str, reference: str) -> bool:
    # a typeset minus; "-$5" as -5
    answer, reference = (_MINUS_DOLLAR.sub("-", t.replace("\u2212", "-")) for t in (answer, reference))
    if _NUMBER_REFERENCE.match(reference):
        want = _last_number(reference)
        got = _final_number(answer)
        return want is not None and got is not None and abs(got - want) < 1e-6
    r = _normalize(reference)
    if not r:
        return False
    final = _final_part(answer, _CUE if len(r) > 3 else _LETTER_CUE)
    a, tail = _normalize(answer), _normalize(final or "")
    if a == r or (final is not None and tail == r):
        return True
    if len(r) > 3:  # a word or name: it appears whole in the final answer (or the whole reply)
        return re.search(rf"\b{re.escape(r)}\b", tail if final is not None else a) is not None
    if final is not None:  # a short reference (a letter, yes/no): the final answer's first word
        words = tail.split()
        if len(r) == 1 and words[:1] in (["option"], ["choice"]):  # "The answer is option B."
            words, final = words[1:], re.sub(r"^\W*\w+", "", final)
        # a letter with another option after it, "B and C", "(B) or (D)": a hedge, not an answer
        if len(r) == 1 and re.match(_OPTION_HEDGE.format(r.upper() + r.lower()), final):
            return False
        return (words or [""])[0] == r
    if len(r) == 1:  # a letter opens the reply as an option, not as the word "A" or "I"
        return re.match(_OPTION.format(f"[{r.upper()}{r.lower()}]"), answer) is not None
    return (a.split() or [""])[0] == r


def read_questions(path: str | Path) -> list[Question]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass a JSONL file of questions with --data.")
    try:  # utf-8-sig: a byte-order mark, as some editors write, is not part of line 1
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{p} is not UTF-8 text ({exc}).") from exc
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p} line {i} is not JSON ({exc.msg}).") from exc
        prompt = rec.get("question") or rec.get("prompt") if isinstance(rec, dict) else None
        # GSM8K: ``final`` is the bare number of ``answer``'s ``#### N`` line; the first one given
        # (a null "answer" beside a "reference" was refused; a "final" of 0 was passed over)
        refs = [rec.get(k) for k in ("final", "answer", "reference")] if isinstance(rec, dict) else []
        ref = next((reference_answer(str(r)) for r in refs if r is not None and str(r).strip()), "")
        # blank: every answer graded wrong, and a blank prompt labels nothing ("#### " passed the check)
        if not isinstance(prompt, str) or not prompt.strip() or not ref:
            raise DataError(f"{p} line {i} needs 'question' (or 'prompt') and 'answer' (or 'reference').")
        # a JSON-escaped half emoji ("\\ud83d") cannot be written to the UTF-8 CSV: unreplaced, the
        # run stopped at that question with an internal error, on every rerun
        out.append(Question(prompt=valid_text(prompt), reference=valid_text(ref)))
    if not out:
        raise DataError(f"{p} holds no questions.")
    return out


def _as_answer(result: Any) -> Answer:
    """A backend returns ``(text, mean_logprob)`` or a full :class:`Answer`."""
    if isinstance(result, Answer):
        return result
    text, lp = result[0], result[1]
    return Answer(text=text, mean_logprob=lp)


def _row(q: Question, edge: Answer, cloud: Answer) -> dict[str, Any]:
    return {
        "prompt": q.prompt,
        "edge": is_correct(edge.text, q.reference),
        "cloud": is_correct(cloud.text, q.reference),
        LOGPROB_COL: "" if edge.mean_logprob is None else f"{edge.mean_logprob:.5f}",
        CLOUD_TOKENS_COL: "" if cloud.num_tokens is None else str(cloud.num_tokens),
    }


def label_questions(questions: Iterable[Question], edge: Generate, cloud: Generate) -> list[dict[str, Any]]:
    """Rows with ``prompt``, ``edge`` and ``cloud`` correctness and the edge mean logprob
    (one question at a time; :func:`label_to_csv` is the concurrent, resumable version)."""
    return [_row(q, _as_answer(edge(q.prompt)), _as_answer(cloud(q.prompt))) for q in questions]


def write_labels(rows: list[dict[str, Any]], path: str | Path, *, edge_col: str, cloud_col: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(_header(edge_col, cloud_col))
        for r in rows:
            writer.writerow(_cells(r))
    return out


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


def _read_done(path: Path, header: list[str], run: LabelRun) -> tuple[set[str], list[str]]:
    """Prompts already labelled in ``path`` (resuming), and the file's columns; the header's first
    three must match this run's.

    A last row cut off mid-write (a killed run: no line end, or a quoted prompt never closed) is
    removed from the file to be labelled again; appended to, it would swallow the rows after it.
    A quote never closed further up (a hand edit) is refused: cutting there lost every row after
    it. A file saved by a spreadsheet (a byte-order mark, TRUE/FALSE) resumes as written."""
    if not path.is_file() or path.stat().st_size == 0:
        return set(), header
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    raw: list[str] = []  # the lines of the record the reader is on

    def lines(fh: TextIO) -> Iterator[str]:
        for line in fh:
            raw.append(line)
            yield line

    done: set[str] = set()
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(lines(fh))
            found = next(reader, None)
            if found is None:
                return set(), header
            # Excel's "CSV UTF-8" starts with a byte-order mark: read as "\ufeffprompt", the file
            # was refused as labels "for other models" that were these very ones
            if [found[0].removeprefix("\ufeff"), *found[1:3]] != header[:3]:
                raise DataError(
                    f"{path} already holds labels for other models ({', '.join(found[1:3])}); "
                    "pass another --out, or the same --edge and --cloud-model to resume it."
                )
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
    if end < path.stat().st_size or not ended:
        with path.open("r+b") as raw_fh:
            raw_fh.truncate(end)
            if not ended:  # a whole last row without its line end: the next row starts below it
                raw_fh.seek(end)
                raw_fh.write(b"\r\n")
    return done, found


def _holds_rows(lines: list[str]) -> bool:
    """Whether the lines after the first of a record whose double quote is never closed hold whole
    label rows (a prompt, then two True/False cells): then the quote is damage up the file, not
    a last row cut off mid-write, whose other lines are the rest of its prompt."""
    for text in lines[1:]:
        cells = next(csv.reader([text]), [])
        if text.endswith(("\n", "\r")) and len(cells) >= 3 and None not in map(_to_bool, cells[1:3]):
            return True
    return False


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
    try:
        before = json.loads(side.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return  # unreadable: as if absent
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


def _fmt_seconds(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def label_to_csv(
    questions: Sequence[Question],
    edge: Generate,
    cloud: Generate,
    out: str | Path,
    *,
    edge_col: str,
    cloud_col: str,
    concurrency: int = 8,
    retries: int = 2,
    answers_out: str | Path | None = None,
    progress: TextIO | None = None,
    settings: dict[str, Any] | None = None,
) -> LabelRun:
    """Label ``questions`` into ``out``, appending each row as soon as both answers are in.

    The cloud side is sent ``concurrency`` requests at a time (a batching server answers them
    together); the edge side runs in one thread alongside, since a local model on a few cores gains
    nothing from parallel calls. Prompts already in ``out`` are skipped, so a stopped run resumes.
    A question whose call still fails after ``retries`` retries is left out (a rerun tries it
    again); when every question failed, or ``MAX_FAILED_IN_A_ROW`` did without a row between (the
    cloud went down mid-run: the edge would grind through the rest for nothing), the error is raised.
    ``settings`` (what else decides a grade: the models behind the columns, the token limits, the
    system prompt) are kept beside ``out``; resuming a file made with others is refused.
    So is a cloud error that every question would get: a 401/403/404 (a wrong key, URL path or
    model name; not retried), or a cloud not reached (no HTTP status) before any of its answers
    came back (a wrong or dead --cloud), so that the run stops before the edge side is labelled.
    """
    if concurrency < 1:
        raise DataError("--concurrency must be at least 1.")
    path = Path(out)
    if path.is_dir():
        raise DataError(f"{path} is a folder; pass the CSV file to write with --out.")
    header = _header(edge_col, cloud_col)
    run = LabelRun(out=path)
    done, columns = _read_done(path, header, run)
    if settings is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _check_settings(path, settings, has_rows=bool(run.num_rows))
    seen: set[str] = set()
    todo = []
    for q in questions:
        if q.prompt in done or q.prompt in seen:
            run.num_skipped += q.prompt in done
            continue
        seen.add(q.prompt)
        todo.append(q)
    if not todo:
        return run

    cloud_answered = False  # any cloud answer came back in this run
    stopping = threading.Event()  # the run stopped: calls in flight do not try again
    # a 401/403/404 from the cloud, set by the worker that got it, before its pool starts the
    # next question: every later cloud call would get the same answer, so none is sent
    refused: list[CloudError] = []

    def attempt(gen: Generate, prompt: str) -> Answer:
        if gen is cloud and refused:
            raise CloudError(str(refused[0]), status_code=refused[0].status_code)
        last: Exception | None = None
        for _ in range(retries + 1):
            if last is not None and stopping.is_set():
                break
            try:
                return _as_answer(gen(prompt))
            except (CloudError, EdgeError) as exc:
                last = exc
                if isinstance(exc, CloudError) and exc.status_code in _CONFIG_STATUS:
                    if gen is cloud:
                        refused.append(exc)
                    break  # asking again gets the same answer
        assert last is not None
        raise last

    def fatal(side: str, exc: Exception) -> bool:
        """A cloud error every question would get: stop now, not after the edge side of them all."""
        if side != "cloud" or not isinstance(exc, CloudError):
            return False
        return exc.status_code in _CONFIG_STATUS or (exc.status_code is None and not cloud_answered)

    path.parent.mkdir(parents=True, exist_ok=True)
    new_file = not path.is_file() or path.stat().st_size == 0
    fh = path.open("a", newline="", encoding="utf-8")
    answers_path = Path(answers_out) if answers_out else None
    answers_fh, answered = _append_lines(answers_path) if answers_path else (None, set())
    relabelled = False  # a prompt in ``answered`` got a new line: the older one goes at the end
    writer = csv.writer(fh)
    if new_file:
        writer.writerow(header)
        fh.flush()
    start = time.monotonic()
    results: dict[int, dict[str, Answer]] = {}
    written: set[int] = set()

    def write_row(i: int, got: dict[str, Answer]) -> dict[str, Any]:
        """Question ``i``'s row, and its line of --answers; marked written first, so that a Ctrl-C
        right after the write never writes it twice."""
        nonlocal relabelled
        written.add(i)
        row = _row(todo[i], got["edge"], got["cloud"])
        writer.writerow(_cells(row, columns))
        fh.flush()
        if answers_fh is not None:
            relabelled = relabelled or todo[i].prompt in answered
            answers_fh.write(
                json.dumps(
                    {
                        "prompt": todo[i].prompt,
                        "reference": todo[i].reference,
                        "edge": got["edge"].text,
                        "edge_finish": got["edge"].finish_reason,
                        "cloud": got["cloud"].text,
                        "cloud_finish": got["cloud"].finish_reason,
                        "cloud_tokens": got["cloud"].num_tokens,
                    }
                )
                + "\n"
            )
            answers_fh.flush()
        return row

    try:
        with (
            ThreadPoolExecutor(1, thread_name_prefix="label-edge") as edge_pool,
            ThreadPoolExecutor(concurrency, thread_name_prefix="label-cloud") as cloud_pool,
        ):
            futures: dict[Future[Answer], tuple[int, str]] = {}
            for i, q in enumerate(todo):  # same order on both sides: rows complete in order
                futures[edge_pool.submit(attempt, edge, q.prompt)] = (i, "edge")
                futures[cloud_pool.submit(attempt, cloud, q.prompt)] = (i, "cloud")
            failed: set[int] = set()
            failed_in_a_row = 0  # questions failed since the last row written
            try:
                for fut in as_completed(futures):
                    i, side = futures[fut]
                    try:
                        results.setdefault(i, {})[side] = fut.result()
                    except (CloudError, EdgeError) as exc:
                        if i not in failed:
                            failed.add(i)
                            run.num_failed += 1
                            run.errors.append(f"{side}: {exc}")
                            failed_in_a_row += 1
                        if failed_in_a_row >= MAX_FAILED_IN_A_ROW or len(failed) == len(todo):
                            raise
                        if fatal(side, exc):
                            code = getattr(exc, "status_code", None)
                            why = "every question would get this" if code else "no cloud answer came back yet"
                            raise CloudError(
                                f"{exc} (stopped: {why}; check --cloud, --cloud-model and --api-key; "
                                "the rows already in the file are kept)",
                                status_code=code,
                            ) from exc
                        continue
                    cloud_answered = cloud_answered or side == "cloud"
                    got = results[i]
                    if i in failed or len(got) < 2:
                        continue
                    row = write_row(i, got)
                    del results[i]
                    failed_in_a_row = 0
                    run.num_added += 1
                    run.num_rows += 1
                    run.edge_correct += bool(row["edge"])
                    run.cloud_correct += bool(row["cloud"])
                    if progress is not None:
                        # never 0: Windows' monotonic clock ticks every 15.6 ms, and a fast
                        # (cached, or fake) pair of answers divided by it
                        elapsed = max(time.monotonic() - start, 1e-6)
                        left = len(todo) - run.num_added - len(failed)
                        eta = elapsed / run.num_added * left
                        progress.write(
                            f"labelled {run.num_added}/{len(todo)}"
                            f" ({run.num_rows} in file, {run.num_failed} failed)"
                            f"  edge {run.edge_correct / run.num_rows:.3f}"
                            f"  cloud {run.cloud_correct / run.num_rows:.3f}"
                            f"  {run.num_added / elapsed * 60:.1f}/min"
                            f"  elapsed {_fmt_seconds(elapsed)}  ETA {_fmt_seconds(eta)}\n"
                        )
                        progress.flush()
            except BaseException as exc:  # Ctrl-C or a fatal error: drop the queue, keep the rows written
                stopping.set()
                for f in futures:
                    f.cancel()
                in_flight = [f for f in futures if not f.cancelled()]
                if progress is not None:
                    dropped = len({futures[f][0] for f in futures if f.cancelled()})
                    running = sum(f.running() for f in futures)
                    progress.write(f"stopping: {dropped} questions dropped, waiting for the {running}"
                                   " answers in flight; rerun the same command to resume\n")
                    progress.flush()
                if isinstance(exc, (KeyboardInterrupt, CloudError, EdgeError)):
                    # the answers in flight are waited for anyway (the pools' exit): a question
                    # whose two answers both came back gets its row (they were thrown away)
                    wait(in_flight)
                    kept = 0
                    for f in in_flight:
                        i, side = futures[f]
                        if f.exception() is None and i not in written and i not in failed:
                            results.setdefault(i, {})[side] = f.result()
                            if len(results[i]) == 2:
                                write_row(i, results[i])
                                kept += 1
                    if progress is not None and kept:
                        progress.write(f"kept {kept} more rows, their answers in flight when it stopped\n")
                        progress.flush()
                raise
    finally:
        fh.close()
        if answers_fh is not None:
            answers_fh.close()
            if relabelled and answers_path is not None:
                _keep_latest_answers(answers_path)
    return run


def llama_cpp_edge(
    model_path: str | Path, *, max_tokens: int = 256, n_ctx: int = 2048, system_prompt: str = SYSTEM_PROMPT
) -> Generate:
    """Greedy answers from a GGUF model with llama.cpp, plus their mean token log-probability."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise EdgeError("The edge model needs llama-cpp-python: pip install llama-cpp-python") from exc
    from ..backends.llama_cpp import _route_llama_logs

    _route_llama_logs()  # its advice lines off the progress bar's stderr
    try:
        llm = Llama(model_path=str(model_path), n_ctx=n_ctx, logits_all=True, verbose=False)
    except Exception as exc:
        raise EdgeError(f"llama.cpp could not load {model_path}: {exc}") from exc

    def generate(prompt: str) -> Answer:
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
        try:
            out: Any = llm.create_chat_completion(  # type: ignore[call-overload,misc]
                messages=messages,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=0.0,
            )
        except Exception as exc:
            raise EdgeError(f"llama.cpp failed while answering: {exc}") from exc
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Answer(
            text=choice["message"]["content"] or "",
            mean_logprob=_greedy_mean_logprob(
                llm.scores, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            ),
            num_tokens=usage.get("completion_tokens"),
            finish_reason=choice.get("finish_reason"),
        )

    return generate


def _greedy_mean_logprob(scores: Any, num_prompt: int, num_completion: int) -> float | None:
    """Mean log-probability of a greedy completion from llama.cpp's saved logits.

    Row ``j`` of ``scores`` (``logits_all``) holds the logits after token ``j``, so the completion's
    tokens are predicted by rows ``num_prompt - 1 .. num_prompt + num_completion - 2``; greedy
    decoding picked each row's argmax, whose log-probability is ``max - logsumexp``. (Asking
    llama-cpp-python for ``logprobs`` instead sorts the whole 49k vocabulary in Python for every
    token: on two cores that made the 135M edge slower per question than the batched 1.5B cloud.)
    """
    import numpy as np

    if num_prompt < 1 or num_completion < 1:
        return None
    rows = np.asarray(scores[num_prompt - 1 : num_prompt - 1 + num_completion], dtype=np.float64)
    if len(rows) == 0:
        return None
    top = rows.max(axis=1)
    lse = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
    return float(np.mean(top - lse))


def openai_cloud(
    url: str,
    *,
    model: str = "default",
    api_key: str | None = None,
    max_tokens: int = 256,
    timeout: float = 900.0,
    system_prompt: str = SYSTEM_PROMPT,
) -> Generate:
    """Greedy answers from an OpenAI-compatible ``/v1/chat/completions`` endpoint."""
    import httpx

    base = url.rstrip("/")
    endpoint = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # --timeout waits for a long answer; opening the connection never needs that long
    limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
    client = httpx.Client(timeout=limits, headers=headers)

    def generate(prompt: str) -> Answer:
        body = {
            "model": model,
            "temperature": 0.0,
            "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}],
        }
        try:
            resp = client.post(endpoint, json=body)
        except httpx.HTTPError as exc:
            raise CloudError(f"Cannot reach {endpoint}: {exc}; check --cloud.") from exc
        if resp.status_code != 200:
            raise CloudError(
                f"{endpoint} answered {resp.status_code}: {resp.text[:200]}", status_code=resp.status_code
            )
        try:
            data = resp.json()
            choice = data["choices"][0]
            return Answer(
                text=str(choice["message"]["content"] or ""),
                num_tokens=(data.get("usage") or {}).get("completion_tokens"),
                finish_reason=choice.get("finish_reason"),
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise CloudError(f"{endpoint} returned no chat completion: {resp.text[:200]}") from exc

    return generate
