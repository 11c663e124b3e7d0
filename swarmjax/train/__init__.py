"""Training: the one job and its loop, and the stages they run.

``jobs`` (job config -> its run; ``run_job`` and ``evaluate_checkpoint``: what ``swarmjax
train`` / ``swarmjax eval`` call), ``loop`` (the one training loop), ``frame`` (resume
mode, workdir checks, checkpoints opened, SIGTERM), ``agent_job`` (the one job, ``AgentJob``,
and its run: any task on the host, device or token engine; ``token_world``: the token
world's pieces of it), the stages (``sft`` / ``warm_start`` / ``demos``: warm starts;
``agent``, ``agent_rl``, ``agent_eval``: configs, the RL step, the evaluation; ``parl``:
the token engine's RL config and trainer; ``async_rl``), ``engines``, ``checkpoint``,
``streams``, ``logs``, ``policy``, ``export``, ``plan``. Import the module you need."""
