"""A user's task, written outside swarmjax: unit conversion with a `convert` tool.

"How many centimeters are in 7 meters?" The agent may call convert(value, from_unit,
to_unit); its final answer is scored 1 when its last number is right. This file is all
the task code a user writes: the stream, the tool, the prompt, the verifier, and
demonstrations for a warm start (single agent, and an orchestrator that hands the
question to a sub-agent).
"""

import dataclasses
import re

from swarmjax.envs.task import Demo, Task
from swarmjax.text.tools import Tool

FACTORS = {("km", "m"): 1000, ("m", "cm"): 100, ("cm", "mm"): 10, ("kg", "g"): 1000,
           ("h", "min"): 60, ("min", "s"): 60, ("l", "ml"): 1000}
NAMES = {"km": "kilometers", "m": "meters", "cm": "centimeters", "mm": "millimeters", "kg": "kilograms",
         "g": "grams", "h": "hours", "min": "minutes", "s": "seconds", "l": "liters", "ml": "milliliters"}
SYSTEM = "Answer the question. You can call convert(value, from_unit, to_unit). End with: The answer is <number>."


def convert(value: int, from_unit: str, to_unit: str) -> str:
    """Convert a whole number between units.

    Args:
      value: the number to convert.
      from_unit: its unit, e.g. "m".
      to_unit: the unit wanted, e.g. "cm".
    """
    if (from_unit, to_unit) in FACTORS:
        return str(value * FACTORS[from_unit, to_unit])
    raise ValueError(f"cannot convert {from_unit} to {to_unit}")


@dataclasses.dataclass(frozen=True)
class Question:
    value: int
    source: str
    target: str

    @property
    def text(self) -> str:
        return f"How many {NAMES[self.target]} are in {self.value} {NAMES[self.source]}?"

    @property
    def answer(self) -> int:
        return self.value * FACTORS[self.source, self.target]


@dataclasses.dataclass(frozen=True)
class UnitsTask(Task):
    max_value: int = 20

    def sample(self, rng, count, *, split="train"):
        pairs = sorted(FACTORS)
        return [Question(int(rng.integers(1, self.max_value + 1)), *pairs[rng.integers(len(pairs))])
                for _ in range(count)]

    def tools(self):
        return [Tool.from_function(convert)]

    def messages(self, q):
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q.text}]

    def verify(self, q, answer):
        numbers = re.findall(r"-?\d+", answer)
        return {"r_perf": float(bool(numbers) and int(numbers[-1]) == q.answer)}

    def demonstration(self, q, chat, rng, *, role="single"):
        call = {"name": "convert", "arguments": {"value": q.value, "from_unit": q.source, "to_unit": q.target}}
        solve = [chat.assistant_ids("", [call]).tolist(), chat.assistant_ids(f"The answer is {q.answer}.").tolist()]
        if role == "single":
            return solve
        delegate = [{"name": "create_subagent", "arguments": {"name": "converter", "system_prompt": SYSTEM}},
                    {"name": "assign_task", "arguments": {"agent": "converter", "prompt": q.text}}]
        return Demo(turns=[chat.assistant_ids("", delegate).tolist(),
                           chat.assistant_ids(f"The answer is {q.answer}.").tolist()], workers=[solve])

    def corpus(self):
        import numpy as np
        return [SYSTEM] * 50 + [q.text + f" The answer is {q.answer}." for q in self.sample(np.random.default_rng(0), 500)]
