"""Rules a cache hit must pass whatever the verifier says: what the models cannot see.

The embedder and the reranker read lower-cased word pieces, blind to case, spacing, line breaks and
indentation, and only their first 256 (embedder) or 128 (reranker, both texts together) tokens. So
two different questions can look identical to them:

- code and formulas, where layout, case and every symbol count ("print('done')" indented under a
  loop or not, ``x`` or ``X``, ``10-3`` or ``3-10``): a prompt that looks like code (a line break,
  a backtick, one of ``;{}<>=|\\``, an operator between digits or a factorial) is served only on
  an exact repeat;
- a long prompt whose differing part lies past the window the model reads (a document followed by
  two different questions embeds to cosine 1.0): see ``SemanticCache``, which asks the embedder and
  the verifier whether they read each text whole;
- different numbers ("convert 5 km to miles" / "convert 50 km to miles", "in one sentence" / "in
  five bullet points", "-40 °C" / "40 °C", "五" / "六", "Ⅲ" / "Ⅳ", "one plus one" / "one plus one
  plus one", "the first world war" / "the second", "the eleventh" / "the twelfth", "the eighties"
  / "the nineties", "half of 100" / "double 100", "Henry VII" / "Henry VIII", "UTC+2" / "UTC-2"),
  a negation on one side only ("is it safe" / "is it unsafe", "ist es nicht sicher", "n'est pas"),
  a word turned into its opposite when that is all that differs ("is Python faster" / "slower than
  Java", "is it true" / "false that bats are blind", "buy" / "sell", "men" / "women"), and the
  same words with their numbers in another order ("10 minus 3" / "3 minus 10") or with one moved
  across a word of direction ("flights from Paris to London" / "from London to Paris", "is a shark
  bigger than a dolphin") or with the possessive moved to another word ("should the employer pay
  the employee's taxes" / "the employee ... the employer's"), a request for a brief or a detailed
  answer on one side only or the other way round ("Briefly explain how vaccines work" / "Explain in
  detail how vaccines work"), and a question written in another
  script (a translation: "Какая столица Франции?" / "What is the capital of France?"): the
  verifiers usually catch these, not always (and plain cosine never), while a paraphrase rarely
  does any of them, so :func:`conflict` refuses them outright. On the held-out QQP test split
  (``hybridllm cache eval``) these rules remove 6 of the default verifier's 296 correct hits and 2
  of its 13 false ones (measured before "one", "first", "second", "zero" and the script were
  added).

:func:`exact_key` is the exact-repeat key: for plain questions case, runs of spaces and trailing
question marks or full stops do not change the question, but inside quotes spaces do, and so does
the case of a literal ("Reverse the string 'AbC'" / "... 'abc'", which :func:`conflict` refuses
too); "5!" (a factorial) keeps its "!"; nor does the Unicode form (composed or decomposed accents).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from itertools import pairwise

_CODE = re.compile(r"[\n`;{}<>=|\\]|\d\s*[-+*/^%×÷]\s*[\d(.]|\d!")
# a minus sign belongs to the number when nothing word-like stands before it: "-40 °C" is not
# "40 °C", while "COVID-19" holds 19 (and "10-3" is arithmetic, see _CODE)
_NUMBER = re.compile(r"(?:(?<![\w)])[-\u2212])?\d+(?:[.,]\d+)*")
# an explicit sign before a number, after a word too ("UTC+2" / "UTC-2", which _NUMBER reads as 2)
_SIGNED = re.compile(r"([+\-\u2212])(\d+(?:[.,]\d+)*)")
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
# a Roman numeral in capitals up to 89 ("Henry VIII", "Louis XIV", "Episode IV"), compared only
# when both sides hold one: a lone "I" is the pronoun, and "C", "D", "M" start too many acronyms
_ROMAN = re.compile(r"\b(?=[IVXL])(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})\b")
_TRAILING = re.compile(r"[\s?.!]+$")
# a quoted text: the words a question operates on ("Reverse the string 'AbC'", "How many capitals
# are in \"HeLLo\"?"), kept as written. A single quote opens after no letter and closes before
# none, so "don't" and "the cats' toys" quote nothing
_QUOTED = re.compile(
    r'"[^"\n]+"|\u201c[^\u201d\n]+\u201d|\u00ab[^\u00bb\n]+\u00bb|\u300c[^\u300d\n]+\u300d'
    r"|(?<![\w'])'[^'\n]+'(?![\w'])"
)
_ASCII_LETTER = re.compile(r"[A-Za-z]")
_OTHER_LETTER = re.compile(r"[^\W\d_\x00-\x7f]")  # a letter (or a CJK ideograph) past ASCII
NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot",
     "nowhere", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "cant", "wont", "shouldnt",
     # German, French, Spanish, Portuguese, Italian, Dutch: MiniLM puts "Ist es sicher?" and "Ist
     # es nicht sicher?" at cosine 0.98. Not words English uses too ("non", "sin", "mai", "pas":
     # "faux pas", "PAs"); French "pas" comes after "ne" or an elided "n'" (see _negated)
     "nicht", "kein", "keine", "keinen", "keinem", "keiner", "keines", "nie", "niemals", "nichts",
     "niemand", "ohne", "ne", "jamais", "rien", "aucun", "aucune", "nunca", "nada", "nadie",
     "ningún", "ninguno", "ninguna", "tampoco", "não", "nenhum", "nenhuma", "niente", "nessuno",
     "nessuna", "niet", "geen", "nooit", "niets"}
)
# "one" is left out: "which one is better?" asks what "which is better?" does
NUMBER_WORDS = frozenset(
    "zero two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety "
    "hundred thousand million billion trillion third fourth fifth sixth seventh eighth ninth "
    "tenth eleventh twelfth thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth "
    "nineteenth twentieth thirtieth fortieth fiftieth sixtieth seventieth eightieth ninetieth "
    "hundredth thousandth millionth billionth dozen twenties thirties forties fifties sixties "
    "seventies eighties nineties".split()
)
# numbers that are other words too ("which one", "at first", "a second"): compared only when both
# sides hold one, so "one plus one" is not "one plus one plus one", nor the first world war the second
SOFT_NUMBER_WORDS = frozenset({"one", "first", "second"})
# multiples and fractions, other words too ("double vision", "a half marathon", "once I know"):
# compared as sets, and only when both sides hold one, so "half of 100" is not "double 100"
MULTIPLE_WORDS = frozenset({"half", "double", "twice", "triple", "thrice", "quarter", "once"})
# "un-" and the like turn a word into its opposite: "safe" / "unsafe", "legal" / "illegal"
_OPPOSITE_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non")
# a word and its opposite (or its counterpart): when they are all that differs, the question asks
# the other way round ("Is Python faster than Java?" / "... slower than Java?", "Is it true that
# bats are blind?" / "... false ...", both served by the reranker at 0.95 and 0.96). Only as the
# whole difference: a paraphrase that also words the rest otherwise ("Is X better than Y?" / "Is
# Y worse than X?") is left to the verifier, and misses here, which is a miss, never a wrong answer.
# "Give me arguments for" / "against nuclear power", "Explain black holes in simple terms" / "in
# technical terms" and "How do I speed up" / "slow down my computer?" were served at 0.95 to 0.96
_OPPOSITE_WORDS = (
    "faster slower|fast slow|quicker slower|more less|more fewer|most least|bigger smaller|"
    "big small|larger smaller|large small|largest smallest|biggest smallest|higher lower|"
    "high low|highest lowest|better worse|best worst|good bad|heavier lighter|heaviest lightest|"
    "heavy light|hotter colder|hot cold|hottest coldest|warmer cooler|warmer colder|warm cold|"
    "longer shorter|long short|longest shortest|older younger|old young|oldest youngest|"
    "old new|older newer|oldest newest|stronger weaker|strongest weakest|strong weak|"
    "richer poorer|richest poorest|rich poor|easier harder|easiest hardest|easy hard|"
    "easy difficult|deeper shallower|deep shallow|closer farther|closer further|"
    "nearest farthest|near far|wider narrower|wide narrow|thicker thinner|thick thin|"
    "cheaper pricier|cheap expensive|true false|increase decrease|increase reduce|"
    "increases decreases|increasing decreasing|increased decreased|rise fall|up down|"
    "open close|open closed|on off|in out|before after|earlier later|early late|first last|"
    "start end|start stop|begin end|win lose|won lost|buy sell|buying selling|bought sold|"
    "import export|push pull|upload download|encrypt decrypt|encode decode|compress decompress|"
    "add remove|add subtract|multiply divide|enable disable|maximum minimum|max min|pros cons|"
    "advantages disadvantages|strengths weaknesses|above below|over under|north south|"
    "east west|left right|top bottom|inside outside|internal external|positive negative|"
    "gain lose|accept reject|accept decline|safe dangerous|love hate|always never|wet dry|"
    "light dark|success failure|succeed fail|pass fail|profit loss|private public|entry exit|"
    "enter exit|arrive leave|arrival departure|past future|yesterday tomorrow|sunrise sunset|"
    "ascending descending|uppercase lowercase|horizontal vertical|input output|send receive|"
    "give take|lend borrow|male female|men women|man woman|boy girl|boys girls|husband wife|"
    "mother father|son daughter|brother sister|employer employee|buyer seller|landlord tenant|"
    "teacher student|parent child|parents children|winner loser|predator prey|for against|"
    "simple technical|speed slow"
)
OPPOSITES: dict[str, frozenset[str]] = {}
for _pair in _OPPOSITE_WORDS.split("|"):
    _a, _b = _pair.split()
    OPPOSITES[_a] = OPPOSITES.get(_a, frozenset()) | {_b}
    OPPOSITES[_b] = OPPOSITES.get(_b, frozenset()) | {_a}
# how long an answer is asked for: "Briefly explain how vaccines work" and "Explain in detail how
# vaccines work" (served at 0.97 by the reranker), "Give me a brief overview" and "... a
# comprehensive overview of the Roman Empire", "Summarize the Iliad" and "... in detail" (0.95): the
# models read the topic, which is the same, and an answer of one length is no answer to a request
# for the other. Words that ask for it and little else ("depth" and "detail" only as "in depth" and
# "in detail", "quick" and "short" only before "summary" and the like: "how quickly does hair grow",
# "the depth of the sea", "short-term" are other questions' words)
_SHORT_WORDS = frozenset({"brief", "briefly", "concise", "concisely", "succinct", "succinctly", "tldr"})
_LONG_WORDS = frozenset({"detailed", "thorough", "thoroughly", "comprehensive", "comprehensively",
                         "exhaustive", "exhaustively", "lengthy", "elaborately"})
_SHORT_BEFORE = frozenset({"quick", "short"})
_SUMMARY_WORDS = frozenset({"summary", "overview", "answer", "explanation", "description", "introduction"})
_LONG_AFTER_IN = frozenset({"detail", "depth"})
# a word moved across one of these changes who does what to whom: "Paris to London"
_DIRECTIONAL = frozenset(
    {"to", "into", "onto", "than", "over", "from", "against", "versus", "vs", "of", "by", "toward",
     "towards", "like"}
)


def is_code_like(text: str) -> bool:
    """A line break, a backtick, a code symbol or arithmetic: layout, case and symbols matter."""
    return bool(_CODE.search(text.strip()))


def exact_key(query: str) -> str:
    """The exact-repeat key of a question (two questions with one key are one cache entry)."""
    # NFC: "café" typed as one code point or as "e" + a combining accent (macOS file names,
    # some keyboards) is one question. Not NFKC, which would read "5²" as "52"
    text = unicodedata.normalize("NFC", query).strip()
    if is_code_like(text):  # only trailing spaces of lines and trailing question marks go
        text = "\n".join(line.rstrip() for line in text.splitlines()).strip()
        return text.rstrip("? ").rstrip()  # "what is 5!" keeps its "!": it asks for 120
    # case counts inside quotes, where a capital follows a letter (see _cased): "Reverse the
    # string 'AbC'" and "... 'abc'" are two questions (before, one exact key: the answer "cba" was
    # served for 'AbC'); so do the spaces there
    parts, start = [], 0
    for quoted in _QUOTED.finditer(text):
        mark = quoted.group()
        before = re.sub(r"\s+", " ", text[start : quoted.start()].casefold())
        parts += [before, mark[0] + _cased(mark[1:-1]) + mark[-1]]
        start = quoted.end()
    parts.append(re.sub(r"\s+", " ", text[start:].casefold()))
    return _TRAILING.sub("", "".join(parts).strip())


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold().replace("’", "'"))


def _number_list(text: str) -> list[str]:
    """The numbers written with digits, in order; U+2212 is a minus too."""
    return [n.replace("\u2212", "-") for n in _NUMBER.findall(text)]


def _numbers(text: str) -> Counter[str]:
    found = Counter(_number_list(text))
    # numbers not written with digits, which the embedder reads as one unknown token or not at
    # all: "五" / "六" (CJK), "Ⅲ" / "Ⅳ" (Roman numeral signs), "5²" / "5³", "½" / "¼"
    found.update(c for c in text if c.isnumeric() and not c.isdecimal())
    return found


def _opposite_signs(a: str, b: str) -> bool:
    """A number written with "+" on one side and "-" on the other only ("UTC+2" / "UTC-2"), either
    way round."""
    signed_a, signed_b = ({(s == "+", n) for s, n in _SIGNED.findall(t)} for t in (a, b))  # (+?, n)

    def one_way(x: set[tuple[bool, str]], y: set[tuple[bool, str]]) -> bool:
        return any((not plus, n) in y and (plus, n) not in y for plus, n in x)

    return one_way(signed_a, signed_b) or one_way(signed_b, signed_a)


def _romans(text: str) -> set[str]:
    """The Roman numerals written in capital letters, but a lone "I" ("Henry VIII": {"VIII"})."""
    return {m for m in _ROMAN.findall(text) if m and m != "I"}


def _negated(words: list[str]) -> bool:
    # "n'est", "n'a": French "ne" elided before a vowel
    return any(w in NEGATIONS or w.endswith("n't") or w.startswith("n'") for w in words)


def _opposite_pair(only_a: set[str], only_b: set[str]) -> bool:
    """A word on one side is the other side's word with a negating prefix."""
    for short, long in ((only_a, only_b), (only_b, only_a)):
        for word in long:
            for prefix in _OPPOSITE_PREFIXES:
                if word.startswith(prefix) and word[len(prefix):] in short and len(word) - len(prefix) >= 3:
                    return True
    return False


