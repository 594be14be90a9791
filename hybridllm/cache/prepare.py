"""Prepare the cache's ONNX models on the device, once: build, quantize to int8, write atomically.

No torch: the graphs come from :mod:`.onnx_graph` (numpy weights, ``onnx`` helpers) and are
quantized by ONNX Runtime. Each prepared folder holds ``model.onnx`` (fp32), ``model.int8.onnx``,
``tokenizer.json`` and ``quantization.txt`` (the recipe the int8 file was made with; a folder made
with another is made again):

- the sentence embedder in ``data_dir()/embedders/minilm-l6-v2/``;
- a cache reranker in ``data_dir()/rerankers/minilm-l6-v2-<weights digest>/``.

First use prints one line on stderr, "Preparing the semantic cache embedder (once) ... done in 2.1 s".
Writing is safe with concurrent processes: an exclusive lock file serializes preparers (POSIX
``fcntl``; elsewhere the temporary names carry the pid), files are written under a temporary name
and renamed into place, and a process that waited on the lock re-checks whether the work is done.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._exceptions import ModelError
from .._files import atomic_write, remove_leftovers, replacing
from .._paths import data_dir
from . import onnx_graph
from .reranker_file import cross_encoder_weights

EMBEDDER_ID = "minilm-l6-v2"
FP32_NAME = "model.onnx"
INT8_NAME = "model.int8.onnx"
TOKENIZER_NAME = "tokenizer.json"
# The int8 recipe, written last into a prepared folder. A folder holding another recipe (or none:
# signed int8 weights, before 2026-12-02) is prepared again on first use, with the usual notice.
RECIPE_NAME = "quantization.txt"
RECIPE = "int8 v2: uint8 weights per output channel (U8U8), FFN down projections fp32\n"
# a reranker folder's logit range per graph file (:mod:`.logit_bound`), read off the graphs with
# ``onnx`` once, as the folder is prepared, so that using the cache never loads ``onnx``
LOGIT_RANGE_NAME = "logit_range.json"
_NAMES = (FP32_NAME, INT8_NAME, TOKENIZER_NAME, RECIPE_NAME)  # written by _write_files, in this order
# their temporaries, .NAME.*.tmp (_files.replacing), which only the preparer holding .prepare.lock writes
_LEFTOVER = re.compile(rf"\.(?:{'|'.join(map(re.escape, _NAMES))})\..*\.tmp", re.DOTALL)

Notice = Callable[[str], None]  # one line of progress for a person


def embedder_dir() -> Path:
    return data_dir() / "embedders" / EMBEDDER_ID


def reranker_dir(weights_digest: str) -> Path:
    """Where the ONNX form of one reranker file lives (one folder per weights digest)."""
    return data_dir() / "rerankers" / f"{EMBEDDER_ID}-{weights_digest}"


def is_prepared(folder: Path) -> bool:
    if not all((folder / n).is_file() for n in (FP32_NAME, INT8_NAME, TOKENIZER_NAME)):
        return False
    try:
        return (folder / RECIPE_NAME).read_text(encoding="utf-8") == RECIPE
    except (OSError, UnicodeDecodeError):
        return False


def prepare_embedder(
    *, source_dir: Path | None = None, out_dir: Path | None = None, notice: Notice | None = None
) -> Path:
    """The folder of the embedder's ONNX files, built on first call; later calls only check."""

    def build(src: Path) -> Any:
        return onnx_graph.sentence_encoder(onnx_graph.read_config(src), onnx_graph.read_base_weights(src))

    return _prepare(out_dir or embedder_dir(), "embedder", build, source_dir=source_dir, notice=notice)


def prepare_reranker(
    weights_file: Path,
    weights_digest: str,
    *,
    source_dir: Path | None = None,
    out_dir: Path | None = None,
    notice: Notice | None = None,
) -> Path:
    """The folder of a reranker file's ONNX files (see :func:`.reranker_file.read_weights`)."""

    def build(src: Path) -> Any:
        return onnx_graph.cross_encoder(onnx_graph.read_config(src), cross_encoder_weights(weights_file, src))

    out = _prepare(out_dir or reranker_dir(weights_digest), "reranker", build, source_dir=source_dir,
                   notice=notice)
    logit_ranges(out)  # a folder prepared before the ranges were written gets them now, once
    return out


def logit_ranges(folder: Path) -> dict[str, tuple[float, float]]:
    """Graph file name -> the lowest and highest logit that reranker graph can give any pair, from
    ``LOGIT_RANGE_NAME`` beside it; computed (``onnx``) and written there when missing or
    unreadable. A graph whose shape does not say has no entry (every pair is then scored). A
    folder that cannot be written to gets the ranges computed again by the next process."""
    path = folder / LOGIT_RANGE_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ranges = {str(k): (float(v[0]), float(v[1])) for k, v in data.items()}
        # NaN or a reversed range would skip every pair (no hit ever, silently): damaged
        if all(-math.inf < lo <= hi < math.inf for lo, hi in ranges.values()):
            return ranges
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        pass  # missing (prepared before), or damaged: read off the graphs again
    from .logit_bound import logit_range

    ranges = {name: r for name in (FP32_NAME, INT8_NAME)
              if (folder / name).is_file() and (r := logit_range(folder / name)) is not None}
    try:
        with atomic_write(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({k: list(v) for k, v in ranges.items()}))
    except OSError:
        pass  # computed again by the next process
    return ranges


