"""Environments and tasks. ``task``: the task plug-in protocol (what ``swarmjax train``
needs from a task; built-in names; streams); ``api``: what a host environment promises the
text rollout; ``device_api``: what a device twin gives the jitted swarm; ``tool_env``: a
chat agent with tools; ``orchestration``: ``create_subagent`` / ``assign_task``;
``scoring``: item-F1. Tasks: ``arith``; the wide-search family (``widesearch``: the token
world and its reference simulator, ``widesearch_jax`` its pure-JAX form,
``widesearch_tokens`` its host form, ``widesearch_text`` in text, ``widesearch_relay`` /
``widesearch_relay_device`` with canonical relays on the host and the device,
``widesearch_relay_parl`` the text PARL recipe's task, ``scripts`` scripted policies);
``synth``: generated stateful tool environments; ``context_notes``: what compaction says.
Import the module you need."""