def _turned_around(words_a: list[str], words_b: list[str]) -> bool:
    """The words that differ, and only they, pair up as opposites ("faster" / "slower")."""
    only_a, only_b = Counter(words_a) - Counter(words_b), Counter(words_b) - Counter(words_a)
    if not only_a or only_a.total() != only_b.total():
        return False
    rest = list(only_b.elements())
    for word in only_a.elements():
        match = next((other for other in rest if other in OPPOSITES.get(word, ())), None)
        if match is None:
            return False
        rest.remove(match)
    return True


# "'s" on these is "is" or "us" ("what's", "let's"), not whose
_NOT_POSSESSIVE = frozenset(
    {"what", "it", "that", "there", "here", "who", "where", "how", "he", "she", "let", "when", "why", "this"}
)
# a possessive moved to another word may bring "her" for "his" along ("a mother ... her son's")
_POSSESSIVE_DETERMINERS = frozenset({"his", "her", "their", "its", "my", "your", "our"})


def _lengths(words: list[str]) -> frozenset[str]:
    """The answer lengths ``words`` ask for: "short", "long", both or neither."""
    asked = set()
    if not _SHORT_WORDS.isdisjoint(words):
        asked.add("short")
    if not _LONG_WORDS.isdisjoint(words):
        asked.add("long")
    for word, after in pairwise(words):
        if word in _SHORT_BEFORE and after in _SUMMARY_WORDS:
            asked.add("short")
        elif word == "in" and after in _LONG_AFTER_IN:
            asked.add("long")
    return frozenset(asked)


