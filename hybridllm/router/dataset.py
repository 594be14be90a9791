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

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._exceptions import DataError
from ._dataset_roles import _pick_roles
from ._dataset_scores import (
    _BLANK,
    CLOUD_TOKENS_COL,  # noqa: F401  re-exported for router/label.py, _label_files.py
    LOGPROB_COL,
    _bad_cell,
    _logprob_column,
    _scaled,
    _score_columns,
    _spoiled_columns,
    _to_bool,  # noqa: F401  re-exported for router/label.py, _label_files.py
)
from ._dataset_table import (
    BINARY_SUFFIXES,
    JSON_SUFFIXES,
    NOT_UTF8,
    PROMPT_ALIASES,
    PROMPT_COL,
    TSV_SUFFIXES,
    _csv_delimiter,
    _json_records,
    _prompt_cell,
    _prompt_column,
    _read_table,
    _separator_hint,
    _text_prompt,
    text_encoding,
)
from .preference import is_preference, judged_scores, tiers_from

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
    skipped: int = 0  # rows left out: a blank weak or strong cell, or a blank prompt
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
            # which row to fix: the first cell that is not a score, else the column is all blank
            bad = _bad_cell(rows, col, semicolons)
            where = f" (row {bad[0]} holds {bad[1]!r})" if bad else " (it is blank in every row)"
            raise DataError(
                f"Column {col!r} of {p} is not all scores{where}: True/False, numbers in [0, 1] (or "
                "on the --score-range scale), or blank for a row that was not labelled."
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
                said += _spoiled_columns(header, rows, prompt_col, numeric, semicolons)
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
                    + _spoiled_columns(header, rows, prompt_col, numeric, semicolons)
                    + _separator_hint(header) + judged
                )
            raise DataError(
                f"{p} has {len(pool)} {kind} model columns ({', '.join(pool)}); "
                "name the two models with --weak-col and --strong-col." + judged
            )
        else:
            pair = known + candidates
            # off the scale (a --score-range column outside it): said here, since telling the roles
            # apart reads both columns' scores (an internal KeyError, when the names did not tell)
            off = next((c for c in pair if c not in values), None)
            if off is not None:
                raise DataError(_off_scale(p, off, numeric[off], score_range))
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
            raise DataError(_off_scale(p, col, numeric[col], score_range))
    weak, strong = values[weak_col], values[strong_col]
    labelled = ~(np.isnan(weak) | np.isnan(strong))
    if not labelled.any():
        raise DataError(f"No row of {p} has both a {weak_col!r} and a {strong_col!r} score.")
    keep = np.flatnonzero(labelled)
    prompts, filled = _prompts(p, rows, keep, prompt_col)
    keep = keep[filled]
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


def _off_scale(p: Path, col: str, scores: np.ndarray, score_range: tuple[float, float] | None) -> str:
    """What to say of a score column outside the scale it is read on: [0, 1], or the --score-range
    given (there the message asked for the --score-range the user had passed)."""
    lo, hi = np.nanmin(scores), np.nanmax(scores)
    if score_range is None:
        return (f"Column {col!r} of {p} holds scores from {lo:g} to {hi:g}, outside [0, 1]: pass "
                "their scale with --score-range LO,HI (say 1,10 for a judge's marks).")
    a, b = score_range
    return (f"Column {col!r} of {p} holds scores from {lo:g} to {hi:g}, outside --score-range "
            f"{a:g},{b:g}: pass the scale its scores are on (the range applies to every --data file, "
            "so train files on other scales apart, or rescale one).")


def _load_judgements(
    p: Path,
    header: list[str],
    rows: list[dict[str, str]],
    prompt_col: str,
    strong_models: list[str] | None,
    weak_models: list[str] | None,
) -> RoutingData:
    j = judged_scores(p, header, rows, tiers_from(strong_models), tiers_from(weak_models))
    prompts, filled = _prompts(p, rows, j.keep, prompt_col)
    return RoutingData(
        prompts=prompts,
        weak=j.weak[filled],
        strong=j.strong[filled],
        weak_col=j.weak_name,
        strong_col=j.strong_name,
        skipped=j.left_out + int((~filled).sum()),
        prompt_col=prompt_col,
    )


def _prompts(p: Path, rows: list[dict[str, str]], keep: np.ndarray,
             prompt_col: str) -> tuple[list[str], np.ndarray]:
    """The prompts of the rows ``keep`` names, and which of those rows have one: a row whose prompt
    is blank is left out (counted in ``skipped``), as one with a blank score. It was trained on as
    the empty prompt, its scores taught to whatever the empty text's features are."""
    json_file = p.suffix.lower() in JSON_SUFFIXES
    prompts = [_text_prompt(p, int(i), rows[i].get(prompt_col) or "", json_file) for i in keep]
    filled = np.array([bool(pr.strip()) for pr in prompts], dtype=bool)
    if not filled.any():
        raise DataError(f"Every prompt in {p} (column {prompt_col!r}) is empty.")
    return [pr for pr, f in zip(prompts, filled, strict=True) if f], filled

def file_columns(path: str | Path) -> list[str]:
    """The columns of a labelled file, or [] when it cannot be read (the loader says why)."""
    try:
        return _read_table(Path(path), header_only=True)[0]
    except (DataError, OSError):
        return []


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
            text = p.read_text(encoding=text_encoding(p))
        except UnicodeDecodeError as exc:
            raise DataError(f"{p} is not UTF-8 text ({exc}); {NOT_UTF8}.") from exc
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
        if not header:  # else "no 'prompt' column (columns: )" for a file with nothing in it
            raise DataError(f"{p} is empty; it needs a header with a prompt column, then one prompt a row.")
        col = _prompt_column(p, header, prompt_col)
        prompts = [_text_prompt(p, i, r.get(col) or "", False) for i, r in enumerate(rows)]
    else:
        try:
            prompts = p.read_text(encoding=text_encoding(p)).splitlines()
        except UnicodeDecodeError as exc:
            raise DataError(f"{p} is not UTF-8 text ({exc}); {NOT_UTF8}.") from exc
        if prompt_col is not None:
            prompts = _text_file_column(p, prompts, prompt_col)
    prompts = [t for t in prompts if t.strip()]
    if not prompts:
        raise DataError(f"{p} holds no prompts.")
    return prompts


def _text_file_column(p: Path, lines: list[str], prompt_col: str) -> list[str]:
    """A text file read with ``--prompt-col``: its first line is a header naming that column. One
    column (the line is the name): the prompts are the lines after it. Several (a tab- or
    comma-separated table saved as .txt): that column, read as a CSV's. A first line that is no
    such header is refused: read one prompt a line, the flag was ignored without a word and a
    header line such as ``prompt`` was calibrated on as a prompt."""
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].strip() == prompt_col.strip():
        return lines[first + 1 :]
    if first is not None and prompt_col in file_columns(p):
        rows = _read_table(p)[1]
        return [_text_prompt(p, i, r.get(prompt_col) or "", False) for i, r in enumerate(rows)]
    shown = "nothing" if first is None else repr(lines[first][:60])
    raise DataError(
        f"{p} is read as text, one prompt a line, and its first line ({shown}) is not a header "
        f"naming the column {prompt_col!r} given with --prompt-col. Leave out --prompt-col for a "
        "file of one prompt a line, or save a table of prompts as .csv, .tsv or .jsonl."
    )


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
