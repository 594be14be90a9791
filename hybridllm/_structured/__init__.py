"""Structured output: OpenAI's ``response_format`` (``json_object``, ``json_schema``) as a grammar
that masks each next token, on every route (cloud engine, llama.cpp, ONNX Runtime) alike; and
vLLM's ``structured_outputs`` (``json``, ``regex``, ``choice``), which the cloud server takes too.

``parse_response_format`` reads the request's field into a ``Grammar`` (or None for text),
``parse_structured_outputs`` vLLM's;
``Grammar.matcher()`` follows one output byte by byte; a ``TokenIndex`` built once per vocabulary
gives the tokens a matcher allows next.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from .._response_format import RAW_KINDS  # plain text, not JSON: vLLM's regex and choice
from . import _graph, _nodes
from ._calls import CallsMatcher, ToolCallsGrammar
from ._index import Matcher, TokenIndex
from ._schema import ResponseFormatError, normalize
from ._tokens import token_bytes_from_tokenizer

__all__ = [
    "CallsMatcher", "Grammar", "Matcher", "ResponseFormatError", "TokenIndex", "parse_response_format",
    "parse_grammar", "parse_structured_outputs", "token_bytes_from_tokenizer",
    "ToolCallsGrammar",
]


class Grammar:
    """One ``response_format`` (or vLLM's regex or choice, ``kind`` saying which): the outputs it
    allows."""

    __slots__ = ("key", "kind", "response_format", "_root", "_regexes")

    def __init__(self, response_format: dict, value: _graph.Node) -> None:
        self.response_format = response_format
        self.kind: str = response_format["type"]
        # the user's property order is part of the grammar (keys come out in it): no sort_keys
        self.key = json.dumps(response_format, separators=(",", ":"), ensure_ascii=False)
        self._root = _graph.root(value)
        self._regexes: list[Any] | None = None

    def matcher(self) -> Matcher:
        return Matcher(frozenset((f,) for f in _nodes.begin(self._root)))

    def regexes(self) -> list[Any]:
        """The compiled patterns and formats its strings are held to, or its plain text's regex
        (``TokenIndex.prepare``; found once, the grammar is kept across requests)."""
        if self._regexes is not None:
            return self._regexes
        found: dict[int, Any] = {}
        seen: set[int] = set()
        todo = [self._root]
        while todo:
            node = todo.pop()
            if node.serial in seen:
                continue
            seen.add(node.serial)
            if node.kind in (_graph.PAT, _graph.RAW):
                found[id(node.a)] = node.a
            elif node.kind == _graph.OBJ:
                todo.extend(p[2] for p in node.a)  # type: ignore[attr-defined]
                todo.extend(x for x in (node.b,) if x is not None)  # type: ignore[misc]
            elif node.kind in (_graph.ARR, _graph.ROOT):
                todo.append(node.a)  # type: ignore[arg-type]
            elif node.kind == _graph.ALT:
                todo.extend(node.a)  # type: ignore[arg-type]
        self._regexes = list(found.values())
        return self._regexes

    def validate(self, text: str) -> bool:
        """Whether ``text`` is an output this grammar produces (JSON: whitespace around it allowed;
        a regex or a choice: the text exactly)."""
        m = self.matcher()
        if self.kind not in RAW_KINDS:
            text = text.strip()
        return m.feed(text.encode("utf-8", "surrogatepass")) and m.done

    def __repr__(self) -> str:
        return f"Grammar({self.key})"


_GRAMMARS: OrderedDict[str, Grammar] = OrderedDict()
_GRAMMARS_SIZE = 256  # formats kept compiled
_lock = threading.Lock()


def _kept(seen: str | None) -> Grammar | None:
    """The Grammar kept under ``seen`` (a request field's JSON), if any."""
    if seen is None:
        return None
    with _lock:
        found = _GRAMMARS.get(seen)
        if found is not None:
            _GRAMMARS.move_to_end(seen)
        return found


def _cached(seen: str | None, build: Any) -> Grammar:
    """The Grammar kept under ``seen``, else ``build()``, then kept under it (and its own key)."""
    found = _kept(seen)
    if found is not None:
        return found
    grammar = build()
    with _lock:
        grammar = _GRAMMARS.setdefault(grammar.key, grammar)
        if seen is not None:
            _GRAMMARS[seen] = grammar
        while len(_GRAMMARS) > _GRAMMARS_SIZE:
            _GRAMMARS.popitem(last=False)
    return grammar


_SO = "structured_outputs"
_SO_KINDS = ("json", "regex", "choice")
_SO_REFUSED = {
    "grammar": "a context-free grammar (EBNF/GBNF) is not served",
    "structural_tag": "structural tags are not served",
    "whitespace_pattern": "the whitespace between JSON tokens is fixed (a space, or a newline and an indent)",
}
_SO_IGNORED = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties")


def parse_structured_outputs(value: Any, field: str = _SO) -> Grammar:
    """vLLM's ``structured_outputs`` (``{"json": schema}``, ``{"regex": pattern}`` or ``{"choice":
    [strings]}``, exactly one) as a grammar. ``json``: as ``response_format``'s ``json_schema``
    with that schema (a JSON text of one is read too); ``regex``: the whole output matches the
    pattern (anchors implied; the subset ``_regex`` serves); ``choice``: the output is one of the
    strings exactly. Raises ``ResponseFormatError`` with ``param`` naming the field (``field``, the
    request's name for it: vLLM's older ``guided_json`` and the like are read through here too)."""
    if not isinstance(value, dict):
        raise ResponseFormatError(f"{field} must be an object such as {{\"choice\": [\"yes\", \"no\"]}}.",
                                  field)
    for key in value:
        if key in _SO_REFUSED:
            raise ResponseFormatError(f"{field}.{key}: {_SO_REFUSED[key]}; use json, regex or choice.",
                                      f"{field}.{key}")
        if key not in _SO_KINDS and key not in _SO_IGNORED:
            raise ResponseFormatError(f"{field}.{key} is not a field of {field}: use json, regex or choice.",
                                      f"{field}.{key}")
    given = [k for k in _SO_KINDS if value.get(k) is not None]
    if len(given) != 1:
        raise ResponseFormatError(f"{field} needs exactly one of json, regex and choice"
                                  + (f"; got {', '.join(given)}." if given else "."), field)
    kind = given[0]
    spec = value[kind]
    where = field if field.startswith("guided_") else f"{field}.{kind}"
    try:
        # kept apart from response_format's keys: {"choice": [...]} sent as one must stay refused
        seen = "structured_outputs:" + json.dumps({kind: spec}, separators=(",", ":"), ensure_ascii=False,
                                                  allow_nan=False)
    except (TypeError, ValueError):
        raise ResponseFormatError(f"{where} must be plain JSON.", where) from None
    if kind == "json":
        return _json_structured(spec, where)
    return _cached(seen, lambda: _raw_grammar(kind, spec, where))


def _json_structured(spec: Any, where: str) -> Grammar:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise ResponseFormatError(f"{where}: a JSON schema given as text must be valid JSON ({exc}).",
                                      where) from None
    if not isinstance(spec, dict):
        raise ResponseFormatError(f"{where} must be a JSON schema (an object).", where)
    try:
        grammar = parse_response_format({"type": "json_schema",
                                         "json_schema": {"name": "structured_outputs", "schema": spec}})
    except ResponseFormatError as exc:  # its field, named from this request's side
        param = exc.param.replace("response_format.json_schema.schema", where, 1)
        raise ResponseFormatError(exc.message.replace("response_format.json_schema.schema", where), param) \
            from None
    assert grammar is not None
    return grammar


def _raw_grammar(kind: str, spec: Any, where: str) -> Grammar:
    from . import _regex, _strings

    if kind == "choice":
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) and c for c in spec):
            raise ResponseFormatError(f"{where} must be a list of one or more non-empty strings.", where)
        options = [c.encode("utf-8", "surrogatepass") for c in spec]
        if not all(_strings.utf8_prefix(o) for o in options):
            raise ResponseFormatError(f"{where}: a choice is not valid text (a lone surrogate).", where)
        return Grammar({"type": "choice", "choice": list(spec)}, _graph.literal(options))
    if not isinstance(spec, str) or not spec:
        raise ResponseFormatError(f"{where} must be a non-empty string (a regular expression).", where)
    # the whole output matches: the pattern's own ^ and $ at its ends are implied anyway
    body = spec[1:] if spec.startswith("^") else spec
    if body.endswith("$") and not _regex._escaped_end(body):
        body = body[:-1]
    try:
        regex = _regex.compiled(f"^(?:{body})$")
    except ValueError as exc:
        message = str(exc)
        try:  # the error as the user's own pattern has it (its positions, not the wrapper's)
            _regex.Regex(spec)
        except ValueError as own:
            message = str(own)
        raise ResponseFormatError(f"{where}: {message.rstrip('.')}.", where) from None
    return Grammar({"type": "regex", "regex": spec}, _graph.raw(regex))


