"""Grading a model's answer against a question's reference answer (the rules: see ``label``'s docstring)."""

from __future__ import annotations

import re

# a fraction "3/4" (one number, 0.75: read as 3 it graded "3/4" right for a reference of 3), a
# number "1,000", "-2.5", or one without its leading zero ".5" (read as 5)
_NUMBER = re.compile(r"-?(?:\d+/\d+(?![\d,.]*\d)|\d[\d,]*(?:\.\d+)?|(?<![\w.])\.\d+)")
# a reference that is one number: "18", "-3", "1,000", "2.5", ".5", "3/4", "$40", "-$5", "25%"
_NUMBER_REFERENCE = re.compile(r"^\s*\$?\s*-?\$?(?:\d+/\d+|\d[\d,]*(?:\.\d+)?|\.\d+)\s*%?\s*$")
# a minus before a dollar sign, "-$5": the number is -5 (read as 5, a loss graded as the gain)
_MINUS_DOLLAR = re.compile(r"(?<!\S)-\s*\$(?=\s*[\d.])")
# where a reply states its final answer: the part after the last of these ("option is" and
# "choice is" only for a letter: "one option is 3 boxes" is a step of a worked answer)
_CUE = re.compile(r"\banswer\**\s*(?:is\b|:|=)\s*:?", re.IGNORECASE)
_LETTER_CUE = re.compile(r"\b(?:answer|option|choice)\**\s*(?:is\b|:|=)\s*:?", re.IGNORECASE)
# the end of the final answer's first clause: a line end, ";", "(" before a word, or a full stop
_CLAUSE_END = re.compile(r"\n|;|\((?=[^\d\-$])|\.(?=\s|$)")
# a letter opening a reply as an option: "B", "(B) ...", "B. ...", "**B**", "B Paris", not "A farmer"
_OPTION = r"^[\s*_(\[]*{}(?:[).:\]*,]|\s*$|\s+(?![\sa-z]))"
# a final answer naming a letter, then another one as an option: "B and C", "B, D", "(A) or (C)"
_OPTION_HEDGE = r"^[\s*_(\[]*[{}][)\].:*]*\s*(?:,|/|&|\band\b|\bor\b)" + _OPTION[1:].format("[A-Za-z]")


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    return _number(found[-1]) if found else None


def _number(token: str) -> float | None:
    try:
        if "/" in token:
            num, den = token.split("/")
            return int(num) / int(den)
        return float(token.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _normalize(text: str) -> str:
    return re.sub(r"[^\w ]", "", text.lower()).strip()


def _final_part(answer: str, cue: re.Pattern[str] = _CUE) -> str | None:
    """What follows the answer's last cue ("The answer is 7."), or None when it has none."""
    cues = list(cue.finditer(answer))
    return answer[cues[-1].end() :] if cues else None


def _final_number(answer: str) -> float | None:
    """The number a reply gives as its answer: the first one of the final part's first clause
    (after its last "=", when it shows the sum), else the reply's last number."""
    final = _final_part(answer)
    if final is not None:
        clause = _CLAUSE_END.split(final, maxsplit=1)[0]
        found = _NUMBER.findall(clause.rsplit("=", 1)[-1])
        if found:
            return _number(found[0])
    return _last_number(answer)


def is_correct(answer: str, reference: str) -> bool:
    # a typeset minus; "-$5" as -5
    answer, reference = (_MINUS_DOLLAR.sub("-", t.replace("\u2212", "-")) for t in (answer, reference))
    if _NUMBER_REFERENCE.match(reference):
        want = _last_number(reference)
        got = _final_number(answer)
        return want is not None and got is not None and abs(got - want) < 1e-6
    r = _normalize(reference)
    if not r:
        return False
    final = _final_part(answer, _CUE if len(r) > 3 else _LETTER_CUE)
    a, tail = _normalize(answer), _normalize(final or "")
    if a == r or (final is not None and tail == r):
        return True
    if len(r) > 3:  # a word or name: it appears whole in the final answer (or the whole reply)
        return re.search(rf"\b{re.escape(r)}\b", tail if final is not None else a) is not None
    if final is not None:  # a short reference (a letter, yes/no): the final answer's first word
        words = tail.split()
        if len(r) == 1 and words[:1] in (["option"], ["choice"]):  # "The answer is option B."
            words, final = words[1:], re.sub(r"^\W*\w+", "", final)
        # a letter with another option after it, "B and C", "(B) or (D)": a hedge, not an answer
        if len(r) == 1 and re.match(_OPTION_HEDGE.format(r.upper() + r.lower()), final):
            return False
        return (words or [""])[0] == r
    if len(r) == 1:  # a letter opens the reply as an option, not as the word "A" or "I"
        return re.match(_OPTION.format(f"[{r.upper()}{r.lower()}]"), answer) is not None
    return (a.split() or [""])[0] == r