def stderr_notice(line: str) -> None:
    """The default notice: part of one line on stderr (a line ends with a newline in ``line``).
    A windowed app (pythonw, a frozen GUI build) has no stderr: the notice is dropped, never an
    AttributeError in the app's first answer."""
    if sys.stderr is None:
        return
    sys.stderr.write(line)
    sys.stderr.flush()


@contextlib.contextmanager
def _prepare_lock(out: Path) -> Iterator[bool]:
    """Hold ``out/.prepare.lock``; yields whether it is a real lock (False: no locks here). A
    folder that `hybridllm models remove` deleted while this process waited is made again and
    locked anew: the build then writes into a live folder (it failed, writing into the deleted one)."""
    from .._locks import lock_exclusive
    from ..models.store import same_file

    while True:
        # without locks (Windows, some network mounts) per-pid temporary names keep concurrent
        # writers apart; closing the file releases the lock
        with _open_lock(out) as fh:
            locked = lock_exclusive(fh.fileno())
            if locked and not same_file(fh.fileno(), out / ".prepare.lock"):
                continue  # removed meanwhile: the lock is on a file no one else will open
            yield locked
            return


def _open_lock(out: Path) -> Any:
    try:
        out.mkdir(parents=True, exist_ok=True)
        return open(out / ".prepare.lock", "w")  # noqa: SIM115 - closed by the caller
    except OSError as exc:  # a read-only data dir: a ModelError, so the cache steps aside
        raise ModelError(
            f"Cannot write the cache model into {out} ({exc.strerror or exc}); point "
            "HYBRIDLLM_HOME at a writable folder, or run `hybridllm models prepare minilm-l6-v2` "
            "once with write access."
        ) from exc


def _prepare(
    out: Path, what: str, build: Callable[[Path], Any], *, source_dir: Path | None, notice: Notice | None
) -> Path:
    if is_prepared(out):
        return out
    say = notice or stderr_notice
    with _prepare_lock(out) as locked:
        if is_prepared(out):  # another process finished while this one waited
            return out
        if locked:  # no one else is writing: what a killed preparer left is removed (~120 MB each)
            remove_leftovers(out, _LEFTOVER)
        start = time.perf_counter()
        say(f"Preparing the semantic cache {what} (once) ...")
        try:
            _write_files(out, build, source_dir)
        except BaseException:
            say(" failed\n")
            raise
        say(f" done in {time.perf_counter() - start:.1f} s\n")
        return out


def _write_files(out: Path, build: Callable[[Path], Any], source_dir: Path | None) -> None:
    if source_dir is None:
        from ..models import pull

        source_dir = pull(EMBEDDER_ID)
    try:
        # each file under a temporary name (.NAME.*.tmp), fsynced and renamed into place once all
        # four are written; any error (Ctrl-C too) removes every temporary not yet renamed. Entered
        # last to first, they are renamed first to last: the recipe last, so is_prepared() only
        # turns true once every file is in place
        with contextlib.ExitStack() as files:
            tmp = {name: files.enter_context(replacing(out / name)) for name in reversed(_NAMES)}
            import onnx

            onnx.save(build(source_dir), str(tmp[FP32_NAME]))
            quantize(tmp[FP32_NAME], tmp[INT8_NAME])
            tmp[TOKENIZER_NAME].write_bytes((source_dir / TOKENIZER_NAME).read_bytes())
            tmp[RECIPE_NAME].write_text(RECIPE, encoding="utf-8")
            # a reranker's logit ranges were read off the graphs being replaced
            # (prepare_reranker reads them again)
            (out / LOGIT_RANGE_NAME).unlink(missing_ok=True)
    except ModelError:
        raise
    except Exception as exc:  # onnx / ONNX Runtime / file errors mapped at the boundary
        raise ModelError(f"Preparing the cache model in {out} failed: {exc}") from exc


class _DropQuantizerLogs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ONNX Runtime's quantizer logs through the root logger (``logging.warning``), which installs a
    stderr handler on a process that has none. Keep both its records and that handler out."""
    root = logging.getLogger()
    placeholder = logging.NullHandler() if not root.handlers else None
    if placeholder is not None:
        root.addHandler(placeholder)  # logging.warning() calls basicConfig() only with no handlers
    drop = _DropQuantizerLogs()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)
        if placeholder is not None:
            root.removeHandler(placeholder)


def quantize(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization of the weight MatMuls, per output channel, with uint8 weights."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The FFN down projections stay fp32: their inputs (GELU outputs) carry outliers that
    # per-tensor activation scales clip; keeping them lifts the worst int8-vs-fp32 cosine on QQP
    # questions from 0.989 to 0.993 (mean 0.997). MatMuls of two activations are not quantized.
    # Weights are uint8 (U8U8), not int8: x86 CPUs without VNNI (AVX2 only) multiply uint8
    # activations by int8 weights with vpmaddubsw, which sums each pair of products in int16 and
    # saturates (255*127*2 > 32767), so the same model gave other vectors on such a CPU (router
    # scores up to 0.064 apart). U8U8 kernels widen to int16 first and sum in int32: the integer
    # part is exact on every CPU. On 600 QQP questions on an AVX2-only CPU, cosine to fp32: mean
    # 0.9973, worst 0.9924 (signed weights there: 0.9965, 0.9892; 7-bit signed: 0.9968, 0.9889).
    graph = onnx.load(str(src), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    keep_fp32 = [
        node.name
        for node in graph.node
        if node.op_type == "MatMul"
        and ("/down/" in node.name or not any(name in weights for name in node.input))
    ]
    with _quiet_quantizer():
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QUInt8,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            nodes_to_exclude=keep_fp32,
        )
