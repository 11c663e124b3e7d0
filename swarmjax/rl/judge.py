"""Generative reward models: a frozen LLM judge scores answers against rubrics.

Where no verifier exists, the reward comes from a judge (a frozen model: a Hugging Face
checkpoint, or a frozen copy of the policy) asked one question per rubric k about a task
and an answer; its verdicts combine as

    r_judge = sum_k w_k s_k / sum_k w_k,        s_k in [0, 1]

with s_k read from the judge one of two ways (a :class:`Rubric`'s ``mode``):

* ``"yes_no"``: one forward of the prompt, no sampling: the judge's next-token
  distribution p at the position after the generation prompt,
  ``s = p(yes) / (p(yes) + p(no)) = sigmoid(l_yes - l_no)`` (logits l; the two words
  must be single tokens of the judge's tokenizer). Deterministic.
* ``"score"``: the judge writes up to ``max_new_tokens`` ids (the sampler; greedy unless
  the config's sampling says otherwise, then deterministic for a given key) and the
  last ``<score>N</score>`` tag of its text gives ``s = clip(N, 0, max_score) /
  max_score``. A text without a readable tag scores ``unparseable`` and is counted
  (never an exception).

Every prompt of a call is scored in batches of ``batch`` rows (padded to a fixed row
count and to a length bucket, so a batch's composition never changes a score), over an
optional mesh (rows on its batch axes, weights by the logical rules, as the frozen
sub-agents). An episode without an answer scores 0 on every rubric without a judge call.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import forward, param_logical_axes
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.sampling.sampler import Sampler, pad_prompts
from swarmjax.sharding.mesh import DEFAULT_RULES, batch_sharding, tree_shardings
from swarmjax.text.chat import ChatFormat

Array = jax.Array
MODES = ("yes_no", "score")
SYSTEM = "You grade answers. Read the task and the answer, then reply exactly as asked."
_SCORE = re.compile(r"<score>\s*(-?\d+(?:\.\d+)?)\s*</score>")


@dataclasses.dataclass(frozen=True)
class Rubric:
    """One question to the judge. ``name`` keys its logged scores; ``question`` is asked
    after the task and the answer; ``weight`` w_k >= 0; ``mode`` one of :data:`MODES`."""

    name: str
    question: str
    weight: float = 1.0
    mode: str = "yes_no"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"rubric {self.name!r}: mode must be one of {MODES}, got {self.mode!r}")
        if not self.weight >= 0:
            raise ValueError(f"rubric {self.name!r}: weight must be >= 0, got {self.weight}")


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """The judge's rubrics and how it is asked.

    Args:
      rubrics: one or more :class:`Rubric` (weights summing to > 0).
      system: the judge's system prompt.
      yes, no: the words a ``yes_no`` rubric asks for (single tokens of the tokenizer).
      max_score: the top of a ``score`` rubric's scale.
      unparseable: the score of a ``score`` reply without a readable tag.
      max_new_tokens: what a ``score`` reply may write.
      sampling: the ``score`` replies' sampling (default greedy).
      batch: rows a forward or a sampler call scores.
      bucket: prompts are padded to a multiple of this length (fewer compiles).
    """

    rubrics: tuple[Rubric, ...] = (Rubric("correct", "Is the answer correct and complete?"),)
    system: str = SYSTEM
    yes: str = "yes"
    no: str = "no"
    max_score: float = 10.0
    unparseable: float = 0.0
    max_new_tokens: int = 16
    sampling: SamplingConfig = SamplingConfig(temperature=0.0)
    batch: int = 16
    bucket: int = 64

    def __post_init__(self):
        if not self.rubrics:
            raise ValueError("a judge needs at least one rubric")
        if len({r.name for r in self.rubrics}) != len(self.rubrics):
            raise ValueError(f"rubric names must differ: {[r.name for r in self.rubrics]}")
        if not sum(r.weight for r in self.rubrics) > 0:
            raise ValueError("the rubrics' weights sum to 0")
        if self.batch < 1 or self.bucket < 1 or self.max_new_tokens < 1 or not self.max_score > 0:
            raise ValueError("batch, bucket and max_new_tokens must be >= 1 and max_score > 0")


@dataclasses.dataclass
class JudgeScores:
    """Scores of N answers: ``total`` [N] (the weighted mean), ``rubrics`` name -> [N],
    ``unparseable`` name -> how many ``score`` replies had no readable tag, ``replies``
    name -> the ``score`` replies' texts (None for ``yes_no`` rubrics and unanswered)."""

    total: np.ndarray
    rubrics: dict[str, np.ndarray]
    unparseable: dict[str, int]
    replies: dict[str, list[str | None]]


