"""bench/fuzz.py in the suite: 10^3 random episodes through the jitted engine and the
reference simulator (no crash, no index out of range, no difference, no episode cut
by max_ticks), and the fuzzer's checks shown to catch each kind of failure."""

import pathlib
import sys

import numpy as np
import pytest

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.swarm.engine import INDEX_CHECKS, SAMPLE

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import fuzz  # noqa: E402

# One compiled engine per size: the scripted policies (uniform random ids, random
# turns, a forced spawn then the random model at temperature 1 and 2). The model
# alone (no script) and the largest size run in bench/fuzz.py and tests/test_swarm.py.
SIZES = ["tiny", "small", "medium"]
POLICIES = ["tokens", "grammar", "spawn-t1", "spawn-t2"]
BATCH = 84                     # 1000 episodes = 12 batches, one per (size, policy)


@pytest.mark.slow
def test_a_thousand_random_episodes_find_nothing():
    report = fuzz.fuzz(1000, batch=BATCH, sizes=SIZES, policies=POLICIES)
    assert report.episodes == 1000
    assert report.failures == 0, (dict(report.kinds), report.examples)
    cov = report.coverage
    assert all(cov[f"size:{s}"] > 0 for s in SIZES) and all(cov[f"policy:{p}"] > 0 for p in POLICIES)
    assert all(cov[f"end:{r}"] > 0 for r in ("answer", "budget", "context"))      # every ending
    assert 0 < cov["subagents_returned"] < cov["subagents"]                       # returns and failures


@pytest.fixture(scope="module")
def grammar_batch():
    target = fuzz.make_targets(["small"])[0]
    return (target, *fuzz.rollout_batch(target, "grammar", BATCH, seed=5))


def test_each_failure_kind_is_caught(grammar_batch):
    """The same batch, checked clean and then with a token out of the vocabulary
    (episode 0), an in-loop index error (episode 1) and an episode left running
    (episode 2): each is reported, on its episode, and nothing else is."""
    target, eps, script, result = grammar_batch
    clean = fuzz.Report()
    fuzz.check_batch(target, eps, script, result, clean, "clean", count=BATCH)
    assert clean.failures == 0 and clean.coverage["subagents"] > 0
    vocab = target.engine.cfgs.orchestrator.vocab_size
    bad = result.replace(
        tokens=result.tokens.at[0, int(result.length[0]) - 1].set(vocab),
        index_errors=result.index_errors.at[1, INDEX_CHECKS.index("lane_owner")].set(1),
        end_reason=result.end_reason.at[2].set(wsj.RUNNING))
    report = fuzz.Report()
    fuzz.check_batch(target, eps, script, bad, report, "bad", count=BATCH)
    assert (report.crashes, report.out_of_bounds, report.cut_by_max_ticks) == (0, 2, 1)
    assert report.kinds["out_of_bounds:token_id"] == 1 and report.kinds["out_of_bounds:loop:lane_owner"] == 1
    # episode 0's last token and episode 2's end reason differ from the reference, and
    # the count the engine returned no longer matches the running episodes
    assert report.differences == 3 and report.kinds["difference:orch_tokens"] == 1
    assert report.kinds["difference:end_reason"] == 1 and report.kinds["difference:cut_by_max_ticks_count"] == 1


def test_agent_tokens_fill_sampled_entries():
    """Script entries are forced, -1 is <eos>, SAMPLE takes the engine's token at that
    position; without a script the engine's tokens drive the reference."""
    script = np.array([5, SAMPLE, -1, SAMPLE, -1, -1], np.int32)
    assert fuzz.agent_tokens(script, [5, 9, 1, 7]) == [5, 9, fuzz.EOS, 7]
    assert fuzz.agent_tokens(script, [5]) == [5]
    assert fuzz.agent_tokens(None, [3, 4]) == [3, 4]
    assert fuzz.agent_tokens(np.full(4, -1, np.int32), [1]) == []
