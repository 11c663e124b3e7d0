"""The harness example's problems, verifier and teacher (what swarmjax needs beside the
harness itself, agent.py).

A problem: a store of 6 keys (two-word names) with two-digit values, and a question
naming one of them. The teacher (the warm start's demonstrations) looks the key up and
answers with its value on half of the problems; on the other half it answers at once with
a guess, so the warm-started policy guesses often and RL has room to learn to look up.
"""

from __future__ import annotations

import random

WORDS = ("red", "blue", "green", "amber", "grey", "pale", "dark", "bright")
NAMES = ("fox", "owl", "elk", "wren", "pike", "moth", "hare", "lynx")
SPLIT_SEEDS = {"train": 0, "validation": 1, "test": 2}
SIZES = {"train": 4096, "validation": 128, "test": 128}


def problems(split: str) -> list[dict]:
    """``SIZES[split]`` problems of ``split`` (disjoint seed streams)."""
    rng = random.Random(SPLIT_SEEDS[split])
    keys = [f"{w} {n}" for w in WORDS for n in NAMES]
    out = []
    for i in range(SIZES[split]):
        store = {k: str(rng.randrange(10, 100)) for k in rng.sample(keys, 6)}
        key = rng.choice(sorted(store))
        out.append({"id": f"{split}-{i}", "question": f"What is the value of {key}?", "key": key, "store": store})
    return out


def score(problem: dict, answer: str) -> float:
    """1 when the answer holds the asked value."""
    return float(problem["store"][problem["key"]] in (answer or ""))


def teacher(problem: dict, messages: list, tools: list) -> dict:
    """Look up, then answer with what came back; or (half the problems) guess at once."""
    if messages[-1]["role"] == "tool":
        return {"content": f"The value of {problem['key']} is {messages[-1]['content']}."}
    if random.Random(problem["id"]).random() < 0.5:
        return {"content": f"The value of {problem['key']} is {random.Random(problem['id'] + 'g').randrange(10, 100)}."}
    return {"tool_calls": [{"function": {"name": "lookup", "arguments": {"key": problem["key"]}}}]}
