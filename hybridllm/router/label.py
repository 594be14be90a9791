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
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .._exceptions import CloudError, DataError, EdgeError
from ..prompts import valid_text
from ._dataset_table import NOT_UTF8, TSV_SUFFIXES, _read_table, text_encoding

# SYSTEM_PROMPT, llama_cpp_edge, openai_cloud, settings_path: public names of this module, defined
# in its private parts now and importable from here as before (router/_cli_commands.py imports the first
# three from here, and tests patch label.llama_cpp_edge and label.openai_cloud for it)
from ._label_backends import SYSTEM_PROMPT, Answer, Generate, llama_cpp_edge, openai_cloud  # noqa: F401
from ._label_files import (
    LabelRun,
    _append_lines,
    _cells,
    _check_settings,
    _header,
    _keep_latest_answers,
    _read_done,
    check_out_paths,
    check_resumable,  # noqa: F401 - router/_cli_commands.py checks --out with it before a model loads
    settings_path,  # noqa: F401
)
from ._label_grading import is_correct
from .dataset import CLOUD_TOKENS_COL, LOGPROB_COL

# questions failing one after another, no row written between: the endpoint is down, stop
MAX_FAILED_IN_A_ROW = 20
# the cloud refused the request itself (key, path, model name): every question would fail alike
_CONFIG_STATUS = (401, 403, 404)


@dataclass(frozen=True)
class Question:
    prompt: str
    reference: str


def reference_answer(raw: str) -> str:
    """GSM8K references end with ``#### 42``; keep what follows the marker."""
    return raw.split("####")[-1].strip() if "####" in raw else raw.strip()


def read_questions(path: str | Path) -> list[Question]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass a JSON Lines or CSV file of questions with --data.")
    out = []
    for i, rec in _question_records(p):
        prompt = rec.get("question") or rec.get("prompt") if isinstance(rec, dict) else None
        # GSM8K: ``final`` is the bare number of ``answer``'s ``#### N`` line; the first one given
        # (a null "answer" beside a "reference" was refused; a "final" of 0 was passed over)
        refs = [rec.get(k) for k in ("final", "answer", "reference")] if isinstance(rec, dict) else []
        given = next((r for r in refs if r is not None and str(r).strip()), None)
        if isinstance(given, list | dict):
            # a list of accepted answers (TriviaQA's aliases) was graded as its Python text,
            # "['Paris', 'paris, france']", which no answer holds: every row labelled wrong
            raise DataError(
                f"{p} line {i}: the reference answer is a {type(given).__name__} "
                f"({json.dumps(given)[:60]}); give one reference answer, a string or a number."
            )
        ref = "" if given is None else reference_answer(str(given))
        # blank: every answer graded wrong, and a blank prompt labels nothing ("#### " passed the check)
        if not isinstance(prompt, str) or not prompt.strip() or not ref:
            raise DataError(f"{p} line {i} needs 'question' (or 'prompt') and 'answer' (or 'reference').")
        # a JSON-escaped half emoji ("\\ud83d") cannot be written to the UTF-8 CSV: unreplaced, the
        # run stopped at that question with an internal error, on every rerun
        out.append(Question(prompt=valid_text(prompt), reference=valid_text(ref)))
    if not out:
        raise DataError(f"{p} holds no questions.")
    return out


def _question_records(p: Path) -> Iterator[tuple[int, Any]]:
    """Each question record with its line: JSON Lines, or a CSV/TSV file with a header (read as
    a labelled file's table: its delimiter, a byte-order mark, UTF-16). A CSV of questions was read
    as JSON and refused as "line 1 is not JSON", not saying that JSON Lines was all it took."""
    if p.suffix.lower() in (".csv", *TSV_SUFFIXES):
        for i, row in enumerate(_read_table(p)[1]):
            yield i + 2, row  # line 1 is the header (a quoted cell over several lines: about there)
        return
    try:  # a byte-order mark, as some editors write, is not part of line 1 (UTF-16's: text_encoding)
        text = p.read_text(encoding=text_encoding(p))
    except UnicodeDecodeError as exc:
        raise DataError(f"{p} is not UTF-8 text ({exc}); {NOT_UTF8}.") from exc
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p} line {i} is not JSON ({exc.msg}); pass JSON Lines (one object "
                            "a line) or a CSV with a header.") from exc


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
    check_out_paths(path, answers_out)  # a folder, or a path under a file
    header = _header(edge_col, cloud_col)
    run = LabelRun(out=path)
    done, columns = _read_done(path, header, run, {q.prompt for q in questions}, progress)
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

