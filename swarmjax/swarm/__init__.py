"""Rollout engines: an orchestrator and its sub-agents decoding together.

``engine`` (the token world's jitted swarm), ``text_engine`` (+ ``text_engine_feed`` /
``text_engine_state`` / ``text_device``: the jitted swarm in text over a task's device
twin), ``text_rollout`` (the host-driven text rollout over any task's Python tools),
``text_types`` (their configs and the rollout result), ``context`` (context management:
summaries, discard), ``lanes``, ``outcome`` (episode figures from a rollout). The text
engines import no task: a task comes in through its protocol (``envs/task.py``,
``envs/device_api.py``); the token engine is the token world's own."""
