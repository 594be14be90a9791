"""Where a prepared ONNX Runtime GenAI model lives, and how the edge backend finds it (run time).

``hybridllm models prepare ID --backend onnx`` writes one folder per catalog model and precision:

    <data dir>/models/<id>/onnx-<precision>-cpu/
        genai_config.json  model.onnx  model.onnx.data  tokenizer.json  tokenizer_config.json
        chat_template.jinja  hybridllm.json   (our record: source sha256, quantization, prompt)

The folder is complete once it exists (it is built under a temporary name and renamed), and it is
self-contained: copy it to another machine or into a mobile app and point ONNX Runtime GenAI at it.
Nothing here imports the exporter; building is :mod:`hybridllm.models.onnx_prepare`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from .._exceptions import ModelCorruptError, ModelNotFoundError
from .._paths import data_dir
from .catalog import ModelSpec, did_you_mean, find_spec, get_spec, load_catalog
from .store import Progress

META_FILE = "hybridllm.json"
FORMAT_VERSION = 2  # 2: int4 weights are the GGUF's own blocks
PRECISIONS = ("int4", "int8", "fp32")
DEFAULT_PRECISION = "int4"
# what the preparation imports besides the runtime: the GGUF reader and dequantizer (torch, gguf,
# safetensors) and ONNX Runtime GenAI's model builder (torch, transformers, onnx_ir)
EXPORT_MODULES = ("torch", "transformers", "onnx_ir", "gguf", "safetensors", "onnxruntime_genai")


def onnx_dir(model_id: str, precision: str = DEFAULT_PRECISION) -> Path:
    return data_dir() / "models" / model_id / f"onnx-{precision}-cpu"


def read_meta(folder: Path) -> dict[str, Any]:
    """Our record in a prepared folder; {} for a folder someone built with the builder directly."""
    path = folder / META_FILE
    if not path.is_file():
        return {}
    try:  # utf-8 as written: the locale's codec (cp1252, C) garbled or refused non-ASCII text
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ModelCorruptError(f"{path} is unreadable ({exc}); prepare the model again.") from exc
    if not isinstance(meta, dict):  # damaged as much as bad JSON (before: read as {}, silently)
        raise ModelCorruptError(
            f"{path} must hold a JSON object, not a {type(meta).__name__}; prepare the model again.")
    return meta


def is_prepared(folder: Path, spec: ModelSpec | None = None) -> bool:
    """A finished folder whose record matches this catalog model's weights and our format."""
    if not (folder / "genai_config.json").is_file():
        return False
    meta = read_meta(folder)
    if spec is None:
        return True
    return meta.get("format_version") == FORMAT_VERSION and meta.get("source_sha256") == spec.main_file.sha256


def _stale(meta: dict[str, Any], spec: ModelSpec) -> str:
    """Why a folder's record does not match (before: "is not in FOLDER", for a folder right there)."""
    if meta.get("format_version") != FORMAT_VERSION:
        return (f"format {meta.get('format_version', 'unknown')}, from another hybridllm version; "
                f"this one reads format {FORMAT_VERSION}")
    return (f"built from weights with sha256 {str(meta.get('source_sha256'))[:12]}..., not the "
            f"catalog's {spec.main_file.sha256[:12]}...")


def missing_export_modules() -> list[str]:
    return [m for m in EXPORT_MODULES if importlib.util.find_spec(m) is None]


def prepare_command(model_id: str, precision: str = DEFAULT_PRECISION) -> str:
    extra = "" if precision == DEFAULT_PRECISION else f" --precision {precision}"
    return f"hybridllm models prepare {model_id} --backend onnx{extra}"


def resolve_onnx(
    model: str | os.PathLike[str],
    *,
    precision: str = DEFAULT_PRECISION,
    progress: Progress | None = None,
    prepare: bool = True,
) -> tuple[str, Path, ModelSpec | None]:
    """Map a catalog id or a prepared folder to ``(model name, folder, catalog spec or None)``.

    A catalog model that is not prepared yet is built on the spot when the export extra is
    installed (once; later calls find the folder); otherwise the error says how to prepare it
    elsewhere and where to copy the folder.
    """
    if precision not in PRECISIONS:
        raise ModelNotFoundError(f"ONNX precision must be one of {PRECISIONS}, got {precision!r}.")
    text = os.fspath(model)
    if text in load_catalog():
        spec = get_spec(text)
        if spec.kind != "gguf":
            raise ModelNotFoundError(f"{text!r} is an {spec.kind} model, not a chat model.")
        folder = onnx_dir(spec.id, precision)
        try:
            if is_prepared(folder, spec):
                return spec.id, folder, spec
        except ModelCorruptError as exc:  # a damaged record: built again here, as `models prepare` does
            if not prepare or missing_export_modules():
                raise ModelCorruptError(f"{exc} (`{prepare_command(spec.id, precision)} --force`)") from exc
        missing = missing_export_modules()
        if not prepare or missing:
            why = (
                f"this install lacks {', '.join(missing)} (the [export] extra)"
                if missing
                else "it has not been prepared"
            )
            where = f"is not in {folder}"
            if (folder / "genai_config.json").is_file():  # there, from another version or other weights
                where = f"in {folder} is out of date ({_stale(read_meta(folder), spec)})"
            raise ModelNotFoundError(
                f"The ONNX form of {spec.id!r} {where}, and {why}. Prepare it once on a "
                f"machine with `pip install 'hybridllm[export]'`: `{prepare_command(spec.id, precision)}`"
                f", then copy the folder it prints to {folder} (or pass that folder as the model)."
            )
        from .._progress import ProgressBar
        from .onnx_prepare import build_bar, prepare_onnx

        if isinstance(progress, ProgressBar):  # the caller's bar counts MB; the build, percent
            progress = build_bar(progress, precision)
        return spec.id, prepare_onnx(spec.id, precision=precision, progress=progress), spec
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "genai_config.json").is_file():
            raise ModelNotFoundError(
                f"{path} is not a prepared ONNX model (no genai_config.json); prepare one with "
                f"`{prepare_command('ID')}`."
            )
        meta = read_meta(path)
        mid = meta.get("model_id")
        found = find_spec(mid) if isinstance(mid, str) else None
        return (found.id if found else path.name), path, found
    if path.suffix == ".gguf" or os.sep in text:
        raise ModelNotFoundError(
            f"The ONNX backend takes a catalog id or a prepared folder, not {path}; "
            "a .gguf file runs on the llama.cpp backend."
        )
    named = find_spec(text)  # a catalog id in another case or with spaces around it, as on llama.cpp
    if named is not None:
        return resolve_onnx(named.id, precision=precision, progress=progress, prepare=prepare)
    # not get_spec's error: its hint (a local .gguf file) is the llama.cpp backend's
    raise ModelNotFoundError(
        f"Unknown model {text!r}: neither a catalog id ({', '.join(sorted(load_catalog()))}) nor a "
        f"prepared ONNX folder. See `hybridllm models list`; prepare one with `{prepare_command('ID')}`."
        f"{did_you_mean(text)}"
    )
