"""The overrides that shrink ``configs/parl_widesearch_cpu.py`` to a job of seconds,
shared by the single-process job tests and the two-process worker."""

SMALL_JOB = ["model.hidden_size=32", "model.head_dim=8", "model.intermediate_size=64", "model.num_layers=1",
             "sft.demos=32", "sft.eval_demos=8", "parl.update.num_minibatches=2", "eval_sizes=(1, 16)",
             "eval_episodes=4", "eval_every=2", "traces_per_eval=1", "checkpoint.every=2",
             "data.train_size=64", "data.validation_size=160", "data.test_size=160"]
