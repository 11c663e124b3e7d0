"""Training the agents people already have: an OpenAI-compatible chat server whose
requests are rollout episodes.

* :mod:`~swarmjax.serve.record`: one agent's token stream across a harness's requests
  (resent history extends it, edited history opens a segment: ``template_drift``);
* :mod:`~swarmjax.serve.protocol`: the chat-completions wire format and its errors;
* :mod:`~swarmjax.serve.hub`: the open episodes, each under a random key;
* :mod:`~swarmjax.serve.http`: the HTTP front (aiohttp; ``pip install swarmjax[serve]``);
* :mod:`~swarmjax.serve.harness_env`: a harness episode as a host environment of
  :class:`~swarmjax.swarm.text_rollout.TextRollout`.

The task a job trains: :class:`swarmjax.envs.harness.HarnessTask`.
"""
