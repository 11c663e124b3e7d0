"""Multi-step arithmetic word problems with a ``calculator`` tool: ordinary single-agent
tool-use RL with a verifiable reward, on the same host environment API as the swarm.

A problem chains 2-3 operations on a starting count ("Mia has 37 coins. Mia finds 18
more. Then Mia gives away 12. How many coins does Mia have now?"). The agent may call
``calculator(expression)`` (integers, ``+ - *`` and parentheses), one operation per
turn or several; its final answer is a turn without calls, scored 1 when the last
integer in it is the right result.

Demonstrations for the warm start come in two kinds: the calculator path (one call per
operation on the running result, then "The answer is N.") and a direct answer with no
call. A small model cannot do two-digit arithmetic in its head, so the direct path is
mostly wrong once it has to produce the number itself: RL from a warm start that mixes
both should move the policy to the calculator (accuracy and tool calls both rise).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import operator
import re
from typing import Any

import numpy as np

from swarmjax.envs.api import play as api_play
from swarmjax.envs.task import Task
from swarmjax.text.chat import ChatFormat
from swarmjax.text.tools import Tool

SYSTEM = ("Solve the word problem. You can call calculator(expression) for arithmetic. "
          "End with: The answer is <number>.")
_NAMES = ("Mia", "Leo", "Ana", "Kai", "Zoe", "Sam", "Ivy", "Ben", "Noa", "Eli")
_ITEMS = ("coins", "apples", "stamps", "marbles", "books", "shells", "cards", "pens")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_INT = re.compile(r"-?\d+")


@dataclasses.dataclass(frozen=True)
class ArithConfig:
    """Problem sizes: ``min_ops..max_ops`` operations on a start in ``[10, max_operand]``,
    operands in ``[2, max_operand]`` (multipliers 2-4); ``tool_fraction`` of the
    demonstrations use the calculator."""

    min_ops: int = 2
    max_ops: int = 3
    max_operand: int = 99
    tool_fraction: float = 0.5

    def __post_init__(self):
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if self.max_operand < 10:
            raise ValueError(f"max_operand must be >= 10, got {self.max_operand}")
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"tool_fraction must be in [0, 1], got {self.tool_fraction}")


@dataclasses.dataclass(frozen=True)
class Problem:
    """A word problem: its text, the start and the ``(op, operand)`` chain, the answer."""

    text: str
    start: int
    ops: tuple[tuple[str, int], ...]
    answer: int


def sample_problem(cfg: ArithConfig, rng: np.random.Generator) -> Problem:
    """A random problem whose running count stays positive."""
    name, item = _NAMES[rng.integers(len(_NAMES))], _ITEMS[rng.integers(len(_ITEMS))]
    start = value = int(rng.integers(10, cfg.max_operand + 1))
    sentences, ops = [f"{name} has {value} {item}."], []
    for k in range(int(rng.integers(cfg.min_ops, cfg.max_ops + 1))):
        then = "Then " if k else ""
        kind = rng.choice(["+", "-", "*"], p=[0.45, 0.4, 0.15])
        if kind == "-" and value > 2:
            x = int(rng.integers(1, value))
            sentences.append(f"{then}{name} gives away {x}.")
        elif kind == "*":
            x = int(rng.integers(2, 5))
            sentences.append(f"{then}{name}'s {item} are multiplied by {x}.")
        else:
            kind, x = "+", int(rng.integers(2, cfg.max_operand + 1))
            sentences.append(f"{then}{name} finds {x} more.")
        ops.append((str(kind), x))
        value = {"+": value + x, "-": value - x, "*": value * x}[kind]
    sentences.append(f"How many {item} does {name} have now?")
    return Problem(text=" ".join(sentences), start=start, ops=tuple(ops), answer=value)


def calculate(expression: str) -> int:
    """Evaluate an integer expression of ``+ - *``, unary minus and parentheses (parsed
    with ``ast``; nothing else is accepted, nothing is ``eval``-ed)."""
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"not an integer expression of + - *: {expression!r}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    value = ev(tree)
    if abs(value) > 10 ** 12:
        raise ValueError("result too large")
    return value


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
      expression: integers with + - * and parentheses, e.g. "(37 + 18) * 2".
    """
    return str(calculate(expression))


CALCULATOR = Tool.from_function(calculator)


def final_number(text: str) -> int | None:
    """The last integer in an answer text (None without one)."""
    found = _INT.findall(text)
    return int(found[-1]) if found else None


@dataclasses.dataclass(frozen=True)
class ArithTask(Task):
    """The arithmetic task as a plug-in (:mod:`swarmjax.envs.task`): a generator of
    problems, the calculator, the prompt, the verifier and demonstrations.

    >>> task = ArithTask(ArithConfig(max_ops=4))
    >>> env = make_env(task, problem, EnvContext(chat, runner)); prompt = env.reset(problem)
    """

    cfg: ArithConfig = ArithConfig()

    def sample(self, rng: np.random.Generator, count: int, *, split: str = "train") -> list[Problem]:
        """``count`` problems (every split draws from the same distribution; the job
        gives each split a stream of its own)."""
        return [sample_problem(self.cfg, rng) for _ in range(count)]

    def tools(self) -> list[Tool]:
        return [CALCULATOR]

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem.text}]

    @staticmethod
    def reference(problem: Problem) -> str:
        """The right answer as a demonstration states it (for a judge that reads one)."""
        return f"The answer is {problem.answer}."

    @staticmethod
    def verify(problem: Problem, answer: str) -> dict[str, float]:
        got = final_number(answer)
        return {"r_perf": float(got == problem.answer), "correct": float(got == problem.answer)}

    def demonstration(self, problem: Problem, chat: ChatFormat, rng: np.random.Generator, *,
                      role: str = "single") -> list[list[int]] | None:
        """Scripted turns (ids as sampled): the calculator path with probability
        ``tool_fraction``, else a direct answer. Single agents only (None otherwise)."""
        if role != "single":
            return None
        final = chat.assistant_ids(f"The answer is {problem.answer}.").tolist()
        if rng.random() >= self.cfg.tool_fraction:
            return [final]
        turns, value = [], problem.start
        for op, x in problem.ops:
            call = {"name": "calculator", "arguments": {"expression": f"{value} {op} {x}"}}
            turns.append(chat.assistant_ids("", [call]).tolist())
            value = calculate(f"{value} {op} {x}")
        return turns + [final]

    def corpus(self, *, seed: int = 0) -> list[str]:
        """Text for a local tokenizer (:func:`corpus`)."""
        return corpus(self.cfg, seed=seed)


def corpus(cfg: ArithConfig, *, count: int = 2000, seed: int = 0) -> list[str]:
    """Text to train the task's tokenizer on: problems, calls, results, answers, the
    tool's schema as the system turn shows it."""
    rng = np.random.default_rng(seed)
    out = [SYSTEM, json.dumps(CALCULATOR.schema(), ensure_ascii=False)] * 50
    for _ in range(count):
        p = sample_problem(cfg, rng)
        out += [p.text, f"The answer is {p.answer}.",
                f'{{"name": "calculator", "arguments": {{"expression": "{p.start} + {p.ops[0][1]}"}}}}']
    return out


def play(env: Any, task: Any, turns: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`swarmjax.envs.api.play` of a single-agent episode: (ids [T], own-ids mask [T])."""
    played = api_play(env, task, turns)       # a spawn raises there: no sub-agent scripts
    return played.ids, played.mask
