"""Reading a prepared ONNX folder: its prompt files, end-of-text tokens, context size, how to rebuild it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .._chat_template import named_chat_template
from .._exceptions import ConfigError, ModelCorruptError
from ..models.onnx_store import META_FILE, onnx_dir, prepare_command, read_meta

log = logging.getLogger("hybridllm.edge")


def _reprepare_hint(folder: Path, spec: Any, precision: str) -> str:
    """What to do about a broken prepared folder: the command that builds it again (and, for a
    folder copied elsewhere, where to copy the result)."""
    if spec is None:
        return (
            f"Prepare it again with `{prepare_command('ID')} --force` (ID: the catalog model it was "
            f"built from) and copy the folder it prints to {folder}, or rebuild it with the model "
            "builder."
        )
    try:
        precision = str(read_meta(folder).get("precision") or precision)
    except ModelCorruptError:
        pass
    command = f"`{prepare_command(spec.id, precision)} --force`"
    if folder.resolve() == onnx_dir(spec.id, precision).resolve():
        return f"Prepare it again with {command}."
    return f"Prepare it again with {command} and copy the folder it prints to {folder}."


def _trained_context(genai: dict[str, Any], folder: Path) -> int:
    """genai_config.json's ``model.context_length``: a whole number of tokens, 0 where it names none.
    Another value is a damaged folder (before: "2k" was a raw ValueError from int(), and -1 or
    true was taken, or silently passed over)."""
    value = genai.get("context_length")
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 2048.0: a whole number all the same
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelCorruptError(
            f"{folder / 'genai_config.json'}: model.context_length must be a whole number of tokens "
            f"(0 or more), not {value!r}.")
    return value


def _context_size(n_ctx: int, trained: int, folder: Path) -> int:
    """The context a request may fill, as on llama.cpp: n_ctx=0 is the model's own length, and an
    n_ctx past it is cut to it with a warning (before: n_ctx=0 refused every prompt)."""
    if n_ctx == 0:
        if trained <= 0:
            raise ConfigError(
                f"n_ctx=0 asks for the model's own context length, and {folder / 'genai_config.json'} "
                "names none (model.context_length): pass n_ctx, a whole number of tokens.")
        return trained
    if 0 < trained < n_ctx:
        log.warning("n_ctx=%d is more than %s was built for (%d tokens); its context is %d",
                    n_ctx, folder.name, trained, trained)
        return trained
    return n_ctx


# the token texts llama.cpp's vocabulary loader marks end-of-generation by name (llama-vocab.cpp)
_EOG_NAMES = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>",
    "_<EOT>", "<|end\u2581of\u2581sentence|>", "<end_of_utterance>", "<|end_of_text|>",
    # and the fill-in-the-middle pad, repo and file-separator tokens it finds by name, which it ends
    # on too: SmolLM2's <reponame>, Qwen2.5-Coder's <|fim_pad|>, <|repo_name|> and <|file_sep|>
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
})


def _named_eog_ids(folder: Path) -> set[int]:
    """Ids of the added tokens in ``folder``'s tokenizer.json named in :data:`_EOG_NAMES`, whether
    or not marked special: llama.cpp goes by the text alone, and Qwen's tokenizer.json marks its
    fill-in-the-middle tokens not special (ONNX wrote on past <|file_sep|> where llama.cpp stopped)."""
    try:
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
        return {int(t["id"]) for t in added if t.get("content") in _EOG_NAMES}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return set()


def _prompt_files(folder: Path, meta: dict[str, Any]) -> tuple[str | None, str, str, bool]:
    """(chat template, BOS text, EOS text, add BOS) from our record, else the builder's files.

    The chat template as transformers (and the cloud server) reads it: ``chat_template.jinja`` over
    the one in our record or ``tokenizer_config.json``, which may also be a list of named templates
    ({"name", "template"}) whose "default" is the chat template. A file that cannot be read is a
    :class:`ModelCorruptError` (before: ignored, and the folder's prompt format silently lost)."""
    tok_config: dict[str, Any] = {}
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            tok_config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ModelCorruptError(f"{path} is unreadable ({exc}).") from exc
        if not isinstance(tok_config, dict):
            raise ModelCorruptError(f"{path} must hold a JSON object, not a {type(tok_config).__name__}.")
    jinja = folder / "chat_template.jinja"
    template: str | None
    if jinja.is_file():
        try:
            template = jinja.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise ModelCorruptError(f"{jinja} is unreadable ({exc}).") from exc
    else:
        template = (_named_template(meta.get("chat_template"), folder / META_FILE)
                    or _named_template(tok_config.get("chat_template"), path))

    def text(key: str) -> str:
        value = meta.get(key) or tok_config.get(key) or ""
        return str(value.get("content", "")) if isinstance(value, dict) else str(value)

    add_bos = bool(meta.get("add_bos_token", tok_config.get("add_bos_token", False)))
    return template or None, text("bos_token"), text("eos_token"), add_bos


def _named_template(template: Any, path: Path) -> str | None:
    """A ``chat_template`` value (``named_chat_template``) of the file at ``path``."""
    try:
        return named_chat_template(template)
    except ValueError as exc:
        raise ModelCorruptError(f"{path}: {exc}.") from exc


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: Any, pos: int, end: int) -> Any:
    """(field number, (start, end)) of each length-delimited field of the protobuf message in
    ``buf[pos:end]``; the other wire types are skipped."""
    while pos < end:
        tag, pos = _varint(buf, pos)
        kind = tag & 7
        if kind == 0:
            _, pos = _varint(buf, pos)
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        elif kind == 2:
            size, pos = _varint(buf, pos)
            yield tag >> 3, (pos, pos + size)
            pos += size
        else:
            raise ValueError(f"wire type {kind}")
    if pos != end:
        raise ValueError("truncated message")


