"""Arithmetic: multi-digit addition, subtraction and small multiplication, digit by digit.

Prompt ``347+85=``; response one step per digit from the right, with carries
(borrows for subtraction), then the answer::

    347+85=   ->  7+5=12,4+8+1=13,3+0+1=4 #432
    342-85=   ->  12-5=7,14-8-1=5,3-0-1=2 #257
    347*6=    ->  7*6=42,4*6+4=28,3*6+2=20 #2082

Difficulty ``d`` (1-3) uses operands of up to ``d + 1`` digits; multiplication is by one
digit 2-9. Subtraction keeps the result non-negative.
"""

from __future__ import annotations

import random
import re

from gmts_analysis.toy.domains.base import Problem, same_integer, slip, verify_by_solving

_PROMPT = re.compile(r"([0-9]{1,7})([+\-*])([0-9]{1,7})=")


class Arithmetic:
    name = "arithmetic"
    difficulties = (1, 2, 3)
    charset = "0123456789+-*=,# "

    def generate(self, rng: random.Random, difficulty: int) -> Problem:
        if difficulty not in self.difficulties:
            raise ValueError(f"arithmetic: difficulty must be one of {self.difficulties}")
        n = difficulty + 1
        op = rng.choice("+-*")
        a = rng.randint(10 ** (n - 1), 10**n - 1)
        if op == "*":
            b = rng.randint(2, 9)
        else:
            b = rng.randint(1, 10 ** rng.randint(1, n) - 1)
            if op == "-" and b > a:
                a, b = b, a
        prompt = f"{a}{op}{b}="
        solution, answer = self.solve(prompt)
        return Problem(self.name, difficulty, prompt, answer, solution)

    def solve(self, prompt: str, slip_rng: random.Random | None = None) -> tuple[str, str]:
        m = _PROMPT.fullmatch(prompt)
        if m is None:
            raise ValueError(f"arithmetic: malformed prompt {prompt!r}")
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        if op == "-" and b > a:
            raise ValueError("arithmetic: subtraction must not go negative")
        if op == "*" and b > 9:
            raise ValueError("arithmetic: multiplication is by one digit")
        da = [int(c) for c in reversed(str(a))]
        db = [int(c) for c in reversed(str(b))]
        n = max(len(da), len(db)) if op != "*" else len(da)
        bad = slip_rng.randrange(n) if slip_rng is not None else -1
        steps: list[str] = []
        digits: list[int] = []
        carry = 0
        for i in range(n):
            x = da[i] if i < len(da) else 0
            if op == "+":
                y = db[i] if i < len(db) else 0
                s = x + y + carry
                if i == bad:
                    s = slip(s, slip_rng, 0, 19)
                steps.append(f"{x}+{y}" + (f"+{carry}" if carry else "") + f"={s}")
                digits.append(s % 10)
                carry = s // 10
            elif op == "-":
                y = db[i] if i < len(db) else 0
                borrow_in = carry
                top = x + 10 if x - y - borrow_in < 0 else x
                r = top - y - borrow_in
                if i == bad:
                    r = slip(r, slip_rng, 0, 9)
                steps.append(f"{top}-{y}" + ("-1" if borrow_in else "") + f"={r}")
                digits.append(r)
                carry = 1 if top != x else 0
            else:
                s = x * b + carry
                if i == bad:
                    s = slip(s, slip_rng, 0, 89)
                steps.append(f"{x}*{b}" + (f"+{carry}" if carry else "") + f"={s}")
                digits.append(s % 10)
                carry = s // 10
        if op != "-" and carry:
            digits.extend(int(c) for c in reversed(str(carry)))
        answer = str(int("".join(str(d) for d in reversed(digits))))
        return ",".join(steps) + f" #{answer}", answer

    def verify(self, prompt: str, completion: str) -> float:
        return verify_by_solving(self, prompt, completion, same_integer)


ARITHMETIC = Arithmetic()
