"""Synthetic stateful tool environments generated from a tool graph.

* :mod:`~swarmjax.envs.synth.world`: domains of typed entities, their tables (the
  state) and the tools over them (read, compute, write), each with a JSON schema;
* :mod:`~swarmjax.envs.synth.graph`: the tool graph (output -> input edges by type and
  entity, description-similarity edges) and its Louvain communities, the environments;
* :mod:`~swarmjax.envs.synth.generator`: tasks from random walks and from shortest paths to
  a target call, executed on an initial state, written as queries, filtered and counted;
* :mod:`~swarmjax.envs.synth.task`: a generated task set as a task plug-in
  (:mod:`swarmjax.envs.task`): the verifier scores the answer and the final state;
* :mod:`~swarmjax.envs.synth.device`: an environment's tables as arrays, its tools as one
  jittable step;
* :mod:`~swarmjax.envs.synth.device_task`: an environment's tasks as a device task of the
  jitted text swarm (:mod:`swarmjax.envs.device_api`), and its host twin.
"""
