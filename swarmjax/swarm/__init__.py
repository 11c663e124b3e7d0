"""The swarm rollout engine: orchestrator + frozen sub-agents decoding in one jit."""