def parse_response_format(value: Any) -> Grammar | None:
    """OpenAI's ``response_format`` (a dict, or None) as a grammar; None for ``text``.

    The same format asked again (by JSON) is the same Grammar object, so its states, and the
    token masks memoised on them, repeat across requests. Raises ``ResponseFormatError`` (a
    ValueError; ``.param`` names the field) for what cannot be served, saying what to change."""
    try:
        seen = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        seen = None  # not plain JSON (a pydantic object): compiled afresh, normalize rules on it
    found = _kept(seen)
    if found is not None:
        return found
    normalized, node = normalize(value)
    if normalized is None or node is None:
        return None
    # a format written as its own normalized form is the same grammar
    return _cached(seen, lambda: Grammar(normalized, node))


def parse_grammar(value: Any) -> Grammar | ToolCallsGrammar | None:
    """A grammar from its own ``Grammar.response_format`` dict, whatever its kind (how one travels
    to an engine replica): ``{"type": "regex", ...}`` and ``{"type": "choice", ...}`` as vLLM's
    fields, ``{"type": "tool_calls", ...}`` an auto answer's calls, anything else as OpenAI's
    ``response_format``."""
    if isinstance(value, dict) and value.get("type") == ToolCallsGrammar.kind:
        names, call = value.get("names"), parse_response_format(value.get("call"))
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names) \
                or call is None:
            raise ResponseFormatError("a tool_calls grammar needs names and call.", "response_format")
        return ToolCallsGrammar(call, names)
    if isinstance(value, dict) and value.get("type") in RAW_KINDS:
        kind = value["type"]
        return parse_structured_outputs({kind: value.get(kind)})
    return parse_response_format(value)
