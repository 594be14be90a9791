"""Tokenizers: llama.cpp's own vocabulary for GGUF files, ``tokenizers`` for HF folders.

Both expose ``encode(text, add_special=True)``, ``decode(ids)``, ``apply_chat_template(messages)``,
``encode_chat(messages)`` and ``eos_token_ids``. Chat templates come from the model's own metadata
(GGUF ``tokenizer.chat_template`` or ``tokenizer_config.json``) and are rendered with a sandboxed
Jinja; a model without one (a base model) gets a plain completion-style prompt.

``encode_chat`` is how a conversation becomes ids: only the template's own markers become control
tokens, a message's text is read as plain text (``hybridllm.prompts.tokenize_prompt``), so a user
cannot forge a turn by writing ``<|im_end|>``, nor get an added marker such as Qwen's ``<tool_call>``
as its one token. ``encode`` parses control tokens: it is for a raw completion prompt, which the
caller writes whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybridllm._chat_template import named_chat_template

# a SentencePiece byte-fallback token (<0xNN>) and the byte-level BPE alphabet, as the grammar core
# reads vocabularies (one table for both)
from hybridllm._structured._tokens import BYTE_PIECE as _BYTE_TOKEN
from hybridllm._structured._tokens import byte_level_alphabet as _byte_level_alphabet
from hybridllm.prompts import llama_bytes

from ..exceptions import InvalidRequestError, ModelLoadError


def completion_prompt(messages: list[dict]) -> str:
    """A prompt for base models, the same text the edge builds (``hybridllm.prompts``)."""
    return _prompt_format(None, "", "", None).render(messages)


def _prompt_format(template: str | None, bos: str, eos: str, system_prompt: str | None) -> Any:
    from hybridllm.prompts import PromptFormat

    return PromptFormat(chat_template=template, bos_token=bos, eos_token=eos,
                        system_prompt=system_prompt)


def _checked_prompt(text: str) -> str:
    """A raw prompt, or InvalidRequestError (400) when it holds a lone surrogate (JSON may carry
    half an emoji, "\\ud83d"), which cannot be encoded as UTF-8: refused as in a chat message."""
    from hybridllm._exceptions import InvalidRequestError as PromptError
    from hybridllm.prompts import checked_text

    try:
        return checked_text(text, "the prompt")
    except PromptError as exc:
        raise InvalidRequestError(str(exc), param="prompt") from exc


class _ChatTemplateMixin:
    """Prompts are built by ``hybridllm.prompts`` (shared with the edge). ``system_prompt`` is the
    default system prompt for a conversation without one (the model's catalog entry names it)."""

    chat_template: str | None
    bos_token: str
    eos_token: str
    bos_token_id: Any  # an int (GGUF: -1 for none), or None (a folder that names none)
    add_bos: bool
    system_prompt: str | None = None

    def prompt_format(self) -> Any:
        return _prompt_format(self.chat_template, self.bos_token, self.eos_token, self.system_prompt)

    def apply_chat_template(
        self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        from hybridllm._exceptions import InvalidRequestError as PromptError

        try:
            return self.prompt_format().render(messages, add_generation_prompt=add_generation_prompt,
                                               tools=tools)
        except PromptError as exc:
            raise InvalidRequestError(str(exc), param="messages") from exc

    def encode_chat(self, messages: list[dict], *, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        """The prompt ids of ``messages`` (and ``tools``, the function tools the template describes);
        control-token text inside a message or a tool stays plain text."""
        from hybridllm._exceptions import InvalidRequestError as PromptError
        from hybridllm.prompts import tokenize_prompt

        try:
            ids = tokenize_prompt(self.prompt_format(), messages, special_ids=self._special_ids(),
                                  encode_plain=self._encode_plain,
                                  add_generation_prompt=add_generation_prompt, tools=tools)
        except PromptError as exc:
            raise InvalidRequestError(str(exc), param="messages") from exc
        bos = self.bos_token_id
        if self.add_bos and bos is not None and bos >= 0 and ids[:1] != [bos]:
            ids.insert(0, bos)
        return ids

    def marker_bytes(self) -> dict[int, bytes]:
        """The template's markers (``structured_token_bytes`` None: never a grammar's token) and
        their text, which an answer's free text may show (Qwen's ``<tool_call>``): what the hold
        of an auto answer's tool calls reads to see a tagged call begin."""
        return {i: name.encode() for name, i in self._special_ids().items()}

    def _special_ids(self) -> dict[str, int]:
        raise NotImplementedError

    def _encode_plain(self, text: str) -> list[int]:
        raise NotImplementedError

    def stop_strings(self, messages: list[dict]) -> tuple[str, ...]:
        """Stop strings the prompt format needs (a base model must not write the user's turn)."""
        return tuple(self.prompt_format().stops(messages))


class GGUFTokenizer(_ChatTemplateMixin):
    """llama.cpp's vocabulary (``vocab_only=True``): token ids match the edge model exactly."""

    def __init__(self, path: str | Path) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:  # pragma: no cover
            raise ModelLoadError("GGUF tokenizers need llama-cpp-python") from exc
        from hybridllm.backends.llama_cpp_load import _route_llama_logs, load_reasons

        # llama.cpp's lines (a vocabulary-only load warns of a "training context overflow": it has
        # no training context) go to a DEBUG logger, and the load leaves stdout and stderr alone:
        # the server answers /health and logs on other threads meanwhile
        _route_llama_logs()
        with load_reasons() as reasons:
            try:
                self._llama = Llama(model_path=str(path), vocab_only=True, verbose=False)
            except (ValueError, RuntimeError) as exc:
                why = f"{exc}: {reasons[-1]}" if reasons else str(exc)
                raise ModelLoadError(f"llama.cpp cannot read the vocabulary of {path}: {why}") from exc
        meta: dict[str, Any] = self._llama.metadata
        self.chat_template = meta.get("tokenizer.chat_template")
        self.bos_token_id = self._llama.token_bos()
        self.vocab_size = self._llama.n_vocab()
        self.bos_token = self._piece(self.bos_token_id)
        self.eos_token = self._piece(self._llama.token_eos())
        self.add_bos = str(meta.get("tokenizer.ggml.add_bos_token", "false")).lower() == "true"
        ids = {self._llama.token_eos()}
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if key in meta:
                ids.add(int(meta[key]))
        self.eos_token_ids = sorted(i for i in ids if 0 <= i < self.vocab_size)
        self._plain: tuple[dict[str, int], Any] | None = None

    def _piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            return ""
        return llama_bytes(self._llama, [token_id], special=True).decode("utf-8", errors="replace")

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        ids = self._llama.tokenize(_checked_prompt(text).encode("utf-8"), add_bos=False, special=True)
        if add_special and self.add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def _plain_pair(self) -> tuple[dict[str, int], Any]:
        if self._plain is None:  # one pass over the vocabulary, on first use
            from hybridllm.prompts import llama_plain

            self._plain = llama_plain(self._llama)
        return self._plain

    def _special_ids(self) -> dict[str, int]:
        return self._plain_pair()[0]

    def _encode_plain(self, text: str) -> list[int]:
        return list(self._plain_pair()[1](text))

    def decode(self, ids: list[int]) -> str:
        return self._bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (part of a character for some tokens), as ``decode`` reads them."""
        return self._bytes([token_id])

    def structured_token_bytes(self) -> list[bytes | None]:
        """Per id, the bytes the token adds to an answer's text; None for a marker (control)
        token: what ``response_format``'s token index reads (engine/structured.py)."""
        markers = set(self._special_ids().values())
        return [None if i in markers else self._bytes([i]) or None for i in range(self.vocab_size)]

    def _bytes(self, ids: list[int]) -> bytes:
        # An id outside the vocabulary (an output head wider than the token list, an id given by a
        # caller) is nothing, as in ``tokenizers``: llama.cpp would abort the whole process on it.
        n = self.vocab_size
        return llama_bytes(self._llama, [i for i in ids if 0 <= i < n])


class HFTokenizer(_ChatTemplateMixin):
    """A Hugging Face folder's ``tokenizer.json`` (+ ``tokenizer_config.json``)."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file():
            raise ModelLoadError(_no_tokenizer(folder))
        try:
            self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise ModelLoadError(f"cannot read {folder / 'tokenizer.json'}: {exc}") from exc
        from hybridllm.prompts import tokenizers_plain

        self._specials, self._plain = tokenizers_plain(folder / "tokenizer.json")
        cfg = read_json_object(folder / "tokenizer_config.json")
        gen = read_json_object(folder / "generation_config.json")
        self.chat_template = _chat_template(folder, cfg)
        self.bos_token = _token_text(cfg.get("bos_token")) or ""
        self.eos_token = _token_text(cfg.get("eos_token")) or ""
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.add_bos = self.bos_token_id is not None and _adds_bos(self._tok, cfg, self.bos_token_id)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids: set[int] = set()
        eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        if eos_id is not None:
            ids.add(eos_id)
        # the stop ids of generation_config.json, else config.json's (as transformers and vLLM take
        # them): Llama 3.1 lists <|eot_id|> and <|eom_id|> beside the tokenizer's one eos
        source = "generation_config.json" if "eos_token_id" in gen else "config.json"
        ids.update(_token_ids(gen if "eos_token_id" in gen else read_json_object(folder / source),
                              "eos_token_id", folder / source))
        self.eos_token_ids = sorted(ids)
        decoder = json.loads(self._tok.decoder.__getstate__()) if self._tok.decoder is not None else {}
        self._byte_level = '"ByteLevel"' in json.dumps(decoder)  # alone or in a decoder Sequence
        # A lone token is decoded after these ids (a plain "a"), then cut off them: decoders that
        # strip the text's leading space (SentencePiece's Strip and Metaspace: "▁a" alone is "a")
        # would strip the token's own. None where "a" needs byte tokens (a byte token after them
        # would join their run) or its text is not "a".
        head = self._tok.encode("a", add_special_tokens=False).ids
        pieces = [self._tok.id_to_token(i) or "" for i in head]
        self._head = head if head and self.decode(head) == "a" and not any(
            _BYTE_TOKEN.fullmatch(p) for p in pieces) else None

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        ids = self._tok.encode(_checked_prompt(text), add_special_tokens=False).ids
        bos = self.bos_token_id
        if add_special and self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def decode_continuation(self, ids: list[int]) -> str:
        """``ids`` as they read after other text (above): an answer after its prompt, where a
        SentencePiece decoder's strip of the leading space does not apply ("▁Paris" is " Paris",
        as in the decode of prompt + answer). The engine's detokenizer and text offsets use it."""
        if self._head is not None and ids:
            text = self.decode([*self._head, *ids])
            if text.startswith("a"):  # the head's text
                return text[1:]
        return self.decode(ids)

    def _lone_text(self, token_id: int) -> str:
        """The token's text as it reads after other text, so a text's tokens join to it."""
        return self.decode_continuation([token_id])

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes: its text after other text (``_lone_text``), except for a token
        that is only part of a character (decoded it is U+FFFD), whose raw bytes come from its
        vocabulary entry: a ``<0xNN>`` byte token, or a byte-level BPE piece read back through the
        byte alphabet."""
        text = self._lone_text(token_id)
        if "\ufffd" not in text:
            return text.encode("utf-8")
        piece = self._tok.id_to_token(token_id) or ""
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        alphabet = _byte_level_alphabet()
        if self._byte_level and all(c in alphabet for c in piece):
            return bytes(alphabet[c] for c in piece)
        return text.encode("utf-8")

    def structured_token_bytes(self) -> list[bytes | None]:
        """Per id, the bytes the token adds to an answer's text (None for a special token), by
        the grammar core's reading of ``tokenizers`` vocabularies; the template's other markers
        (Qwen's unflagged ``<tool_call>``) are None too."""
        from hybridllm._structured import token_bytes_from_tokenizer

        out = list(token_bytes_from_tokenizer(self._tok))
        for i in self._specials.values():
            if 0 <= i < len(out):
                out[i] = None
        return out

    def _special_ids(self) -> dict[str, int]:
        return self._specials

    def _encode_plain(self, text: str) -> list[int]:
        return self._plain(text)


def _adds_bos(tok: Any, cfg: dict, bos_id: int) -> bool:
    """Whether a raw prompt starts with BOS, as transformers and llama.cpp's GGUF conversion read
    a folder: tokenizer_config.json's ``add_bos_token`` where it names one; else what the
    tokenizer.json's post-processor prepends (``encode(add_special_tokens=True)``: Llama 3's adds
    <|begin_of_text|>, Qwen's ByteLevel one nothing); with no post-processor, a Llama tokenizer
    class adds it (LlamaTokenizerFast's default, as llama.cpp's for SentencePiece)."""
    if "add_bos_token" in cfg:
        return bool(cfg["add_bos_token"])
    if tok.post_processor is not None:
        return (tok.encode("a", add_special_tokens=True).ids[:1] == [bos_id]
                and tok.encode("a", add_special_tokens=False).ids[:1] != [bos_id])
    return str(cfg.get("tokenizer_class") or "").startswith(("LlamaTokenizer", "CodeLlamaTokenizer"))


def _no_tokenizer(folder: Path) -> str:
    """Why a folder without tokenizer.json cannot be served, and what to do (the tokenizer is
    read first, so a folder that is no model at all, a path one level off, is told so here)."""
    if not (folder / "config.json").is_file():
        return (f"{folder} is not a Hugging Face model folder (it has no config.json nor "
                "tokenizer.json): pass the folder that holds the model's config.json, "
                "tokenizer.json and *.safetensors files, or a .gguf file")
    return (f"{folder} has no tokenizer.json: download the model's tokenizer.json into it (it "
            "comes beside config.json in the model's repository)")


def read_json_object(path: Path) -> dict:
    """A JSON object file of a model folder (its configs, a shard index), {} when absent; a
    damaged one, or one that is not an object, is a ModelLoadError naming it."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _token_ids(data: dict, key: str, path: Path) -> list[int]:
    """``data[key]``: a token id, a list of them, or null."""
    value = data.get(key)
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ModelLoadError(f"{path}: {key} must be a token id or a list of them, got {value!r}")
    return values


def _chat_template(folder: Path, cfg: dict) -> str | None:
    """The chat template as transformers reads it: ``chat_template.jinja`` (how transformers
    saves it since 4.50) over ``tokenizer_config.json``'s, whose value may also be a list of named
    templates ({"name", "template"}): the one named "default" is the chat template."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (ValueError, OSError) as exc:
            raise ModelLoadError(f"cannot read {jinja}: {exc}") from exc
    try:
        return named_chat_template(cfg.get("chat_template"))
    except ValueError as exc:
        raise ModelLoadError(f"{folder / 'tokenizer_config.json'}: {exc}") from exc


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        return value.get("content")
    return value
