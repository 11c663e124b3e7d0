"""Serving a policy to agents that already exist: the per-agent token streams a chat
server keeps across the requests of a harness (:mod:`swarmjax.serve.record`)."""
