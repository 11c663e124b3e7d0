"""Training: the one job and its loop, and the stages they run.

``jobs`` (job config -> its run; ``run_job`` and ``evaluate_checkpoint``: what ``swarmjax
train`` / ``swarmjax eval`` call), ``loop`` (the one training loop), ``frame`` (resume
mode, workdir checks, checkpoints opened, SIGTERM), the runs (``agent_job``: any text task
on the host or device engine; ``job``: the token world), the stages (``sft`` / ``warm_start`` / ``demos``, ``agent``: the RL step and the
evaluation, ``parl``: the token world's trainer, ``async_rl``), ``checkpoint``,
``streams``, ``logs``, ``policy``, ``export``, ``plan``. Import the module you need."""