def _cased(quoted: str) -> str:
    """A quoted text as its case counts: as written when a capital follows a letter ("AbC",
    "HeLLo", "camelCase", "NASA": a literal), else in lower case, as a title or a phrase is typed
    either way ("Think and Grow Rich" / "Think and Grow rich", "Fake it" / "fake it": 15 of QQP's
    18 pairs quoting a text in other capitals are labelled the same question)."""
    literal = any(c.isupper() and before.isalpha() for before, c in pairwise(quoted))
    return quoted if literal else quoted.casefold()


def _quoted(text: str) -> list[str]:
    """The quoted texts, without their quote marks, in order, as their case counts (:func:`_cased`)."""
    return [_cased(m.group()[1:-1]) for m in _QUOTED.finditer(text)]


def _recased(a: list[str], b: list[str]) -> bool:
    """The same quoted text in other capitals where they count (see :func:`_cased`; the embedder
    and the reranker read lower case only): "Reverse the string 'AbC'" / "... 'abc'", "Is
    \"SeCret\" the same as \"secret\"?" with the two turned around."""
    if [t.casefold() for t in a] == [t.casefold() for t in b] and a != b:
        return True
    forms_a: dict[str, Counter[str]] = {}
    forms_b: dict[str, Counter[str]] = {}
    for texts, forms in ((a, forms_a), (b, forms_b)):
        for t in texts:
            forms.setdefault(t.casefold(), Counter())[t] += 1
    return any(forms_a[t] != forms_b[t] for t in forms_a.keys() & forms_b.keys())


