"""Train a small judge: supervised fine-tuning on (task, answer, verdict) triples, and
its agreement with the verdicts on held-out triples.

The verdicts come from a verifiable task (an answer is right when its verifier scores
1), so a judge trained here can be measured against the truth before it is trusted as a
reward elsewhere; :func:`episode_triples` reads them off a policy's episodes (e.g.
``evaluate_agent_checkpoint(..., on_result=)`` over a run's checkpoints: answers of the
warm start and of RL, right and wrong). A row is the judge's prompt for a ``yes_no`` rubric
(:func:`~swarmjax.rl.judge.judge_messages`) followed by the reply the judge should
sample, ``yes`` or ``no`` and the end-of-turn id (chat format), with the loss on the
reply alone; the same warm-start step as the policy's
(:func:`~swarmjax.train.agent.warm_start`) trains it. :func:`agreement` then scores the
held-out triples with :class:`~swarmjax.rl.judge.Judge` (p(yes) at the reply's first
position, the one the rows trained) and compares ``p(yes) > 0.5`` with the verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from swarmjax.envs.task import problem_text, reward_terms
from swarmjax.models.config import ModelConfig
from swarmjax.rl.judge import Judge, JudgeConfig, Rubric, judge_messages
from swarmjax.swarm.text_types import TextRolloutResult
from swarmjax.text.chat import ChatFormat
from swarmjax.train.agent import TextSFTConfig, warm_start
from swarmjax.train.demos import Demos

Triple = tuple[str, str, bool]          # (task, answer, the answer is right)


def episode_triples(task: Any, problems: Sequence[Any], res: TextRolloutResult, *,
                    reference: bool = False) -> list[Triple]:
    """A rollout's answered episodes as (task text, answer, right): right when the
    verifier scored the episode 1 (``r_verifier`` where a judge's reward was mixed in,
    else ``r_perf``). Episodes without an answer are left out (nothing to judge).
    ``reference``: the task text holds the task's reference answer (as a judge reward
    with ``reference=True`` reads it)."""
    terms = reward_terms(res.rewards, len(res.length))
    score = terms.get("r_verifier", terms["r_perf"])
    return [(problem_text(task, p, reference=reference), a, bool(score[b] >= 1.0))
            for b, (p, a) in enumerate(zip(problems, res.answers)) if a is not None]


Labelled = Sequence[tuple[Rubric, Sequence[Triple]]]    # each rubric with its own verdicts


def judge_rows(cfg: JudgeConfig, labelled: Labelled, chat: ChatFormat) -> Demos:
    """Right-padded rows [N, T], N the triples of every rubric: the judge's prompt for
    that rubric, then ``yes`` / ``no`` and the stop id (loss on those two ids only)."""
    rows = []
    for rubric, triples in labelled:
        if rubric.mode != "yes_no":
            raise ValueError(f"rubric {rubric.name!r}: a judge is trained on yes_no rubrics, got mode {rubric.mode!r}")
        for task, answer, right in triples:
            prompt = chat.prompt_ids(judge_messages(cfg, rubric, task, answer))
            reply = chat.assistant_ids(cfg.yes if right else cfg.no)
            rows.append((np.concatenate([prompt, reply]), len(prompt)))
    if not rows:
        raise ValueError("no triples to train the judge on")
    T = max(len(r) for r, _ in rows)
    tokens = np.zeros((len(rows), T), np.int32)
    token_mask, loss_mask = np.zeros((len(rows), T), bool), np.zeros((len(rows), T), bool)
    for i, (ids, start) in enumerate(rows):
        tokens[i, :len(ids)], token_mask[i, :len(ids)], loss_mask[i, start:len(ids)] = ids, True, True
    return Demos(tokens=tokens, token_mask=token_mask, loss_mask=loss_mask)


def train_judge(params: Any, model_cfg: ModelConfig, chat: ChatFormat, cfg: JudgeConfig, labelled: Labelled,
                scfg: TextSFTConfig, *, seed: int = 0, on_step=None) -> Any:
    """The judge's params after ``scfg.steps`` SFT steps on the rows of ``labelled``
    (each rubric with its verdicts; module docstring)."""
    return warm_start(params, model_cfg, judge_rows(cfg, labelled, chat), scfg, seed, on_step)


def agreement(judge: Judge, triples: Sequence[Triple], *, rubric: str | None = None) -> dict[str, float]:
    """How the judge's rubric ``rubric`` (None: its first) agrees with the verdicts:
    ``accuracy`` of ``p(yes) > 0.5``, the true-positive and true-negative rates, the mean
    score of right and of wrong answers, ``n`` triples."""
    name = judge.cfg.rubrics[0].name if rubric is None else rubric
    tasks, answers, right = zip(*triples)
    s = judge(list(tasks), list(answers)).rubrics[name]
    right = np.asarray(right, bool)
    said = s > 0.5
    rate = lambda m: float(np.mean(said[m] == right[m])) if m.any() else float("nan")  # noqa: E731
    return {"accuracy": float(np.mean(said == right)), "true_positive_rate": rate(right),
            "true_negative_rate": rate(~right), "score_right": float(np.mean(s[right])) if right.any() else 0.0,
            "score_wrong": float(np.mean(s[~right])) if (~right).any() else 0.0, "n": float(len(right))}
