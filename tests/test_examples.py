"""The worked example as a user runs it: a task module outside the package
(examples/units), a tiny Hugging Face Qwen3 checkpoint and tokenizer built in a temporary
directory, `swarmjax train` as a single agent (stopped by SIGTERM, resumed with
--resume auto: the uninterrupted run's logs and parameters), then `swarmjax export` loaded
by transformers, generating until <|im_end|>; and the same job over two local processes on
a (data, tensor) mesh, with the metrics of one device, exported, evaluated and resumed on
one device."""

import json
import os
import sys

import jax
import numpy as np
import pytest

from small_job import close_lines, restored_states, sigterm_in_rl_step, two_processes
from swarmjax.cli import main
from swarmjax.train.preemption import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.slow     # the whole file: end-to-end runs (the README's whole suite)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "units")
CONFIG = os.path.join(EXAMPLE, "config.py")
# every group kept and a length penalty: the updates move the policy even where all rewards tie
SMALL = ["sft.steps=40", "sft.batch=8", "sft.demos=64", "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2",
         "eval_episodes=2", "eval_every=1", "rl.dynamic_sampling=False", "rl.overlong.max_length=200",
         "rl.overlong.cache_length=200"]
TIMING = {"rollout_s", "update_s", "tok_s", "wall_clock_s", "warm_start_s"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    sys.path.insert(0, EXAMPLE)
    try:
        from make_checkpoint import make_checkpoint
    finally:
        sys.path.remove(EXAMPLE)
    return make_checkpoint(str(tmp_path_factory.mktemp("units") / "tiny-qwen3"))


@pytest.fixture(scope="module")
def one_device(checkpoint, tmp_path_factory):
    """The single-agent job run once on one device, uninterrupted: its workdir."""
    full = str(tmp_path_factory.mktemp("one") / "full")
    assert main(_args(full, checkpoint)) == 0
    return full


def _args(workdir, checkpoint, *more):
    sets = SMALL + [f"hf_path={checkpoint}", *more]
    return ["train", "--config", CONFIG, "--workdir", workdir, "--no-progress"] + [a for s in sets for a in ("--set", s)]


def _lines(run, name):
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in open(os.path.join(run, name))]


def test_single_agent_resumes_exactly_and_exports_to_transformers(checkpoint, one_device, tmp_path, capsys):
    full, cut = one_device, str(tmp_path / "cut")
    summary = json.load(open(os.path.join(full, "summary.json")))
    assert summary["chat"] == "qwen3" and summary["role"] == "single" and summary["warm_start_steps"] == 40
    assert json.load(open(os.path.join(full, "policy.json")))["model"]["model_type"] == "qwen3"
    with sigterm_in_rl_step(0):
        assert main(_args(cut, checkpoint)) == PREEMPTED_EXIT_CODE
    assert "checkpoint at RL step 1 saved" in capsys.readouterr().err
    assert main(_args(cut, checkpoint) + ["--resume", "auto"]) == 0
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert _lines(cut, name) == _lines(full, name), name
    states = restored_states((full, cut), lambda ckpt, s: ckpt.read(s), 2)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, states[0]["params"], states[1]["params"])))

    # export: transformers loads it, and generate stops at <|im_end|> (generation_config's eos)
    out = str(tmp_path / "exported")
    assert main(["export", "--workdir", full, "--out", out]) == 0
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and im_end in model.generation_config.eos_token_id
    sys.path.insert(0, EXAMPLE)
    try:
        from units_task import UnitsTask, Question
    finally:
        sys.path.remove(EXAMPLE)
    task, q = UnitsTask(), Question(7, "m", "cm")
    call = {"name": "convert", "arguments": {"value": 7, "from_unit": "m", "to_unit": "cm"}}
    # the warm start's last turn, its text given: what follows "The answer is 700." is the turn's end
    chat = task.messages(q) + [{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                                                      "function": call}]},
                               {"role": "tool", "content": "700"}, {"role": "assistant", "content": "The answer is 700."}]
    enc = tok.apply_chat_template(chat, tools=[t.schema() for t in task.tools()], continue_final_message=True,
                                  enable_thinking=False, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=40, do_sample=False)[0, enc["input_ids"].shape[1]:].tolist()
    assert gen[-1] == im_end and len(gen) < 40, tok.decode(gen)

    # `swarmjax sample --chat` on the export: the template's prompt, transformers' greedy
    # reply, and the stop at generation_config's eos
    text = task.messages(q)[-1]["content"]
    capsys.readouterr()
    assert main(["sample", "--hf", out, "--chat", text, "--temperature", "0", "--max-new-tokens", "40"]) == 0
    printed = capsys.readouterr().out
    enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  enable_thinking=False, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=40, do_sample=False)[0, enc["input_ids"].shape[1]:].tolist()
    reply = tok.decode([i for i in gen if i != im_end])
    assert f"-> {reply!r}  (ended: {'stop id %d' % im_end if gen[-1] == im_end else '40 tokens'}" in printed, \
        (printed, reply, gen)