def _owners(words: list[str]) -> tuple[Counter[str], set[str]]:
    """(the words with a possessive "'s" taken off, less possessive determiners; the owners)."""
    plain: Counter[str] = Counter()
    owners: set[str] = set()
    for word in words:
        if word.endswith("'s") and word[:-2] not in _NOT_POSSESSIVE:
            word = word[:-2]
            owners.add(word)
        if word not in _POSSESSIVE_DETERMINERS:
            plain[word] += 1
    return plain, owners


def _possessive_moved(words_a: list[str], words_b: list[str]) -> bool:
    """The same words, the possessive on another one: who owns what changed ("Should the employer
    pay the employee's taxes?" / "Should the employee pay the employer's taxes?")."""
    (plain_a, owners_a), (plain_b, owners_b) = _owners(words_a), _owners(words_b)
    return bool(owners_a - owners_b) and bool(owners_b - owners_a) and plain_a == plain_b


def _swapped(words_a: list[str], words_b: list[str]) -> bool:
    """The same words, one of them moved across a word of direction ("Paris to London")."""
    if Counter(words_a) != Counter(words_b):
        return False  # other words: the verifier's call (reorderings are common in paraphrases)
    for word in _DIRECTIONAL:
        if words_a.count(word) == 1:
            before_a = Counter(words_a[: words_a.index(word)])
            if before_a != Counter(words_b[: words_b.index(word)]):
                return True
    return False


