"""Logic: nested boolean expressions, evaluated innermost first.

``T``/``F`` are true/false, ``&`` is and, ``|`` is or, ``~`` is not; every binary
sub-expression below the top is in parentheses. Prompt: the expression and ``=``.
Response: the expression rewritten pass by pass, each pass replacing every innermost
operation (all operands literal) by its value, until one value is left::

    (T&~F)|~(F|T)=   ->  (T&T)|~T,T|F #T

Difficulty ``d`` (1-3) has ``d + 1`` binary operators; any operand is negated with
probability 0.3.
"""

from __future__ import annotations

import random

from gmts_analysis.toy.domains.base import Problem, verify_by_solving

_NOT_P = 0.3
_MAX_LEN = 200

Node = tuple  # ("lit", bool) | ("not", Node) | (op, Node, Node) with op in "&|"


def _b(v: bool) -> str:
    return "T" if v else "F"


class _Parser:
    """Recursive descent over ``binary := operand [op operand]``; raises ``ValueError``."""

    def __init__(self, text: str):
        self.s, self.i = text, 0

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def take(self) -> str:
        c = self.peek()
        if not c:
            raise ValueError("logic: unexpected end of expression")
        self.i += 1
        return c

    def operand(self) -> Node:
        c = self.take()
        if c in "TF":
            return ("lit", c == "T")
        if c == "~":
            child = self.operand()
            if child[0] == "not":
                raise ValueError("logic: double negation is not written")
            return ("not", child)
        if c == "(":
            node = self.binary()
            if node[0] not in "&|" or self.take() != ")":
                raise ValueError("logic: parentheses hold exactly one binary operation")
            return node
        raise ValueError(f"logic: unexpected character {c!r}")

    def binary(self) -> Node:
        left = self.operand()
        if self.peek() in ("&", "|"):
            op = self.take()
            return (op, left, self.operand())
        return left


def parse(prompt: str) -> Node:
    """The expression tree of a prompt ``<expression>=``; ``ValueError`` when malformed."""
    if not isinstance(prompt, str) or not prompt.endswith("=") or len(prompt) > _MAX_LEN:
        raise ValueError("logic: malformed prompt")
    p = _Parser(prompt[:-1])
    node = p.binary()
    if p.i != len(p.s):
        raise ValueError("logic: trailing characters (chains must be parenthesized)")
    return node


def render(node: Node, top: bool = True) -> str:
    kind = node[0]
    if kind == "lit":
        return _b(node[1])
    if kind == "not":
        return "~" + render(node[1], top=False)
    text = render(node[1], top=False) + kind + render(node[2], top=False)
    return text if top else f"({text})"


class Logic:
    name = "logic"
    difficulties = (1, 2, 3)
    charset = "TF&|~()=,# "

    def _tree(self, rng: random.Random, n_ops: int) -> Node:
        if n_ops == 0:
            node: Node = ("lit", rng.random() < 0.5)
        else:
            k = rng.randrange(n_ops)
            node = (rng.choice("&|"), self._tree(rng, k), self._tree(rng, n_ops - 1 - k))
        return node

    def _negate(self, rng: random.Random, node: Node, top: bool) -> Node:
        if node[0] in "&|":
            node = (node[0], self._negate(rng, node[1], False), self._negate(rng, node[2], False))
        if not top and rng.random() < _NOT_P:
            node = ("not", node)
        return node

    def generate(self, rng: random.Random, difficulty: int) -> Problem:
        if difficulty not in self.difficulties:
            raise ValueError(f"logic: difficulty must be one of {self.difficulties}")
        tree = self._negate(rng, self._tree(rng, difficulty + 1), top=True)
        prompt = render(tree) + "="
        solution, answer = self.solve(prompt)
        return Problem(self.name, difficulty, prompt, answer, solution)

    def solve(self, prompt: str, slip_rng: random.Random | None = None) -> tuple[str, str]:
        tree = parse(prompt)
        n_ops = _count_ops(tree)
        if n_ops == 0:
            raise ValueError("logic: no operation to evaluate")
        bad = slip_rng.randrange(n_ops) if slip_rng is not None else -1
        done = 0  # reductions so far (each operation is reduced exactly once)

        def step(node: Node) -> Node:
            """One pass: every operation whose operands are all literals becomes a literal."""
            nonlocal done
            kind = node[0]
            if kind == "lit":
                return node
            kids = node[1:]
            if all(k[0] == "lit" for k in kids):
                if kind == "not":
                    r = not kids[0][1]
                else:
                    r = (kids[0][1] and kids[1][1]) if kind == "&" else (kids[0][1] or kids[1][1])
                if done == bad:
                    r = not r
                done += 1
                return ("lit", r)
            return (kind, *(step(k) for k in kids))

        passes = []
        while tree[0] != "lit":
            tree = step(tree)
            passes.append(render(tree))
        answer = passes.pop()
        trace = ",".join(passes)
        return (trace + " " if trace else "") + f"#{answer}", answer

    def verify(self, prompt: str, completion: str) -> float:
        return verify_by_solving(self, prompt, completion)


def _count_ops(node: Node) -> int:
    if node[0] == "lit":
        return 0
    if node[0] == "not":
        return 1 + _count_ops(node[1])
    return 1 + _count_ops(node[1]) + _count_ops(node[2])


LOGIC = Logic()
