"""A timing twin of a GGUF: the same metadata, tokenizer and tensor shapes, random F16 weights.

    python -m bench.gguf_twin meta SRC.gguf META.json.gz    # a few MB: what the twin needs
    python -m bench.gguf_twin write META.json.gz OUT.gguf   # on the machine that times it

Decode time does not depend on the weights' values, so where a model file cannot be copied to a
machine (a GPU host reached through a small upload), its twin times the same shapes there
(``bench.engine_steps --model OUT.gguf``). Norm weights are 1, other tensors N(0, 0.02); the
twin's answers are noise, so time it, never judge its text or its speculative acceptance.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from typing import Any


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def extract(src: str, out: str) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(src)
    kv = [(key, _plain(f.contents()), [int(t) for t in f.types]) for key, f in reader.fields.items()
          if not key.startswith("GGUF.") and key != "general.architecture"]
    tensors = [(t.name, [int(x) for x in t.shape]) for t in reader.tensors]
    meta = {"arch": reader.fields["general.architecture"].contents(), "kv": kv, "tensors": tensors}
    with gzip.open(out, "wt") as f:
        json.dump(meta, f)
    print(f"{out}: {len(kv)} metadata keys, {len(tensors)} tensors, "
          f"{sum(math.prod(s) for _, s in tensors) / 1e9:.2f}B weights")


def write(meta_path: str, out: str) -> None:
    import numpy as np
    from gguf import GGUFValueType, GGUFWriter

    with gzip.open(meta_path, "rt") as f:
        meta = json.load(f)
    writer = GGUFWriter(out, meta["arch"])
    for key, value, types in meta["kv"]:
        kind = GGUFValueType(types[0])
        sub = GGUFValueType(types[-1]) if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, kind, sub_type=sub)
    rng = np.random.default_rng(0)
    for name, ne in meta["tensors"]:
        shape = tuple(reversed(ne))  # GGUF lists the fastest-varying dimension first
        if name.endswith("norm.weight"):
            arr = np.ones(shape, dtype=np.float32)
        elif len(shape) == 1:  # biases
            arr = rng.standard_normal(shape, dtype=np.float32) * 0.02
        else:
            arr = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("meta", help="save a GGUF's metadata and tensor shapes")
    m.add_argument("src", help="the GGUF file")
    m.add_argument("out", help="metadata file to write (.json.gz)")
    w = sub.add_parser("write", help="write the random-weight twin")
    w.add_argument("meta", help="metadata file from meta")
    w.add_argument("out", help="GGUF file to write")
    args = ap.parse_args(argv)
    if args.cmd == "meta":
        extract(args.src, args.out)
    else:
        write(args.meta, args.out)


if __name__ == "__main__":
    main()
