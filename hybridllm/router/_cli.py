"""``hybridllm router ...``: train, eval, label, calibrate. ``register`` adds the command group (its
parser; the commands run in _cli_commands and _cli_eval)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._cli_options import given, non_negative_int, positive_float, positive_int, unit_interval
from ._cli_commands import _calibrate, _label, _train
from ._cli_eval import (
    _eval,
    evaluate_router_on,  # noqa: F401 - re-exported: a public name; tests (test_other_pairs, ...) import it here
)

# paths given blank (an unset shell variable, `--out "$DIR"`) are usage errors: Path("") is the
# current folder, so `train --out ""` wrote router.json there (over a router already in it),
# `calibrate --out ""` rewrote the --router folder in place, `--plot ""` and `--answers ""` were
# dropped without a word, and `--router ""` said "No router.json in ."
_FILE = given("a file path")
_FOLDER = given("a folder path")
_ROUTER = given("a router folder (leave --router out for the shipped router)")


def _input_file(what: str) -> Callable[[str], str]:
    """An argparse type for a file the command reads (``what``: the kind of file, for the message):
    blank is refused as by _FILE, and so is a folder (`--data data/`), which the readers reported
    as not existing ("data does not exist"), sending the user to look for a typo in a path that is
    there. A path that is not there is left to the readers, whose message says what to pass."""

    def parse(text: str) -> str:
        _FILE(text)
        if Path(text).expanduser().is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a folder, not a file; pass {what}")
        return text

    return parse


_LABELLED = _input_file("a labelled RouteLLM-format CSV or JSON Lines file")

# how --weak-col / --strong-col are found when not given (dataset.load_routellm_csv)
_DETECTED = "the file's two True/False or score columns, the strong one told by the names or accuracy"


def _folds(text: str) -> int:
    """Cross-validation folds: two at least (checked as parsed: it exited 1 after the data was read)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 2, got {text!r}")
    return value


