"""`swarmjax sample` end to end (in process, so compiled programs are shared)."""

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from swarmjax.cli import build_parser, main
from swarmjax.models.hf import to_hf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sample_random_model(capsys):
    assert main(["sample", "--preset", "tiny", "--prompt", "1 2 3", "--prompt", "4",
                 "--max-new-tokens", "5", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"\[(\d)\] prompt \[(.*?)\] -> \[(.*?)\]", out)
    assert [(r[0], r[1]) for r in rows] == [("0", "1, 2, 3"), ("1", "4")]
    assert all(len(r[2].split(",")) == 5 for r in rows)
    assert re.search(r"generated 10 tokens in [\d.]+s: [\d.]+ tokens/s", out)


def test_sample_from_hf_checkpoint_on_a_mesh(tmp_path, tiny_cfg, tiny_params, capsys):
    to_hf(tiny_cfg, tiny_params, str(tmp_path))
    assert main(["sample", "--hf", str(tmp_path), "--batch", "4", "--mesh", "2,2,2",
                 "--max-new-tokens", "3", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and "'tensor': 2" in out
    assert len(re.findall(r"^\[\d\] prompt", out, re.M)) == 4


def test_example_config_file_runs(capsys):
    assert main(["sample", "--config", os.path.join(ROOT, "configs", "sample_cpu.py"),
                 "--max-new-tokens", "4"]) == 0
    assert "tokens/s" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["sample", "--mesh", "3,1,1"], "needs 3 devices"),
    (["sample", "--config", "nope.py"], "does not exist"),
    (["sample", "--top-p", "0"], "top_p"),
    (["sample", "--hf", "/nonexistent"], "config.json"),
])
def test_bad_input_is_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_hf_config_missing_field_is_one_line(tmp_path, tiny_cfg, tiny_params, capsys):
    to_hf(tiny_cfg, tiny_params, str(tmp_path))
    config = json.load(open(tmp_path / "config.json"))
    del config["num_attention_heads"]
    json.dump(config, open(tmp_path / "config.json", "w"))
    assert main(["sample", "--hf", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"swarmjax sample: error: {tmp_path / 'config.json'}: "
                   "lacks required field 'num_attention_heads'")


def _help_texts() -> dict[str, str]:
    """``--help`` of the top level and of every subcommand, as argparse prints them."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"swarmjax": parser.format_help(),
            **{name: p.format_help() for name, p in sub.choices.items()}}


def test_help_is_plain_text():
    """No reST markup (Sphinx roles such as :data:`X`, ``literals``) in any --help."""
    helps = _help_texts()
    assert set(helps) >= {"swarmjax", "sample", "train", "eval", "trace"}
    for name, text in helps.items():
        markup = re.findall(r":[a-z]+:`[^`]*`|``[^`]*``", text)
        assert not markup, f"{name} --help shows {markup}"


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "swarmjax")
    for argv in ([script, "--help"], [sys.executable, "-m", "swarmjax.cli", "--help"]):
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert "sample" in out


def test_config_overrides_are_typed():
    from swarmjax.config_file import apply_overrides
    from swarmjax.train.parl import PARLTrainConfig

    cfg = PARLTrainConfig()
    out = apply_overrides(cfg, ["update.optim.learning_rate=3", "parl.schedule=cosine", "rollout.env.budget=None",
                                "group_size=4", "dynamic_sampling=True"])
    assert out.update.optim.learning_rate == 3.0 and isinstance(out.update.optim.learning_rate, float)
    assert (out.parl.schedule, out.rollout.env.budget, out.group_size, out.dynamic_sampling) == \
        ("cosine", None, 4, True)
    assert cfg.group_size == 8                                     # the original is untouched
    # overlapping overrides apply in order: an optional section set, then a field of it; and back
    from swarmjax.models import ModelConfig
    from swarmjax.sharding.mesh import MeshConfig
    from swarmjax.train.agent_job import AgentJob

    job = AgentJob(model=ModelConfig(), mesh=MeshConfig(data=2))
    assert apply_overrides(job, ["mesh=None", "mesh.fsdp=4"]).mesh == MeshConfig(fsdp=4)    # data: the default
    assert apply_overrides(job, ["mesh.fsdp=4", "mesh=None"]).mesh is None
    for bad, msg in [("group_size=2.5", "is not a int"), ("dynamic_sampling=1", "is not a bool"),
                     ("update.optim.lr=1", "no field 'lr'"), ("group_size", "FIELD=VALUE"),
                     ("parl.schedule=step", "unknown schedule"), ("group_size.x=1", "not a config section")]:
        with pytest.raises(ValueError, match=msg):
            apply_overrides(cfg, [bad])


def test_roles_are_one_record_in_configs_overrides_and_jit():
    """A ``Roles`` field takes ``--set`` on each side, typed by the value it holds; a
    ``Roles`` of params is a pytree (jit, tree.map) and one of configs is hashable."""
    import jax
    import jax.numpy as jnp

    from swarmjax.config_file import apply_overrides
    from swarmjax.roles import Roles
    from swarmjax.swarm.text_types import TextRolloutConfig
    from swarmjax.train.agent import TextRLConfig

    cfg = TextRLConfig()
    out = apply_overrides(cfg, ["rollout.contexts.subagents=96", "rollout.sampling.orchestrator.temperature=0"])
    assert out.rollout.contexts == Roles(cfg.rollout.contexts.orchestrator, 96)
    assert (out.rollout.sampling.orchestrator.temperature, out.rollout.sampling.subagents.temperature) == (0.0, 1.0)
    for bad, msg in [("rollout.contexts.subagents=1.5", "is not a int"), ("rollout.contexts.workers=3", "no field"),
                     ("rollout.contexts.orchestrator=0", "must be >= 1")]:
        with pytest.raises(ValueError, match=msg):
            apply_overrides(cfg, [bad])
    assert hash(TextRolloutConfig(contexts=Roles(64, 32))) == hash(TextRolloutConfig(contexts=Roles(64, 32)))
    params = Roles(jnp.ones(3), jnp.zeros(3))
    got = jax.jit(lambda p: p.map(lambda a, b: a * 2 + b, Roles.both(jnp.ones(3))))(params)
    assert isinstance(got, Roles) and got.orchestrator.tolist() == [3.0] * 3 and got.subagents.tolist() == [1.0] * 3
    assert len(jax.tree.leaves(params)) == 2 and Roles.of(params) is params and Roles.of(1) == Roles(1, 1)


def test_train_config_errors_are_one_line_and_leave_the_workdir_untouched(tmp_path):
    """Each config error of `swarmjax train` is one line on stderr (exit 2), no traceback
    (orbax's threads included: the processes run to their end), and nothing is created in
    the workdir: a config file's own errors, a missing hf_path, a task that does not
    import, an unknown --set key or engine, the device engine for a task without a device
    twin, a warm start to reuse that is not there, --resume latest with nothing to resume. Run as a user runs it: `swarmjax`
    processes, all at once."""
    job = "from swarmjax.train.agent_job import AgentJob\ndef get_config():\n    return AgentJob({})\n"
    (tmp_path / "syntax.py").write_text("def get_config(:\n    pass\n")
    (tmp_path / "name.py").write_text(job.format("task=undefined_name"))
    (tmp_path / "hf.py").write_text(job.format(f"hf_path={str(tmp_path / 'no-model')!r}"))
    (tmp_path / "task.py").write_text(job.format("task='nosuch_pkg.tasks:Task'"))
    (tmp_path / "ok.py").write_text(job.format(""))
    (tmp_path / "empty").mkdir()
    cases = {
        "syntax": (["syntax.py"], "syntax.py', line 1: SyntaxError"),
        "name": (["name.py"], "name.py', line 3: NameError"),
        "hf": (["hf.py"], "no-model does not exist"),
        "task": (["task.py"], "cannot import 'nosuch_pkg.tasks'"),
        "set": (["ok.py", "--set", "no_such_field=1"], "has no field 'no_such_field'"),
        "engine": (["ok.py", "--set", "engine=gpu"], "unknown engine 'gpu'; known: host, device"),
        "twin": (["ok.py", "--set", "engine=device"], "has no device twin"),
        "warm": (["ok.py", "--set", "warm_start_from=empty"], "empty holds no warm start"),
        "resume": (["ok.py", "--resume", "latest"], "no finished checkpoint"),
        "resume_empty": (["ok.py", "--resume", "latest", "--workdir", "empty"], "no finished checkpoint"),
    }
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    procs = {}
    for name, (args, _) in cases.items():
        workdir = ["--workdir", f"w_{name}"] if "--workdir" not in args else []
        procs[name] = subprocess.Popen([sys.executable, "-m", "swarmjax", "train", "--config", *args, *workdir,
                                        "--no-distributed"], cwd=tmp_path, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (name, err)
        assert err.strip().startswith("swarmjax train: error: ") and len(err.strip().splitlines()) == 1, (name, err)
        assert cases[name][1] in err, (name, err)
        assert not (tmp_path / f"w_{name}").exists(), name
    assert list((tmp_path / "empty").iterdir()) == []