@dataclasses.dataclass(frozen=True)
class RewardMix:
    """How a judge's score and a task's verifier combine into the reward (K2.5 mixes
    both): ``r_perf = verifier * r_verifier + judge * r_judge``; ``verifier=0`` for a task
    with no verifier. Weights >= 0, not both 0."""

    verifier: float = 0.0
    judge: float = 1.0

    def __post_init__(self):
        if not (self.verifier >= 0 and self.judge >= 0 and self.verifier + self.judge > 0):
            raise ValueError(f"reward weights must be >= 0 and not both 0, got {self}")


@dataclasses.dataclass(frozen=True)
class JudgeReward:
    """A job's judge reward: the :class:`JudgeConfig`, the :class:`RewardMix` and the judge
    model: a Hugging Face checkpoint directory ``hf_path`` (its tokenizer beside it; its
    chat format read from the template unless ``chat`` names it), or (None) a frozen copy
    of the policy as RL starts (after its warm start), kept in the checkpoints beside the
    trained params. ``reference``: the judge reads the task's reference answer beside the
    task (the task's ``reference(problem)``; reference-guided grading)."""

    judge: JudgeConfig = JudgeConfig()
    mix: RewardMix = RewardMix()
    hf_path: str | None = None
    chat: str | None = None
    reference: bool = False


def judge_corpus(cfg: JudgeConfig) -> list[str]:
    """Text for a tokenizer trained locally, so the judge's words are its tokens (the
    yes/no words single ids)."""
    asks = [judge_messages(cfg, r, "", "")[1]["content"] for r in cfg.rubrics]
    return ([cfg.system] + asks + [cfg.yes, cfg.no, f" {cfg.yes}", f" {cfg.no}", "<score>7</score>"]) * 50


def mix_rewards(terms: dict[str, np.ndarray], scores: JudgeScores, mix: RewardMix) -> dict[str, np.ndarray]:
    """Reward terms [B] with the judge's: ``r_perf`` mixed (:class:`RewardMix`), the
    verifier's kept as ``r_verifier`` (0 where the task has none), the judge's total as
    ``judge`` and each rubric as ``judge/<name>``."""
    B = len(scores.total)
    verifier = np.asarray(terms.get("r_perf", np.zeros(B)), np.float32)
    out = {**terms, "r_verifier": verifier, "judge": scores.total,
           **{f"judge/{k}": v for k, v in scores.rubrics.items()}}
    out["r_perf"] = (mix.verifier * verifier + mix.judge * scores.total).astype(np.float32)
    return out


def yes_no_scores(params: Any, tokens: Array, mask: Array, *, cfg: ModelConfig, yes: int, no: int) -> Array:
    """[R] ``p(yes) / (p(yes) + p(no)) = sigmoid(l_yes - l_no)`` at each row's last real
    token: tokens, mask [R, T] right-padded (one forward; logits of that position only)."""
    with jax.named_scope("judge_yes_no"):
        last = jnp.sum(mask, axis=1) - 1
        logits = forward(params, cfg, tokens, token_mask=mask, logits_at=last).logits[:, 0]    # [R, V]
        return jax.nn.sigmoid(logits[:, yes] - logits[:, no])


def parse_score(text: str, max_score: float) -> float | None:
    """The last ``<score>N</score>`` of ``text`` as ``clip(N, 0, max_score) / max_score``;
    None when there is none."""
    found = _SCORE.findall(text)
    if not found:
        return None
    return float(np.clip(float(found[-1]), 0.0, max_score) / max_score)


def judge_messages(cfg: JudgeConfig, rubric: Rubric, task: str, answer: str) -> list[dict[str, str]]:
    """The judge's prompt for one rubric, task and answer."""
    ask = (f"Reply {cfg.yes} or {cfg.no}." if rubric.mode == "yes_no" else
           f"Reply <score>N</score> with N from 0 to {cfg.max_score:g}.")
    return [{"role": "system", "content": cfg.system},
            {"role": "user", "content": f"Task:\n{task}\n\nAnswer:\n{answer}\n\n{rubric.question} {ask}"}]