def conflict(query: str, cached: str) -> str | None:
    """Why ``cached`` cannot be the same question as ``query`` (None when nothing rules it out)."""
    # one Unicode form: a decomposed accent would split a word in two ("Málaga", "não")
    query, cached = unicodedata.normalize("NFC", query), unicodedata.normalize("NFC", cached)
    if exact_key(query) == exact_key(cached):
        return None
    if is_code_like(query) or is_code_like(cached):
        return "code or a formula, served only on an exact repeat"
    words_q, words_c = _words(query), _words(cached)
    hard_q, hard_c = (Counter(w for w in ws if w in NUMBER_WORDS) for ws in (words_q, words_c))
    soft_q, soft_c = (Counter(w for w in ws if w in SOFT_NUMBER_WORDS) for ws in (words_q, words_c))
    multi_q, multi_c = ({w for w in ws if w in MULTIPLE_WORDS} for ws in (words_q, words_c))
    roman_q, roman_c = _romans(query), _romans(cached)
    if (_numbers(query) != _numbers(cached) or hard_q != hard_c or (soft_q and soft_c and soft_q != soft_c)
            or (multi_q and multi_c and multi_q != multi_c) or (roman_q and roman_c and roman_q != roman_c)):
        return "different numbers"
    if _opposite_signs(query, cached):
        return "different numbers"
    if Counter(words_q) == Counter(words_c) and _number_list(query) != _number_list(cached):
        return "the same words in another direction"  # "10 minus 3" / "3 minus 10"
    if _negated(words_q) != _negated(words_c):
        return "a negation on one side only"
    if (_opposite_pair(set(words_q) - set(words_c), set(words_c) - set(words_q))
            or _turned_around(words_q, words_c)):
        return "a word and its opposite"
    if _recased(_quoted(query), _quoted(cached)):
        return "a quoted text in other capitals"
    if _lengths(words_q) != _lengths(words_c):
        return "another length of answer asked for"
    if _swapped(words_q, words_c) or _possessive_moved(words_q, words_c):
        return "the same words in another direction"
    if _other_script(_scripts(query), _scripts(cached)):
        return "another language (another script)"
    return None


def _scripts(text: str) -> Counter[str]:
    """How many of the text's letters each script holds ("LATIN", "CYRILLIC", "CJK", ...)."""
    counts: Counter[str] = Counter()
    if ascii_letters := len(_ASCII_LETTER.findall(text)):  # in C: a lookup runs this per candidate
        counts["LATIN"] = ascii_letters
    for c in filter(str.isalpha, _OTHER_LETTER.findall(text)):  # not "½" nor "²"
        name = unicodedata.name(c, "").removeprefix("FULLWIDTH ").removeprefix("HALFWIDTH ")
        counts[name.split(" ", 1)[0]] += 1
    return counts


def _other_script(a: Counter[str], b: Counter[str]) -> bool:
    """The script most of one side's letters are written in is not on the other side at all: a
    question and its translation ("Какая столица Франции?" / "What is the capital of France?"),
    which the English embedder and reranker may put close (the same names and numbers), while an
    answer in one language is no answer to the other. Japanese mixes kanji and kana, and a name
    in another script ("What is 寿司 made of?") is fine: only the main script must be shared."""
    if not a or not b:
        return False
    return any(not any(s in other for s, n in side.items() if n == max(side.values()))
               for side, other in ((a, b), (b, a)))
