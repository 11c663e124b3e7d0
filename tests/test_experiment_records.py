"""The PARL experiments keep what their report needs of each finished arm and seed
(``experiments/run.py``: ``<records>/<name>/<arm>_s<seed>.json``), so that the seeds of
one experiment can finish in separate sessions: the report made once the runs are gone
equals the one made beside them, and an arm with a record is not trained again."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import run  # noqa: E402  (experiments/run.py)


def _fake_run(d: str, f1: float, subagents: float, steps: int = 12) -> None:
    """A finished workdir of the default job: its summary, RL metrics and evaluations."""
    os.makedirs(d)
    size = lambda acc, crit, sub: {"accuracy": acc, "critical_steps": crit, "subagents": sub,  # noqa: E731
                                   "finished_subagents": sub, "total_steps": 26.0, "no_spawn": 1.0}
    json.dump({"final_sizes": {"16": size(f1, 5.0, subagents), "8": size(f1, 5.0, subagents), "1": size(1.0, 2.0, 0.0)},
               "initial_sizes": {"16": size(1.0, 17.0, 0.0)}}, open(os.path.join(d, "summary.json"), "w"))
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"stage": "sft", "step": 0, "loss": 1.0}) + "\n")
        for t in range(steps):
            f.write(json.dumps({"stage": "rl", "step": t, "subagents": subagents * t / steps, "no_spawn": 0.5,
                                "critical_steps": 17.0 - t, "accuracy": f1}) + "\n")
    with open(os.path.join(d, "eval.jsonl"), "w") as f:
        for step in (0, steps // 2, steps):
            f.write(json.dumps({"policy": "rl" if step else "sft", "split": "validation", "step": step,
                                "sizes": {"16": size(f1, 5.0, subagents)}}) + "\n")


def test_the_report_outlives_the_runs_and_kept_arms_are_not_trained_again(tmp_path, monkeypatch):
    exp = run.EXPERIMENTS["serial_collapse"]
    runs, records = str(tmp_path / "runs"), str(tmp_path / "records")
    for s, f1 in ((0, 0.9), (1, 0.7)):
        _fake_run(os.path.join(runs, "serial_collapse", f"base_s{s}"), f1, 8.0)
        _fake_run(os.path.join(runs, "serial_collapse", f"no_r_parallel_s{s}"), f1 - 0.5, 0.0)
    trained = []
    monkeypatch.setattr(run, "_train", lambda d, *a: trained.append(d))
    kept = run.run_arms(exp, "serial_collapse", [0, 1], "unused_{seed}", runs, 1, records)
    assert not trained                                  # every run was finished
    assert sorted(os.listdir(os.path.join(records, "serial_collapse"))) == [
        "default_s0.json", "default_s1.json", "no_r_parallel_s0.json", "no_r_parallel_s1.json"]
    md = run.report(exp, "serial_collapse", kept, str(tmp_path / "out1"))
    assert "| default | **mean** | 0.800 |" in md and "| no_r_parallel | **worst** | 0.200 |" in md
    assert "| 6 | 0.800 / 5.00 / 8.00 | 0.300 / 5.00 / 0.00 |" in md      # the validation table, by step

    import shutil
    shutil.rmtree(runs)                                 # the runs are gone (another machine): the records remain
    again = run.run_arms(exp, "serial_collapse", [0, 1], "unused_{seed}", runs, 1, records)
    assert not trained
    assert run.report(exp, "serial_collapse", again, str(tmp_path / "out2")) == md
    assert os.path.getsize(tmp_path / "out2" / "serial_collapse.png") > 0

    with pytest.raises(FileNotFoundError):              # a seed with neither is trained (here: not really)
        run.run_arms(exp, "serial_collapse", [2], "unused_{seed}", runs, 1, records)
    assert trained == [os.path.join(runs, "serial_collapse", d) for d in ("base_s2", "no_r_parallel_s2")]


def test_a_kept_warm_start_is_not_trained_again_on_another_machine(tmp_path, monkeypatch):
    """``common.train_missing(kept_warm=)``: the warm start's export is kept once made, and a
    machine without the run copies it back instead of training it again."""
    import common                                       # experiments/common.py
    import swarmjax.train.export as export
    import swarmjax.train.jobs as jobs

    trained = []

    def fake_run(job, workdir, **_):
        trained.append(workdir)
        os.makedirs(workdir, exist_ok=True)
        open(os.path.join(workdir, "summary.json"), "w").write("{}")

    def fake_export(workdir, out, which):
        os.makedirs(out)
        open(os.path.join(out, "config.json"), "w").write(json.dumps({"from": workdir, "which": which}))

    monkeypatch.setattr(jobs, "run_job", fake_run)
    monkeypatch.setattr(export, "export_run", fake_export)
    kept = str(tmp_path / "kept" / "warm_s0")
    first = {"warm": (None, str(tmp_path / "a" / "warm")), "rl": (None, str(tmp_path / "a" / "rl"))}
    clock = common.train_missing(first, ("warm", "rl"), "t", kept_warm=kept)
    assert trained == [first["warm"][1], first["rl"][1]] and set(clock) == {"warm", "rl"}
    assert json.load(open(os.path.join(kept, "config.json")))["from"] == first["warm"][1]

    second = {"warm": (None, str(tmp_path / "b" / "warm")), "rl": (None, str(tmp_path / "b" / "rl"))}
    clock = common.train_missing(second, ("warm", "rl"), "t", kept_warm=kept)
    assert trained[2:] == [second["rl"][1]] and set(clock) == {"rl"}   # the warm start was not trained
    assert json.load(open(os.path.join(second["warm"][1], "hf", "config.json")))["from"] == first["warm"][1]


def test_the_copy_probe_puts_each_returned_line_in_one_class():
    import context_copy  # noqa: E402  (experiments/context_copy.py)

    returned = [(0, 5), (1, 6), (2, 7), (3, 8)]
    # line 1 copied, line 2 slipped to line 3's value, line 3 another value, line 4 dropped;
    # entity 9 was never returned, entity 0 is said twice (its first line counts)
    answer = [(0, 5), (1, 7), (2, 1), (9, 9), (0, 6)]
    got, lost = context_copy.classify(returned, answer)
    assert [got[k] for k in context_copy.CLASSES] == [1, 1, 1, 1]
    assert (got["invented"], got["repeated"]) == (1, 1)
    assert lost == [2, 3, 4]
    # the last line has no next line: a wrong value there is "other value"
    got, lost = context_copy.classify(returned, [(0, 5), (1, 6), (2, 7), (3, 7)])
    assert (got["copied"], got["next line's value"], got["other value"], lost) == (3, 0, 1, [4])


def test_finished_over_spawned_is_read_per_window_of_training():
    # 200 PARL steps: the first 60 finish half of 4 spawned, then every one; one step spawns none
    spawned = [4.0] * 60 + [2.0] * 139 + [0.0]
    finished = [2.0] * 60 + [2.0] * 139 + [0.0]
    got = run._finished_shares({"subagents": spawned, "finished_subagents": finished})
    assert got["finished_early"] == 0.5 and got["finished_late"] == 1.0 and got["finished_worst"] == 0.5
    assert got["finished_all"] == (120 + 278) / (240 + 278)
