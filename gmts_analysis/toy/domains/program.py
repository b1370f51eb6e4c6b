"""Program: short straight-line programs over a few integer variables, traced line by line.

Prompt: ``;``-separated assignments, then the queried variable and ``?``. Response: each
assignment in order, with the current values substituted, then the answer::

    a=7;b=a+5;a=b*2;c=a-b;c?   ->  a=7;b=7+5=12;a=12*2=24;c=24-12=12 #12

Difficulty ``d`` (1-3) has ``d + 2`` statements (``d = 1`` uses two variables, else three);
constants are 1-9 and every value stays in 0..99.
"""

from __future__ import annotations

import random
import re

from gmts_analysis.toy.domains.base import Problem, same_integer, slip, verify_by_solving

_CONST = re.compile(r"([a-z])=([0-9]{1,2})")
_OP = re.compile(r"([a-z])=([a-z]|[0-9]{1,2})([+\-*])([a-z]|[0-9]{1,2})")
_QUERY = re.compile(r"([a-z])\?")
_MAX = 99


def _apply(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


class Program:
    name = "program"
    difficulties = (1, 2, 3)
    charset = "abc0123456789+-*=;?# "

    def generate(self, rng: random.Random, difficulty: int) -> Problem:
        if difficulty not in self.difficulties:
            raise ValueError(f"program: difficulty must be one of {self.difficulties}")
        names = "ab" if difficulty == 1 else "abc"
        env = {"a": rng.randint(1, 9)}
        stmts = [f"a={env['a']}"]
        while len(stmts) < difficulty + 2:
            target = rng.choice(names)
            defined = sorted(env)
            for _ in range(100):
                op = rng.choice("+-*")
                left = rng.choice(defined)
                right = rng.choice(defined + [str(rng.randint(1, 9) if op != "*" else rng.randint(2, 3))])
                if op == "*" and right in env:
                    right = str(rng.randint(2, 3))
                if op == "-" and right == left:
                    continue
                lv = env[left]
                rv = env[right] if right in env else int(right)
                value = _apply(lv, op, rv)
                if 0 <= value <= _MAX:
                    break
            else:  # no valid operation found: fall back to a constant
                value = rng.randint(1, 9)
                stmts.append(f"{target}={value}")
                env[target] = value
                continue
            stmts.append(f"{target}={left}{op}{right}")
            env[target] = value
        query = stmts[-1][0] if rng.random() < 0.5 else rng.choice(sorted(env))
        prompt = ";".join(stmts) + f";{query}?"
        solution, answer = self.solve(prompt)
        return Problem(self.name, difficulty, prompt, answer, solution)

    def solve(self, prompt: str, slip_rng: random.Random | None = None) -> tuple[str, str]:
        if not isinstance(prompt, str):
            raise ValueError("program: prompt must be text")  # noqa: TRY004 (malformed input is a ValueError here)
        parts = prompt.split(";")
        q = _QUERY.fullmatch(parts[-1]) if parts else None
        if q is None or len(parts) < 2 or len(parts) > 12:
            raise ValueError(f"program: malformed prompt {prompt!r}")
        ops = [i for i, s in enumerate(parts[:-1]) if _OP.fullmatch(s)]
        bad = slip_rng.choice(ops) if (slip_rng is not None and ops) else -1
        env: dict[str, int] = {}
        steps = []
        for i, stmt in enumerate(parts[:-1]):
            if (m := _CONST.fullmatch(stmt)) is not None:
                env[m.group(1)] = int(m.group(2))
                steps.append(stmt)
                continue
            m = _OP.fullmatch(stmt)
            if m is None:
                raise ValueError(f"program: malformed statement {stmt!r}")
            target, left, op, right = m.groups()
            try:
                lv = env[left] if left.isalpha() else int(left)
                rv = env[right] if right.isalpha() else int(right)
            except KeyError:
                raise ValueError(f"program: variable used before assignment in {stmt!r}") from None
            value = _apply(lv, op, rv)
            if i == bad:
                value = slip(value, slip_rng, 0)
            if not 0 <= value <= 10 * _MAX:  # (a slipped trace is retried by the caller)
                raise ValueError(f"program: value out of range in {stmt!r}")
            env[target] = value
            steps.append(f"{target}={lv}{op}{rv}={value}")
        if q.group(1) not in env:
            raise ValueError(f"program: queried variable {q.group(1)!r} never assigned")
        answer = str(env[q.group(1)])
        return ";".join(steps) + f" #{answer}", answer

    def verify(self, prompt: str, completion: str) -> float:
        return verify_by_solving(self, prompt, completion, same_integer)


PROGRAM = Program()
