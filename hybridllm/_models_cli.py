"""`hybridllm models`: list, pull, path, verify, prepare and remove the catalog's models."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from ._cli_terminal import _note, _UsageError
from ._exceptions import HybridLLMError
from ._finite import finite_json
from ._progress import end_line


def _catalog_id(model_id: str) -> str:
    """The catalog's spelling of ``model_id``. These commands take catalog ids only: an unknown one
    (a .gguf path too) is refused without the "or pass the path to a local .gguf file" of the
    model-loading commands, which told `models path ./x.gguf` to do what it had just done."""
    from .models.remove import spec_of

    return spec_of(model_id).id


def cmd_models_list(args: argparse.Namespace) -> int:
    from .models.remove import disk_usage, human_size, linked_usage
    from .models.store import UNVERIFIED, load_catalog, pull_state

    rows: list[dict[str, Any]] = []
    for spec in load_catalog().values():
        size = spec.total_size
        state = pull_state(spec.id)
        rows.append({"id": spec.id, "kind": spec.kind, "architecture": spec.architecture,
                     "chat_format": spec.chat_format, "license": spec.license,
                     "size_mb": round(size / 1e6, 1) if size else None, "package": spec.package,
                     "pulled": state == "yes", "state": state, "disk_bytes": disk_usage(spec.id),
                     "linked_bytes": linked_usage(spec.id), "description": spec.description})
    if args.json:
        print(finite_json(rows, indent=2))  # a catalog's NaN size: null
        return 0
    w = max([len("ID"), *(len(str(r["id"])) for r in rows)]) + 2  # the longest id sets the column
    pw = len(UNVERIFIED) + 1
    print(f"{'ID':<{w}}{'KIND':<11}{'ARCH':<9}{'SIZE':>9}  {'PULLED':<{pw}}{'ON DISK':>10}  LICENSE")
    for r in rows:
        shown = f"{r['size_mb']} MB" if r["size_mb"] else "-"
        disk = human_size(r["disk_bytes"]) if r["disk_bytes"] else "-"
        print(f"{r['id']:<{w}}{r['kind']:<11}{r['architecture']:<9}{shown:>9}  "
              f"{r['state']:<{pw}}{disk:>10}  {r['license']}")
    total = sum(r["disk_bytes"] for r in rows)
    # the total's size sits under ON DISK; `hybridllm models remove ID` frees a model's share
    print(f"{'total':<{w}}{'on disk':<{11 + 9 + 9 + 2 + pw}}{human_size(total) if total else '-':>10}")
    linked = [f"{r['id']} ({human_size(r['linked_bytes'])})" for r in rows if r["linked_bytes"]]
    if linked:  # pulled as hard links to their packages' files: in ON DISK they would count twice
        _note(f"linked: {', '.join(linked)}: these files are their installed packages' own (hard "
              "links), so they take no space beyond the packages' and are not in ON DISK; "
              "`hybridllm models remove` frees them only once the package is uninstalled too.")
    unverified = [r["id"] for r in rows if r["state"] == UNVERIFIED]
    if unverified:  # a data dir copied from elsewhere: its files are there, just not hashed here yet
        _note(f"unverified: {', '.join(unverified)}: the files are in place (a data dir copied from "
              "elsewhere?) but not yet checked here against the catalog's sha256; `hybridllm models "
              "verify ID` checks one now, and its first use does too.")
    return 0


def cmd_models_remove(args: argparse.Namespace) -> int:
    from .models.remove import RemoveIncompleteError, disk_usage, human_size, plan, remove

    # in the catalog's spelling, so one model named twice (`rm gemma3-270m Gemma3-270M`) is removed
    # once, not reported a second time as "removed ...: 0 paths"; an unknown id is refused here,
    # before anything goes
    ids = list(dict.fromkeys(_catalog_id(mid) for mid in args.ids))
    plans = {mid: plan(mid) for mid in ids}
    for mid in ids:
        if not plans[mid]:
            print(f"{mid}: nothing on disk")
    todo = [mid for mid in ids if plans[mid]]
    if not todo:
        return 0
    if not args.yes:
        if not sys.stdin or not sys.stdin.isatty():
            raise _UsageError(f"not on a terminal, so nothing was asked or removed; pass --yes to "
                              f"remove {' '.join(todo)} without asking.")
        for mid in todo:
            for e in plans[mid]:
                print(f"  {e.path}  {human_size(e.bytes)}", file=sys.stderr)
        total = sum(e.bytes for mid in todo for e in plans[mid])
        count = sum(len(plans[mid]) for mid in todo)
        print(f"Remove {count} path(s) of {', '.join(todo)}, {human_size(total)}? [y/N] ",
              end="", file=sys.stderr, flush=True)
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:  # Ctrl-C at the question: `interrupted` on a line of its own
            print(file=sys.stderr)
            raise
        if not line.endswith("\n"):  # Ctrl-D (end of input) left the cursor after "[y/N] "
            print(file=sys.stderr)
        answer = line.strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed", file=sys.stderr)
            return 1
    failed = False
    for mid in todo:
        def waiting(mid: str = mid) -> None:
            print(f"waiting for a pull or prepare of {mid} in another process ...", file=sys.stderr)

        before = disk_usage(mid)
        try:
            gone = remove(mid, on_wait=waiting)
        except RemoveIncompleteError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        freed = before - disk_usage(mid)
        print(f"removed {mid}: {len(gone)} path{'s' if len(gone) != 1 else ''}, {human_size(freed)}")
    return 1 if failed else 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    from ._progress import ProgressBar
    from .models.store import pull

    mid = _catalog_id(args.id)
    path = pull(mid, progress=ProgressBar(f"Pulling {mid}"), force=args.force, on_wait=_waiting(mid))
    print(path)
    return 0


def _waiting(mid: str) -> Callable[[], None]:
    """The note for a pull that waits on another process's pull (a minute for 1.1 GB), so that it
    is not taken for a hang."""
    def note() -> None:
        end_line()  # a bar of files hashed before the wait ends its line first
        print(f"waiting for a pull, prepare or remove of {mid} in another process ...", file=sys.stderr)
    return note


def cmd_models_path(args: argparse.Namespace) -> int:
    from ._progress import ProgressBar
    from .models.store import pull

    mid = _catalog_id(args.id)
    print(pull(mid, progress=ProgressBar(f"Pulling {mid}"), on_wait=_waiting(mid)))
    return 0


def cmd_models_verify(args: argparse.Namespace) -> int:
    from ._progress import ProgressBar
    from .models.catalog import load_catalog
    from .models.store import verify

    ids = sorted(load_catalog()) if args.id is None else [_catalog_id(args.id)]  # "" is no id, not "all"
    results = []
    for mid in ids:
        # one bar per model, on a terminal only (hashing 1.1 GB takes a minute): a log gets the
        # results alone, and stdout stays the table
        bar = ProgressBar(f"Verifying {mid}") if sys.stderr.isatty() else None
        try:
            results += verify(mid, progress=bar)
        finally:  # cut short (Ctrl-C, an error): the line ends before what is printed next
            if bar is not None:
                bar.close()
    w = max([len("ID"), *(len(r.id) for r in results)]) + 2
    sw = max(len(r.status) for r in results) + 2 if results else 0
    for r in results:
        print(f"{r.id:<{w}}{r.status:<{sw}}{r.detail}")
    return _verify_status(results, named=args.id is not None)


def _verify_status(results: list[Any], *, named: bool) -> int:
    """The exit status, as `sha256sum -c` would give it: a model named is checked for use, so it
    fails unless it is there and intact (a `verify ID && run` never goes on without its model); all
    of them check what is on disk, like `sha256sum -c --ignore-missing`: a model never pulled is
    no failure, a corrupt or half-pulled one is."""
    if named:
        return 0 if all(r.status == "ok" for r in results) else 1
    return 1 if any(r.status in ("corrupt", "incomplete") for r in results) else 0


def _check_prepare_options(args: argparse.Namespace, spec: Any) -> None:
    """An option `prepare` would not use is a usage error, not dropped: `--precision int8` without
    --backend onnx pulled the GGUF and said nothing, and --force on a GGUF model did not copy it
    again (now it does, as `pull --force`) nor on the embedder rebuild anything (it still cannot)."""
    if args.precision is not None and args.backend != "onnx":
        raise _UsageError(f"--precision picks the ONNX weights: add --backend onnx (the llama_cpp "
                          f"form of {spec.id} is its GGUF file, as pulled).")
    if args.force and args.backend != "onnx" and spec.kind == "embedding":
        raise _UsageError(f"--force does not rebuild {spec.id}'s export; `hybridllm models remove "
                          f"{spec.id}` deletes it (with its files), and prepare then builds it anew.")


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from ._progress import ProgressBar
    from .models.catalog import get_spec

    spec = get_spec(_catalog_id(args.id))
    _check_prepare_options(args, spec)
    if args.backend == "onnx":
        from .models.onnx_prepare import cli_prepare
        from .models.onnx_store import DEFAULT_PRECISION

        return cli_prepare(spec.id, precision=args.precision or DEFAULT_PRECISION, force=args.force)
    if spec.kind != "embedding":
        from .models.store import pull

        print(pull(spec.id, progress=ProgressBar(f"Pulling {spec.id}"), force=args.force,
                   on_wait=_waiting(spec.id)))
        return 0
    try:
        from .cache._cli import prepare_embedder
    except ImportError as exc:
        raise HybridLLMError(f"The embedder export is not available in this install ({exc}).") from exc
    prepare_embedder(ProgressBar(f"Preparing {spec.id}"))
    return 0
