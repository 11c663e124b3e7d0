"""One process of a two-process ``swarmjax train`` (run by tests/test_multihost.py).

usage: python multihost_worker.py PROCESS_ID PORT WORKDIR PARL_STEPS [--resume]
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"   # 2 devices per process

import jax  # noqa: E402

from small_job import CONFIG, SMALL_JOB  # noqa: E402  (this directory is sys.path[0] of the script)

SMALL = SMALL_JOB + ["sft.steps=4", "parl.tasks_per_step=4", "parl.group_size=2", "mesh.data=-1"]


def main():
    pid, port, workdir, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.train.job import TrainJob, run_job

    job = apply_overrides(load_config(CONFIG, TrainJob), SMALL + [f"parl_steps={steps}"])
    run_job(job, workdir, progress=False, resume="--resume" in sys.argv)
    print("DONE", pid, jax.device_count(), flush=True)


if __name__ == "__main__":
    main()