def test_mesh_and_two_processes_match_one_device(checkpoint, tmp_path, capsys):
    """The single-agent job (a short warm start, then updates that move the policy) on one
    device and over two processes of 2 devices each (jax.distributed on 127.0.0.1, a 2x1x2
    (data, fsdp, tensor) mesh: each process rolls out one of the two problems' groups and
    runs its tools; process 0 writes the logs): both write the same metrics and evaluations.
    (The frozen sub-agents of an orchestrator: the device engine's job, tests/test_text_parl.py.)"""
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    short = "sft.steps=4"                       # the sharded warm start's steps compared, not its result
    # a third of the reward from a judge (its rows on the mesh, or each process judging its own
    # episodes), asked for 'y' or 'n': single tokens of this tokenizer
    judged = ("judge.mix.verifier=0.5", "judge.judge.yes=y", "judge.judge.no=n")
    assert main(_args(one, checkpoint, short, *judged)) == 0
    outs = two_processes(_args(two, checkpoint, short, *judged, "mesh.data=2", "mesh.tensor=2"))
    assert f"written to {two}" in outs[0] and f"written to {two}" not in outs[1]
    rl = [r for r in _lines(one, "metrics.jsonl") if r["stage"] == "rl"]
    assert max(r["learner/grad_norm"] for r in rl) > 0, rl                  # an update moved the policy
    assert all(0 < r["reward/judge"] < 1 for r in rl)                       # the judge scored every step
    for name in ("metrics.jsonl", "eval.jsonl"):
        close_lines(_lines(one, name), _lines(two, name), f"{two} {name}")
    # written by two processes on 4 devices, read back on one device (trained on a pod, looked at
    # on a laptop; in this process, whose compiled programs the one-device run left): exported,
    # evaluated, and resumed for one more step
    capsys.readouterr()
    assert main(["export", "--workdir", two, "--checkpoint", "best", "--out", str(tmp_path / "hf")]) == 0
    assert "exported RL step" in capsys.readouterr().out
    assert os.path.isfile(tmp_path / "hf" / "model.safetensors")
    sets = [a for s in (*SMALL, f"hf_path={checkpoint}", short, *judged) for a in ("--set", s)]
    assert main(["eval", "--config", CONFIG, "--workdir", two, *sets]) == 0
    evaluated = capsys.readouterr().out
    assert "checkpoint at RL step 2" in evaluated and "| final |" in evaluated
    assert main(_args(two, checkpoint, short, *judged, "mesh=None", "rl.steps=3") + ["--resume", "auto"]) == 0
    assert [r["step"] for r in _lines(two, "metrics.jsonl") if r["stage"] == "rl"] == [0, 1, 2]


def test_a_lora_orchestrator_checkpoints_adapters_and_exports_merged_and_as_peft(checkpoint, tmp_path, capsys):
    """The example as an orchestrator trained as LoRA adapters over the user's checkpoint
    (frozen sub-agents: a snapshot of the adapters over the same base): its checkpoints
    hold the adapters alone; exported merged, transformers gives swarmjax's logits of base +
    adapters; exported as a PEFT adapter, ``PeftModel`` over the checkpoint gives them too,
    and ``swarmjax sample --adapter`` decodes as the merged export does."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from swarmjax.models.config import LoraConfig
    from swarmjax.models.hf import from_hf
    from swarmjax.models.transformer import forward_jit

    run = str(tmp_path / "lora")
    assert main(_args(run, checkpoint, "role='orchestrator'", "sft.steps=8", "lora.rank=4", "lora.alpha=8.0")) == 0
    state, meta = restored_states((run,), lambda ckpt, s: (ckpt.read(s),), 2)[0]
    assert set(state["params"]) == {"lora"} and set(state["frozen"]["subagents"]) == {"lora"}
    assert meta["lora"]["hf_path"] == checkpoint and meta["lora"]["config"]["rank"] == 4
    cfg, base = from_hf(checkpoint)
    cfg = cfg.replace(lora=LoraConfig(rank=4, alpha=8.0))
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 12))
    ours = np.asarray(forward_jit({**base, "lora": state["params"]["lora"]}, cfg, jax.numpy.asarray(tokens)).logits)
    assert np.abs(ours - np.asarray(forward_jit(base, cfg.replace(lora=None), jax.numpy.asarray(tokens)).logits)
                  ).max() > 1e-4                                           # the adapters moved the policy
    merged, adapter = str(tmp_path / "merged"), str(tmp_path / "adapter")
    assert main(["export", "--workdir", run, "--out", merged]) == 0
    assert main(["export", "--workdir", run, "--out", adapter, "--adapter"]) == 0
    with torch.no_grad():
        whole = AutoModelForCausalLM.from_pretrained(merged).eval()
        np.testing.assert_allclose(whole(torch.tensor(tokens)).logits.numpy(), ours, atol=1e-4, rtol=1e-4)
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoint), adapter).eval()
        np.testing.assert_allclose(peft(torch.tensor(tokens)).logits.numpy(), ours, atol=1e-4, rtol=1e-4)
    replies = []
    for argv in (["--hf", merged], ["--hf", checkpoint, "--adapter", adapter]):
        capsys.readouterr()
        assert main(["sample", *argv, "--chat", "7 m in cm?", "--temperature", "0", "--max-new-tokens", "12"]) == 0
        replies.append(capsys.readouterr().out.split("->", 1)[1].split("(ended")[0])
    assert replies[0] == replies[1]