def _graph_io(path: Path) -> tuple[set[str], set[str], set[str]] | None:
    """(inputs, inputs without an initializer, outputs) of the ONNX graph in ``path``, read from
    the protobuf's headers alone (a memory map: the weights are skipped, not read); None when the
    file cannot be parsed (ONNX Runtime's own load then says what is wrong with it)."""
    import mmap

    def name(buf: Any, span: tuple[int, int], field: int) -> str:
        for number, (a, b) in _fields(buf, *span):
            if number == field:
                return bytes(buf[a:b]).decode("utf-8")
        return ""

    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            inputs: set[str] = set()
            outputs: set[str] = set()
            weights: set[str] = set()
            for number, graph in _fields(buf, 0, len(buf)):
                if number != 7:  # ModelProto.graph
                    continue
                for field, span in _fields(buf, *graph):  # GraphProto: 5 initializer, 11 input, 12 output
                    if field == 5:
                        weights.add(name(buf, span, 8))  # TensorProto.name
                    elif field in (11, 12):
                        (inputs if field == 11 else outputs).add(name(buf, span, 1))  # ValueInfoProto.name
    except (OSError, ValueError, IndexError):
        return None
    return inputs, inputs - weights, outputs


def _check_graph_io(folder: Path) -> None:
    """Refuse a folder whose model.onnx does not take what ONNX Runtime GenAI will feed it.

    The runtime feeds the decoder the inputs genai_config.json names (``model.decoder.inputs``;
    input_ids, attention_mask and position_ids by default, each only where the graph has it) and
    reads the outputs it names; a graph of another exporter (KV inputs ``past.N.key`` where the
    config says ``past_key_values.N.key``, an input of its own) loaded, and then every request
    failed with the runtime's raw "Missing Input: past.0.value" or "Model output was not found".
    """
    try:
        decoder = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
        names, outs = decoder.get("inputs") or {}, decoder.get("outputs") or {}
        filename, layers = decoder.get("filename"), int(decoder.get("num_hidden_layers") or 0)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return  # the runtime's own load reports an unreadable config
    if not isinstance(filename, str) or "pipeline" in decoder or not isinstance(names, dict):
        return  # a pipeline of several graphs: not checked here
    graph = _graph_io(folder / filename)
    if graph is None or not isinstance(outs, dict):
        return
    inputs, required, outputs = graph

    def expand(key: str, table: dict[str, Any], default: str) -> list[str]:
        pattern = str(table.get(key, default))
        try:  # "past_key_values.%d.key": one name per layer
            return [pattern % i for i in range(layers)]
        except (TypeError, ValueError):
            return [pattern]

    if "past_names" in names:  # one KV tensor per layer (GPT-2 style)
        kv_in, kv_out = expand("past_names", names, ""), expand("present_names", outs, "present.%d")
    else:
        kv_in = expand("past_key_names", names, "past_key_values.%d.key") + expand(
            "past_value_names", names, "past_key_values.%d.value")
        kv_out = expand("present_key_names", outs, "present.%d.key") + expand(
            "present_value_names", outs, "present.%d.value")
    needed_in = [str(names.get("input_ids", "input_ids")), *kv_in]
    fed = {"input_ids", "attention_mask", "position_ids", *needed_in}
    for key, value in names.items():
        if isinstance(value, str):
            fed.update(expand(key, names, value))
    problems = []
    lacking = [n for n in needed_in if n not in inputs]
    if lacking:
        problems.append(f"lacks the inputs {_few(lacking)}")
    unfed = sorted(required - fed)
    if unfed:
        problems.append(f"takes inputs nothing feeds: {_few(unfed)}")
    lacking = [n for n in [str(outs.get("logits", "logits")), *kv_out] if n not in outputs]
    if lacking:
        problems.append(f"lacks the outputs {_few(lacking)}")
    if problems:
        raise ModelCorruptError(
            f"{folder / filename} does not match {folder / 'genai_config.json'}: the graph "
            f"{'; it '.join(problems)}. ONNX Runtime GenAI feeds the inputs the config names under "
            "model.decoder.inputs (input_ids, attention_mask and position_ids by default) and reads "
            "the outputs named under model.decoder.outputs; the folder must hold a model.onnx whose "
            "inputs and outputs are those (as ONNX Runtime GenAI's model builder writes them: "
            "input_ids, attention_mask, past_key_values.N.key/value; logits, present.N.key/value), "
            "or a genai_config.json that names the graph's own.")


def _few(names: list[str], most: int = 6) -> str:
    """``names`` for a message: the first ``most``, then how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
