"""The tasks: compute an expression with the calculator, answer ``ANSWER: <number>``."""

import random
import re

import verifiers.v1 as vf

from vf_calc.tools import CalcToolset

SYSTEM = "Use the calc_evaluate tool to compute, then reply with: ANSWER: <number>"


def expressions(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` (expression, value) pairs of two-digit sums and products."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b, op = rng.randrange(10, 100), rng.randrange(2, 10), rng.choice("+*")
        out.append((f"{a} {op} {b}", str(a + b if op == "+" else a * b)))
    return out


class CalcData(vf.TaskData):
    answer: str


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = re.search(r"ANSWER:\s*(-?\d+)", trace.last_reply or "")
        return float(found is not None and found.group(1) == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    id: str = "vf_calc"
    num_tasks: int = 64
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list[CalcTask]:
        return [CalcTask(CalcData(id=f"calc-{i}", prompt=f"Compute {expr}.", system_prompt=SYSTEM, answer=value),
                         self.config.task)
                for i, (expr, value) in enumerate(expressions(self.config.num_tasks))]
