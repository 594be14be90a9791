"""The engine's weight cache: a GGUF converted to int8 (or int4) once, read back on every later start.

Converting a Q4_K GGUF (dequantize, then quantize rows to int8) is most of a CPU server's start-up
(about two minutes for Qwen2.5-Coder-1.5B on two cores); reading the converted tensors back from a
safetensors file takes seconds. One file per (GGUF, quantization, dtype) lives in
``<data dir>/engine-weights/``; its name carries a key of the GGUF's path, size and mtime, so an
edited or replaced GGUF is converted again and the stale file is removed. A corrupt or unreadable
file is logged, deleted and rebuilt; a cache that cannot be written (disk full, read-only) is
logged and the server starts anyway. ``HYBRIDLLM_ENGINE_WEIGHT_CACHE=0`` turns it off.

A file is written in a folder of its own, ``.{name}.{pid}.tmp``, locked (``flock``) while it is
written, flushed to the disk (``fsync``) and renamed into place when complete. The folder is
removed on every way out: an error, an exception, the interpreter's exit, and
``remove_partial_files()`` before an ``os._exit`` (a server shut down while loading). One left by
a process that was killed is removed by the next write: its lock went with its process, so a
folder that can be locked has no writer (the lock holds across containers sharing the folder,
where a pid would not say whether its process lives).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import hashlib
import logging
import math
import os
import re
import shutil
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridllm._files import fsync_file, fsync_folder

# the format and header reading are the model store's too (`models list` / `remove` find a model's
# converted weights by the source their header records, without torch)
from hybridllm.models.engine_weights import FOLDER, FORMAT
from hybridllm.models.engine_weights import read_header as _read_header
from hybridllm.models.engine_weights import read_metadata as _read_metadata

from .finite import all_finite

try:
    import fcntl
except ImportError:  # Windows: no flock; partial folders of other processes are left alone
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

VERSION = "2"  # bump when convert_weights changes what it produces
_Q, _Q4, _SCALE = "#int8", "#int4", "#scale"  # suffixes of a quantized matrix's two tensors


def _enabled_by_env() -> bool:
    return os.environ.get("HYBRIDLLM_ENGINE_WEIGHT_CACHE", "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}


def _read_safetensors(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a safetensors file, read tensor by tensor into memory of torch's own
    allocation: no mapping of the file (its pages would count in the process's memory beside the
    copies, 1.6 GB more at the peak for the 1.5B) and aligned rows (torch's int8 kernel crashed on
    a row 24 bytes past a 64-byte boundary of a mapped file)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header = _read_header(fh, size)
        start = fh.tell()
        meta = header.pop("__metadata__", None) or {}
        tensors: dict[str, torch.Tensor] = {}
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = _DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            shape = [int(d) for d in info["shape"]]
            nbytes = math.prod(shape) * dtype.itemsize  # checked before anything is allocated
            if min(shape, default=0) < 0 or end - begin != nbytes or begin < 0 or start + end > size:
                raise ValueError(f"{name}: {end - begin} bytes at {begin} for {nbytes}")
            t = torch.empty(shape, dtype=dtype)
            fh.seek(start + begin)
            buf = t.reshape(-1).view(torch.uint8).numpy()  # the tensor's own bytes
            if nbytes and fh.readinto(buf.data) != nbytes:
                raise ValueError(f"{name}: short read")
            tensors[name] = t
    return meta, tensors


@dataclass(frozen=True)
class WeightCache:
    file: Path
    key: str
    source: str = ""  # the GGUF's resolved path: a same-named GGUF elsewhere has its own file

    @classmethod
    def for_model(
        cls,
        gguf: Path,
        *,
        device: torch.device,
        dtype: torch.dtype,
        quantization: str,
        enabled: bool | None = None,
        root: Path | None = None,
    ) -> WeightCache | None:
        """The cache entry of this conversion, or None where nothing is cached.

        Only the slow conversion is cached: int8 or int4 on the CPU (fp32 copies would be 4x the
        GGUF). int4 codes are kept two per byte in row order, not in torch's CPU packing.
        """
        if enabled is None:
            enabled = _enabled_by_env()
        if not enabled or quantization not in ("int8", "int4") or device.type != "cpu":
            return None
        try:
            st = gguf.stat()
            if root is None:
                from hybridllm._paths import data_dir

                root = data_dir() / FOLDER
        except (OSError, ImportError) as exc:
            logger.warning("engine weight cache off: %s", exc)
            return None
        dtype_name = str(dtype).removeprefix("torch.")
        ident = f"{VERSION}|{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{quantization}|{dtype_name}"
        key = hashlib.sha256(ident.encode()).hexdigest()[:16]
        return cls(root / f"{gguf.stem}.{quantization}-{dtype_name}.{key}.safetensors", key,
                   str(gguf.resolve()))

    def read(self) -> dict[str, Any] | None:
        """The converted weights, or None (absent, or corrupt: then the file is removed)."""
        if not self.file.is_file():
            return None
        try:
            meta, flat = _read_safetensors(self.file)
            if meta.get("format") != FORMAT or meta.get("key") != self.key:
                raise ValueError(f"written for another model or version ({meta.get('key')})")
            weights: dict[str, Any] = {}
            for name, t in flat.items():
                # what was written had been checked, but no checksum covers the bytes since: a
                # NaN scale or norm here is a damaged file (its float part is small, its codes
                # integers: the check costs little)
                if not all_finite(t):
                    raise ValueError(f"{name} holds a NaN or inf")
                if name.endswith((_Q, _Q4)):
                    base = name[: -len(_Q)]
                    weights[base] = (t, flat[base + _SCALE])  # KeyError: a matrix without scales
                elif not name.endswith(_SCALE):
                    weights[name] = t
        except Exception as exc:  # a damaged file: a bad header, offsets or sizes, a short read
            logger.warning("engine weight cache %s is unreadable (%s); converting again", self.file, exc)
            with contextlib.suppress(OSError):  # a read-only cache: converted again, never fatal
                self.file.unlink(missing_ok=True)
            return None
        logger.info("engine weights read from %s", self.file)
        return weights

    def write(self, weights: dict[str, Any]) -> None:
        """Write atomically (temporary file, then rename); a failure is logged, never raised."""
        from safetensors.torch import save_file

        flat: dict[str, torch.Tensor] = {}
        for name, t in weights.items():
            if isinstance(t, tuple):
                suffix = _Q4 if t[0].dtype == torch.uint8 else _Q
                flat[name + suffix], flat[name + _SCALE] = t[0].contiguous(), t[1].contiguous()
            else:
                flat[name] = t.contiguous()
        size = sum(t.numel() * t.element_size() for t in flat.values())
        work = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            sweep_partial_files(self.file.parent)
            free = shutil.disk_usage(self.file.parent).free
            if free < size * 1.1:
                raise OSError(f"{free >> 20} MiB free, {size >> 20} MiB needed")
            # not _files.replacing: the temporary lives in a folder of its own, locked from its
            # creation to its removal (how a sweep of another process tells a live write) and
            # removed by remove_partial_files() before an os._exit; the same fsyncs around the rename
            with _partial(work) as tmp:
                save_file(flat, str(tmp), metadata={"format": FORMAT, "key": self.key, "source": self.source})
                # its data on disk before its name: a power cut must not leave a named file of zeros
                fsync_file(tmp)
                os.replace(tmp, self.file)
                fsync_folder(self.file.parent)
        except Exception as exc:
            logger.warning(
                "engine weight cache not written to %s (%s); the next start converts again", self.file, exc
            )
            return
        stem = self.file.name.rsplit(".", 2)[0]  # the same model and conversion, an older key
        for old in self.file.parent.glob(f"{glob.escape(stem)}.*.safetensors"):
            if old != self.file and self._same_source(old):
                old.unlink(missing_ok=True)
        logger.info("engine weights cached in %s (%d MiB)", self.file, size >> 20)

    def _same_source(self, other: Path) -> bool:
        """Whether ``other`` is stale: converted from this GGUF (an older version of it), from one
        that is gone (moved), or by an older release (no source recorded); not from a GGUF of the
        same name in another folder, which another server may be using."""
        try:
            source = _read_metadata(other).get("source")
        except (OSError, ValueError, AttributeError, struct.error):
            return True  # unreadable: no use to anyone
        return source in (None, self.source) or not os.path.exists(source)


# Folders being written by this process, removed by remove_partial_files() (on exit, or by hand
# before an os._exit, which skips every cleanup)
_writing: set[Path] = set()
_writing_lock = threading.Lock()
_PARTIAL = re.compile(r"^\..+\.(\d+)\.tmp$")


@contextlib.contextmanager
def _partial(work: Path) -> Iterator[Path]:
    """A locked folder of this write at ``work``; the file to write in it. Removed on the way out,
    whatever the way."""
    shutil.rmtree(work, ignore_errors=True)  # this pid's own, from a write that failed before
    work.mkdir()
    with _writing_lock:
        _writing.add(work)
    fd = os.open(work, os.O_RDONLY) if fcntl is not None else None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield work / "weights.safetensors"
    finally:
        shutil.rmtree(work, ignore_errors=True)  # before the lock goes: never unlocked and present
        if fd is not None:
            os.close(fd)
        with _writing_lock:
            _writing.discard(work)


def remove_partial_files() -> None:
    """Remove what this process is writing now (the writer, if it goes on, fails and logs it)."""
    with _writing_lock:
        works = list(_writing)
    for work in works:
        shutil.rmtree(work, ignore_errors=True)


atexit.register(remove_partial_files)


def sweep_partial_files(folder: Path) -> None:
    """Remove the partial files of writers that are gone: a folder whose lock can be taken (its
    writer's lock went with its process), and a plain ``.tmp`` file, as older versions wrote, whose
    pid is not a live process. Never this process's own, nor one another writer still holds."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _PARTIAL.match(entry.name)
        if match is None or int(match[1]) == os.getpid():
            continue
        try:
            if entry.is_dir():
                _remove_if_unlocked(entry)
            elif not _pid_alive(int(match[1])):
                entry.unlink()
            else:
                continue
        except OSError as exc:
            logger.debug("partial weight cache file %s left (%s)", entry, exc)
            continue
        logger.info("removed %s, left by a process that ended while writing it", entry)


def _remove_if_unlocked(work: Path) -> None:
    if fcntl is None:
        raise OSError("no flock here to tell whether it is being written")
    fd = os.open(work, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError("being written") from None
        if os.stat(work).st_ino != os.fstat(fd).st_ino:  # removed and made again meanwhile
            raise OSError("made again")
        shutil.rmtree(work)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill would end the process there
        return True
    try:
        os.kill(pid, 0)  # signal 0: only "does it exist"
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): alive
        return True
    return True
