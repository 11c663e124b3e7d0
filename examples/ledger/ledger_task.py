"""A stateful task, written outside swarmjax: bookkeeping on a small key-value ledger.

"Set apples to 5, then add 3 to apples." The agent has two tools, `read(key)` and
`write(key, value)`, that act on one ledger per episode; the episode scores 1 when the
ledger ends as asked and the final answer states the last value. What makes it stateful:
`world(problem)` returns a fresh object per episode whose `tools()` change its state
(an orchestrator and its sub-agents share it) and whose `verify(answer)` reads that state.
"""

import dataclasses

import numpy as np

from swarmjax.envs.task import Demo, Task
from swarmjax.text.tools import Tool

KEYS = ("apples", "pears", "plums", "figs")
SYSTEM = ("Keep the ledger. read(key) gives a value, write(key, value) sets one. Do what the user asks, "
          "then end with: The value is <number>.")


@dataclasses.dataclass(frozen=True)
class Job:
    """One problem: set ``key`` to ``start``, then add ``add`` to it."""
    key: str
    start: int
    add: int

    @property
    def text(self) -> str:
        return f"Set {self.key} to {self.start}, then add {self.add} to {self.key}."

    @property
    def result(self) -> int:
        return self.start + self.add


class Ledger:
    """The per-episode world: the ledger's state, the tools acting on it, the verifier."""

    def __init__(self, job: Job):
        self.job, self.values = job, {}

    def tools(self):
        def read(key: str) -> str:
            """Read a value from the ledger.

            Args:
              key: the entry's name.
            """
            return str(self.values.get(key, 0))

        def write(key: str, value: int) -> str:
            """Set a ledger entry.

            Args:
              key: the entry's name.
              value: its new value.
            """
            self.values[key] = value
            return "ok"
        return [Tool.from_function(read), Tool.from_function(write)]

    def verify(self, answer: str) -> dict[str, float]:
        stored = self.values.get(self.job.key) == self.job.result
        stated = answer.strip().endswith(f"The value is {self.job.result}.")
        return {"r_perf": float(stored and stated), "stored": float(stored)}


@dataclasses.dataclass(frozen=True)
class LedgerTask(Task):
    max_value: int = 20

    def sample(self, rng, count, *, split="train"):
        return [Job(KEYS[rng.integers(len(KEYS))], int(rng.integers(0, self.max_value)),
                    int(rng.integers(1, self.max_value))) for _ in range(count)]

    def world(self, job):
        return Ledger(job)

    def messages(self, job):
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": job.text}]

    def demonstration(self, job, chat, rng, *, role="single"):
        def call(name, **arguments):
            return chat.assistant_ids("", [{"name": name, "arguments": arguments}]).tolist()
        answer = chat.assistant_ids(f"The value is {job.result}.").tolist()
        solve = [call("write", key=job.key, value=job.start), call("read", key=job.key),
                 call("write", key=job.key, value=job.result), answer]
        if role == "single":
            return solve
        # an orchestrator hands the whole job to one sub-agent (which shares the ledger),
        # then states what it reported
        delegate = [{"name": "create_subagent", "arguments": {"name": "clerk", "system_prompt": SYSTEM}},
                    {"name": "assign_task", "arguments": {"agent": "clerk", "prompt": job.text}}]
        return Demo(turns=[chat.assistant_ids("", delegate).tolist(), answer], workers=[solve])

    def corpus(self):
        jobs = self.sample(np.random.default_rng(0), 300)
        return [SYSTEM] * 50 + [f"{j.text} The value is {j.result}." for j in jobs]
