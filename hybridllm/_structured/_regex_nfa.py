"""A parsed pattern built into an NFA (Thompson's construction), and the measures ``_regex.Regex``
takes of it: the states reached without a character, and the fewest and most characters from each
position to a match's end.
"""

from __future__ import annotations

from ._regex_syntax import Ranges

MAX_STATES = 20_000  # the largest NFA a pattern may make
# the most (state, state reached without a character) pairs a pattern's closures may hold: a
# pattern of many optional parts in a row (``(a|b?){1000}``) makes them quadratic, and compiling
# one took 13 s; this many take about a tenth of a second
MAX_CLOSURE = 300_000


class _Nfa:
    """Thompson's construction: state i reads a character of ``chars[i]`` into ``next[i]``, or
    (``chars[i]`` None) moves without one to each of ``eps[i]``."""

    def __init__(self) -> None:
        self.chars: list[Ranges | None] = []
        self.next: list[int] = []
        self.eps: list[list[int]] = []

    def state(self) -> int:
        if len(self.chars) >= MAX_STATES:
            raise ValueError(f"the pattern is too large (over {MAX_STATES} states); simplify its repeats")
        self.chars.append(None)
        self.next.append(-1)
        self.eps.append([])
        return len(self.chars) - 1


def _build(nfa: _Nfa, node: tuple, start: int) -> int:
    """Add ``node``'s states after ``start``; return its end state."""
    kind = node[0]
    if kind == "set":
        end = nfa.state()
        if node[1]:  # an empty class matches nothing: no edge
            nfa.chars[start], nfa.next[start] = node[1], end
        return end
    if kind == "cat":
        at = start
        for part in node[1]:
            nxt = nfa.state()
            nfa.eps[at].append(nxt)
            at = _build(nfa, part, nxt)
        return at
    if kind == "alt":
        end = nfa.state()
        for part in node[1]:
            branch = nfa.state()
            nfa.eps[start].append(branch)
            nfa.eps[_build(nfa, part, branch)].append(end)
        return end
    _, part, lo, hi = node  # rep
    at = start
    for _ in range(lo):
        nxt = nfa.state()
        nfa.eps[at].append(nxt)
        at = _build(nfa, part, nxt)
    if hi is None:  # then any number more
        loop = nfa.state()
        nfa.eps[at].append(loop)
        body = nfa.state()
        nfa.eps[loop].append(body)
        nfa.eps[_build(nfa, part, body)].append(loop)
        return loop
    end = nfa.state()
    for _ in range(hi - lo):
        nfa.eps[at].append(end)
        nxt = nfa.state()
        nfa.eps[at].append(nxt)
        at = _build(nfa, part, nxt)
    nfa.eps[at].append(end)
    return end


def _closure(nfa: _Nfa, i: int, budget: list[int]) -> frozenset:
    """The states ``i`` reaches without reading a character (itself included)."""
    seen, todo = {i}, [i]
    while todo:
        for j in nfa.eps[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    budget[0] -= len(seen)
    if budget[0] < 0:
        raise ValueError(
            "the pattern is too complex to serve (too many optional parts in a row); simplify its repeats"
        )
    return frozenset(seen)


def _distances(succ: dict[int, frozenset], accept: int) -> tuple[dict[int, int], dict[int, float]]:
    """Per position that can reach ``accept``: the fewest and the most characters on the way
    (each position but the accept state reads one); ``inf`` where a loop lies on some way."""
    pred: dict[int, list[int]] = {i: [] for i in succ}
    for i, nxt in succ.items():
        for j in nxt:
            pred[j].append(i)
    shortest = {accept: 0}
    frontier = [accept]
    while frontier:  # breadth first, backwards from the end: unit steps
        nxt_frontier = []
        for j in frontier:
            for i in pred[j]:
                if i not in shortest:
                    shortest[i] = shortest[j] + 1
                    nxt_frontier.append(i)
        frontier = nxt_frontier
    live = set(shortest)
    # longest: a live position on a live loop, or one that reaches such, has no bound; the rest
    # form a DAG, taken in reverse topological order
    comp = _components(live, succ, pred)
    size: dict[int, int] = {}
    for c in comp.values():
        size[c] = size.get(c, 0) + 1
    looped = {i for i in live if size[comp[i]] > 1 or i in succ[i]}
    unbounded = set(looped)
    todo = list(looped)
    while todo:
        for k in pred[todo.pop()]:
            if k in live and k not in unbounded:
                unbounded.add(k)
                todo.append(k)
    longest: dict[int, float] = {i: float("inf") for i in unbounded}
    rest = live - unbounded
    waiting = {i: sum(1 for j in succ[i] if j in rest) for i in rest}
    ready = [i for i, w in waiting.items() if w == 0]
    while ready:  # a position is done once every live successor is
        i = ready.pop()
        longest[i] = 0 if i == accept else max(longest[j] + 1 for j in succ[i] if j in live)
        for k in pred[i]:
            if k in rest:
                waiting[k] -= 1
                if waiting[k] == 0:
                    ready.append(k)
    return shortest, longest


def _components(live: set, succ: dict[int, frozenset], pred: dict[int, list[int]]) -> dict[int, int]:
    """Strongly connected components of the live positions (Kosaraju, without recursion)."""
    order: list[int] = []
    seen: set[int] = set()
    for root in live:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter([j for j in succ[root] if j in live]))]
        while stack:
            node, it = stack[-1]
            for j in it:
                if j not in seen:
                    seen.add(j)
                    stack.append((j, iter([k for k in succ[j] if k in live])))
                    break
            else:
                stack.pop()
                order.append(node)
    comp: dict[int, int] = {}
    for root in reversed(order):
        if root in comp:
            continue
        comp[root] = root
        todo = [root]
        while todo:
            for k in pred[todo.pop()]:
                if k in live and k not in comp:
                    comp[k] = root
                    todo.append(k)
    return comp
