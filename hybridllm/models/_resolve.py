"""Resolving a model argument for llama.cpp: a catalog id (pulled if needed) or a local .gguf path,
checked to be GGUF, and the store's own file given by its path checked as its id would be.

Split from ``store`` (its size); ``store.resolve_gguf`` is this ``resolve_gguf``. The store's helpers
are used through the module, so a test that patches ``store.pull`` or ``store.get_spec`` reaches here.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._exceptions import ModelCorruptError, ModelNotFoundError
from . import store
from ._tally import Progress
from .catalog import ModelSpec

GGUF_MAGIC = b"GGUF"


def check_gguf(path: Path) -> None:
    """Fail early, with a clear message, on a file that is not GGUF at all."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelNotFoundError(f"Cannot read model file {path}: {exc.strerror}.") from exc
    if magic != GGUF_MAGIC:
        raise ModelCorruptError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'). Pass a .gguf model "
            "file or a catalog id such as 'smollm2-135m-instruct' (see `hybridllm models list`)."
        )


def _check_stored(path: Path, spec: ModelSpec, progress: Progress | None) -> None:
    """The store's own file given by its path (what `models path` prints) gets the check its id
    gets: unchanged since verified, else hashed again; a damaged one is refused, never loaded."""
    dest = store.model_dir(spec) / spec.main_file.name
    try:
        if not os.path.samefile(path, dest):
            return  # a copy elsewhere is the user's file, as any other local .gguf
    except OSError:
        return
    if not (store._marker_ok(dest, spec.main_file.sha256) or store._adopt(dest, spec.main_file, progress)):
        fix = f"hybridllm models pull {spec.id} --force"
        if store.is_package_file(spec, spec.main_file, dest):  # a link: the package is damaged too
            fix = f"{spec.pip} --force-reinstall, then {fix}"
        raise ModelCorruptError(
            f"{path} does not match the catalog's sha256 for {spec.id!r} (damaged or changed since "
            f"it was pulled). Put it back with: {fix}"
        )


def resolve_gguf(
    model: str | os.PathLike[str], *, progress: Progress | None = None
) -> tuple[str, Path, ModelSpec | None]:
    """Map a catalog id or a local path to ``(model name, gguf path, catalog spec or None)``."""
    text = os.fspath(model)
    if text in store.load_catalog():
        spec = store.get_spec(text)
        if spec.kind != "gguf":
            raise ModelNotFoundError(f"{text!r} is an {spec.kind} model, not a chat model.")
        path = store.pull(text, progress=progress)
        return spec.id, path, spec
    path = Path(text).expanduser()
    if path.is_file():
        check_gguf(path)
        size = path.stat().st_size
        for spec in store.load_catalog().values():  # a catalog file given by path keeps its settings
            main = spec.main_file
            if spec.kind == "gguf" and main.name == path.name and main.size in (None, size):
                _check_stored(path, spec, progress)
                return spec.id, path, spec
        return path.stem, path, None
    if text.strip() and path.is_dir():  # a model's folder (a Hugging Face snapshot): not a file
        found = sorted(p.name for p in path.glob("*.gguf") if p.is_file())
        inside = (
            f"it holds {', '.join(found[:5])}{' and more' if len(found) > 5 else ''}"
            if found
            else "it holds no .gguf file"
        )
        raise ModelNotFoundError(
            f"{path} is a folder, not a .gguf file ({inside}). For llama.cpp pass the .gguf file "
            "inside it, or a catalog id (see `hybridllm models list`)."
        )
    if text.strip() and path.exists():  # a device, a pipe, a socket
        raise ModelNotFoundError(f"{path} is not a regular file; pass a .gguf model file.")
    if path.suffix == ".gguf" or os.sep in text:
        raise ModelNotFoundError(f"Model file {path} does not exist.")
    # a catalog id in another case or with spaces around it; else ModelNotFoundError listing the ids
    return resolve_gguf(store.get_spec(text).id, progress=progress)