def _inverse_strength(text: str) -> float:
    """--c: a positive number; inf (no L2 penalty) is taken, as before."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    router = subparsers.add_parser("router", help="train, evaluate and calibrate the router")
    # ACTION, as the other groups name it: without a metavar, `hybridllm router` alone said "the
    # following arguments are required: router_command", the attribute's name in the code
    sub = router.add_subparsers(dest="router_command", metavar="ACTION", required=True)

    p = sub.add_parser("train", help="train a router on labelled CSV (RouteLLM's format) or JSON Lines files")
    p.add_argument(
        "--data",
        required=True,
        action="append",
        type=_LABELLED,
        help="labelled file, CSV or JSON Lines, with a prompt column and two model score "
        "columns (True/False or graded); repeat it to train on several sources "
        "(cross-validation still folds by question)",
    )
    p.add_argument(
        "--weight",
        type=positive_float,
        action="append",
        default=None,
        help="relative share of each --data file, in order, in the source gate (default: by row "
        "count); with --no-embedding, its total weight in one pooled scorer (default: equal)",
    )
    p.add_argument(
        "--cascade-data",
        action="append",
        default=None,
        type=_LABELLED,
        help="labelled CSV (from `router label`) whose edge log-probabilities only calibrate the "
        "cascade's floor, without training the scorer; repeatable (default: the --data files' own, "
        "else -1.0)",
    )
    p.add_argument("--weak-col", help="the weak (edge) model's column (in files that have it; "
                   f"default: {_DETECTED})")
    p.add_argument("--strong-col", help="the strong (cloud) model's column (in files that have it; "
                   f"default: {_DETECTED})")
    _prompt_col_arg(p)
    _score_range_arg(p)
    _reference_arg(p)
    _tier_args(p)
    p.add_argument("--out", required=True, type=_FOLDER,
                   help="folder to write router.json and weights.npz; a router already there is "
                   "replaced once training succeeds, with a note on stderr (a failed or stopped run "
                   "leaves it as it was)")
    # the defaults written out are train.Hyper's (a test holds them together): importing it here
    # would load numpy for every `hybridllm` command
    p.add_argument("--c", type=_inverse_strength, default=None,
                   help="inverse L2 strength of the linear part (default: 0.002)")
    p.add_argument("--k", type=positive_int, default=None,
                   help="neighbors of the neighbor part (default: 50)")
    p.add_argument("--mix", type=unit_interval, default=None,
                   help="weight of the neighbor part against the linear part, 0..1 (default: 0.8)")
    p.add_argument("--topics", type=non_negative_int, default=None,
                   help="k-means clusters of the topic part, 0 turns it off (default: 60)")
    p.add_argument("--topic-mix", type=unit_interval, default=None,
                   help="weight of the topic part, 0..1 (default: 0.5)")
    p.add_argument(
        "--folds",
        type=_folds,
        default=5,
        help="cross-validation folds, by question (default: 5)",
    )
    p.add_argument("--no-embedding", action="store_true",
                   help="text features only (default: text features and the sentence embedding)")
    # usage_error: an argument error that needs the whole command line (one --weight per --data)
    p.set_defaults(func=_train, usage_error=p.error)

    p = sub.add_parser("eval", help="RouteLLM metrics of a router on a labelled CSV or JSON Lines file")
    p.add_argument("--data", required=True, type=_LABELLED,
                   help="labelled file, CSV or JSON Lines (as for train)")
    p.add_argument("--router", type=_ROUTER, help="router folder (default: the shipped router)")
    p.add_argument("--weak-col", help="the weak model's column (default: the router's training "
                   f"columns where the file has them, else {_DETECTED})")
    p.add_argument("--strong-col", help="the strong model's column (default: as for --weak-col)")
    _prompt_col_arg(p)
    _score_range_arg(p)
    _reference_arg(p)
    _tier_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="PATH", type=_FILE,
                   help="write the cost/quality curves to this image file and print its path (a name "
                   "without an extension gets .png; an existing folder, or a path ending in /, gets "
                   "a PNG inside named after the --data file) (default: no plot)")
    p.set_defaults(func=_eval)

    p = sub.add_parser("label", help="run an edge and a cloud model on questions, write a CSV")
    p.add_argument("--data", required=True, type=_input_file("a JSONL or CSV file of questions"),
                   help="JSON Lines with question and answer per line, or a CSV/TSV with those columns")
    p.add_argument("--edge", required=True, type=given("a catalog model id or a GGUF file path"),
                   help="catalog id or GGUF path of the edge model")
    p.add_argument("--cloud", required=True, type=_http_url, help="OpenAI-compatible base URL")
    p.add_argument(
        "--cloud-model",
        default="default",
        help="model name sent to the cloud; the CSV's cloud column is cloud:NAME (default: default)",
    )
    p.add_argument("--api-key", default=None, help="default: $HYBRIDLLM_CLOUD_API_KEY")
    p.add_argument(
        "--out",
        default="labels.csv",
        type=_FILE,
        help="CSV to write; if it exists, its prompts are skipped (resume) and new rows are appended "
        "(default: labels.csv)",
    )
    p.add_argument(
        "--answers",
        default=None,
        type=_FILE,
        help="also append both answers per question to this JSONL, for checking grades (default: "
        "not kept)",
    )
    p.add_argument("--limit", type=positive_int, default=None,
                   help="label only the first N questions (default: all)")
    p.add_argument("--max-tokens", type=positive_int, default=256,
                   help="longest answer of either model (default: 256)")
    p.add_argument(
        "--edge-max-tokens",
        type=positive_int,
        default=None,
        help="longest edge answer (default: --max-tokens); one llama.cpp stream on a few cores "
        "can cost more per question than the batched cloud",
    )
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=8,
        help="cloud requests in flight at once; the edge runs alongside, one at a time (default: 8)",
    )
    p.add_argument("--timeout", type=positive_float, default=900.0,
                   help="seconds to wait for one cloud answer (default: 900)")
    p.set_defaults(func=_label)

    p = sub.add_parser("calibrate", help="set the threshold for a target cloud fraction")
    p.add_argument(
        "--prompts",
        required=True,
        type=_input_file("a file of prompts"),
        help="JSON Lines (strings or objects), CSV/TSV with a prompt column, or one prompt a line",
    )
    _prompt_col_arg(p)
    p.add_argument(
        "--cloud-fraction",
        type=unit_interval,
        required=True,
        help="share of these prompts to send to the cloud, 0..1; the threshold is set to that "
        "quantile (0: threshold 1, no prompt goes; 1: threshold 0, every prompt)",
    )
    p.add_argument("--router", type=_ROUTER, help="router folder (default: the shipped router)")
    p.add_argument("--out", type=_FOLDER, help="folder for the calibrated router (default: --router)")
    p.set_defaults(func=_calibrate)


def _http_url(text: str) -> str:
    """--cloud: an http:// or https:// URL, as the cloud_url setting must be. Without the scheme
    (`--cloud localhost:8731`, or blank) it was refused only by the first request, after the
    --out file and its settings had been written with that URL."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        ok = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:  # an unclosed [ of an IPv6 address, a port that is no number
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"expected the cloud's base URL, starting with http:// or https:// "
            f"(say http://127.0.0.1:8731), got {text!r}")
    return text


def _score_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI such as 1,10, got {text!r}") from None
    if not hi > lo:
        raise argparse.ArgumentTypeError(f"LO must be below HI, got {text!r}")
    if not (math.isfinite(lo) and math.isfinite(hi)):  # 1,inf mapped every mark to 0, silently
        raise argparse.ArgumentTypeError(f"LO and HI must be finite numbers, got {text!r}")
    return lo, hi


def _prompt_col_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt-col",
        default=None,
        metavar="COL",
        help="the prompt column (default: 'prompt', else the file's only 'question', 'query', "
        "'input', 'instruction', 'text', 'messages', 'conversation', 'turns' or 'conversations' column)",
    )


def _reference_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reference-strong",
        action="store_true",
        help="a file with one model column grades the weak model against the strong model's "
        "answers as the reference (a judge's marks): the strong model scores the top of the scale",
    )


def _tier_args(p: argparse.ArgumentParser) -> None:
    for side, example in (("strong", "gpt-4*"), ("weak", "mixtral*")):
        p.add_argument(
            f"--{side}-models",
            action="append",
            default=None,
            metavar="NAMES",
            help=f"in files of pairwise judgements (a 'winner' column, arena-style): the {side} "
            f"tier's models, names or globs such as '{example}', comma-separated or repeated; rows "
            "between a strong and a weak model are kept (default: none; such a file needs both)",
        )


def _score_range_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--score-range",
        type=_score_range,
        default=None,
        metavar="LO,HI",
        help="graded scores on this scale (say 1,10 for a judge's marks) are mapped to [0, 1]; "
        "True/False columns and scores already in [0, 1] need nothing (default: read as they are)",
    )