class Judge:
    """A frozen judge model scoring answers (module docstring).

    Args:
      cfg: the :class:`JudgeConfig`.
      model_cfg, params: the judge model (frozen: never updated here).
      chat: its chat format (its tokenizer builds the prompts).
      mesh: optional mesh; rows split over its batch axes, weights by ``rules``.
    """

    def __init__(self, cfg: JudgeConfig, model_cfg: ModelConfig, params: Any, chat: ChatFormat, *,
                 mesh: Mesh | None = None, rules=DEFAULT_RULES):
        tok = chat.tokenizer
        if model_cfg.vocab_size < tok.vocab_size:
            raise ValueError(f"the judge model's vocab_size {model_cfg.vocab_size} is smaller than its "
                             f"tokenizer's ({tok.vocab_size} ids): the model and tokenizer do not belong together")
        self.cfg, self.model_cfg, self.params, self.chat = cfg, model_cfg, params, chat
        self.mesh, self.rules = mesh, rules
        self.word_ids = {}
        if any(r.mode == "yes_no" for r in cfg.rubrics):
            for word in (cfg.yes, cfg.no):
                ids = tok.encode(word)
                if len(ids) != 1:
                    raise ValueError(f"the judge's answer word {word!r} is {len(ids)} tokens of its tokenizer; "
                                     "yes_no rubrics need single-token words (set JudgeConfig.yes / no)")
                self.word_ids[word] = int(ids[0])
        self._pad = tok.token_id(chat.pad_token)
        self._forward = None
        self._sampler = None

    # ---- device

    def _yes_no_fn(self):
        if self._forward is None:
            fn = functools.partial(yes_no_scores, cfg=self.model_cfg, yes=self.word_ids[self.cfg.yes],
                                   no=self.word_ids[self.cfg.no])
            if self.mesh is None:
                self._forward = jax.jit(fn)
            else:
                rows = batch_sharding(self.mesh, 2, rules=self.rules, batch_size=self.cfg.batch)
                self._forward = jax.jit(fn, in_shardings=(
                    tree_shardings(param_logical_axes(self.model_cfg), self.params, self.mesh, self.rules), rows, rows))
        return self._forward

    def _batches(self, prompts: list[np.ndarray]):
        """Fixed-size batches of ``batch`` rows (the last filled with copies of its first
        prompt): (rows, how many are real, T: their longest length rounded up to a
        multiple of ``bucket``)."""
        R, bucket = self.cfg.batch, self.cfg.bucket
        for start in range(0, len(prompts), R):
            chunk = prompts[start:start + R]
            n = len(chunk)
            chunk = chunk + [chunk[0]] * (R - n)
            yield chunk, n, -(-max(len(p) for p in chunk) // bucket) * bucket

    def _yes_no(self, prompts: list[np.ndarray]) -> np.ndarray:
        fn, out = self._yes_no_fn(), []
        for chunk, n, T in self._batches(prompts):
            tokens = np.full((len(chunk), T), self._pad, np.int32)                # right-padded
            mask = np.zeros((len(chunk), T), bool)
            for i, p in enumerate(chunk):
                tokens[i, :len(p)], mask[i, :len(p)] = p, True
            out.append(np.asarray(fn(self.params, jnp.asarray(tokens), jnp.asarray(mask)))[:n])
        return np.concatenate(out) if out else np.zeros((0,), np.float32)

    def _replies(self, prompts: list[np.ndarray], key: Array) -> list[str]:
        if self._sampler is None:
            scfg = dataclasses.replace(self.cfg.sampling, max_new_tokens=self.cfg.max_new_tokens)
            self._sampler = Sampler(self.model_cfg, scfg, mesh=self.mesh, rules=self.rules)
        stops = np.asarray(self.chat.stop_ids, np.int32)
        texts = []
        for b, (chunk, n, length) in enumerate(self._batches(prompts)):
            tokens, mask = pad_prompts(chunk, pad_id=self._pad, length=length)    # left-padded
            out = self._sampler(self.params, tokens, prompt_mask=mask, key=jax.random.fold_in(key, b),
                                stop_tokens=np.broadcast_to(stops, (self.cfg.batch, len(stops))))
            ids, lens = np.asarray(out.tokens), np.asarray(out.lengths)
            texts += [self.chat.tokenizer.decode(ids[i, :lens[i]]) for i in range(n)]
        return texts

    # ---- host entry point

    def __call__(self, tasks: Sequence[str], answers: Sequence[str | None], *, key: Array | None = None
                 ) -> JudgeScores:
        """Score ``answers`` [N] (None: the episode did not answer: 0) of ``tasks`` [N]."""
        if len(tasks) != len(answers):
            raise ValueError(f"{len(tasks)} tasks and {len(answers)} answers")
        key = jax.random.key(0) if key is None else key
        cfg, N = self.cfg, len(tasks)
        live = [i for i, a in enumerate(answers) if a is not None]
        scores, unparseable, replies = {}, {}, {}
        for k, rubric in enumerate(cfg.rubrics):
            prompts = [self.chat.prompt_ids(judge_messages(cfg, rubric, tasks[i], answers[i])) for i in live]
            s = np.zeros((N,), np.float32)
            replies[rubric.name] = [None] * N
            unparseable[rubric.name] = 0
            if prompts and rubric.mode == "yes_no":
                s[live] = self._yes_no(prompts)
            elif prompts:
                for i, text in zip(live, self._replies(prompts, jax.random.fold_in(key, k))):
                    value = parse_score(text, cfg.max_score)
                    unparseable[rubric.name] += value is None
                    s[i] = cfg.unparseable if value is None else value
                    replies[rubric.name][i] = text
            scores[rubric.name] = s
        w = np.asarray([r.weight for r in cfg.rubrics], np.float32)
        total = np.stack([scores[r.name] for r in cfg.rubrics]).T @ w / w.sum()
        return JudgeScores(total=total.astype(np.float32), rubrics=scores, unparseable=unparseable,
                           replies=replies)
