"""What a text rollout takes and gives: its config, forced scripts, and the
token-in-token-out record of every agent and episode (host numpy). The engine that
fills them is :class:`swarmjax.swarm.text_rollout.TextRollout`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.swarm.context import ContextConfig


@dataclasses.dataclass(frozen=True)
class TextRolloutConfig:
    """Static settings of a text rollout.

    contexts: tokens an orchestrator's / a sub-agent's conversation holds (``Roles``).
    max_turn_tokens: most tokens one turn may sample (a longer turn is cut: ``truncated``).
    subagent_lanes: sub-agent rows on the device; more sub-agents wait for a free lane
      (waiting delays them in wall clock, never changes a step count).
    sampling: how each role samples (``Roles`` of ``SamplingConfig``).
    subagent_turns: S_sub, turns a sub-agent gets before it is stopped.
    budget: critical-step budget (None: lifted).
    prefill_buckets: chunk sizes of the append (each compiles once).
    env_threads: threads that run environment steps (and so tools) of different episodes at once.
    segment_exit: a decode segment ends once this fraction of its rows have finished
      their turn (1.0: when all have). The others resume where they were in the next
      segment, with the rows whose replies were appended meanwhile: continuous batching
      at segment granularity, so one long turn does not keep every row decoding. The
      trajectory does not depend on it (tests check ids and log-probs), only the time.
    decode_slack: tokens a decode segment may sample past its longest conversation
      (None: the whole turn limit). Attention reads every slot of the segment's window,
      so a window sized for the longest row's position plus a short slack, not plus the
      turn limit, is cheaper per step; a row that fills it returns to the host and
      resumes in a wider window next segment (like ``segment_exit``, only the time changes).
    min_window: the narrowest window a call attends over; wider ones step through
      min_window * (1, 1.5, 2, 3, 4, ...), so a rollout compiles a few widths. Decode
      reads the whole window every step: at 32 rows a 128-slot window cut the bench's
      rollout time ~12% against a 256 floor (more widths to compile, once each).
    async_wait: the most seconds the rollout waits, after a decode, for all its
      asynchronous envs' answers before it decodes again without the rest
      (:mod:`swarmjax.swarm.text_rollout`): envs faster than it decode in one batch, a
      slower one delays only its own row. 0: never wait (a server's idle slots).
    context: the orchestrator's context strategy (:mod:`swarmjax.swarm.context`:
      ``none``, ``discard_all``, ``keep_last_round``) and its threshold.
    """

    contexts: Roles[int] = Roles(orchestrator=1024, subagents=512)
    max_turn_tokens: int = 128
    subagent_lanes: int = 8
    subagent_turns: int = 5
    budget: int | None = None
    sampling: Roles[SamplingConfig] = Roles.both(SamplingConfig(temperature=1.0))
    prefill_buckets: tuple[int, ...] = (16, 64, 256)
    env_threads: int = 16
    segment_exit: float = 0.5
    decode_slack: int | None = 64
    min_window: int = 128
    async_wait: float = 1.0
    context: ContextConfig = ContextConfig()

    def __post_init__(self):
        if min(self.contexts.orchestrator, self.contexts.subagents, self.max_turn_tokens, self.subagent_lanes,
               self.subagent_turns, self.env_threads) < 1:
            raise ValueError("contexts, max_turn_tokens, subagent_lanes, subagent_turns and "
                             "env_threads must be >= 1")
        if not self.prefill_buckets or list(self.prefill_buckets) != sorted(set(self.prefill_buckets)) \
                or self.prefill_buckets[0] < 1:
            raise ValueError(f"prefill_buckets must be increasing positive sizes, got {self.prefill_buckets}")
        if self.async_wait < 0:
            raise ValueError(f"async_wait must be >= 0 seconds, got {self.async_wait}")
        if self.min_window < 1:
            raise ValueError(f"min_window must be >= 1, got {self.min_window}")
        if self.decode_slack is not None and self.decode_slack < 1:
            raise ValueError(f"decode_slack must be >= 1 or None, got {self.decode_slack}")
        if not 0.0 < self.segment_exit <= 1.0:
            raise ValueError(f"segment_exit must be in (0, 1], got {self.segment_exit}")
        check_budget(self.budget)


@dataclasses.dataclass(frozen=True)
class SwarmConfig:
    """The jitted swarm's own settings (:class:`~swarmjax.swarm.text_engine.TextSwarm`;
    the host rollout has none of them).

    chunk: F, the most environment ids a row is fed in one tick (a chunked prefill).
    wide_rows: the share of each model's rows fed a chunk in one tick; the others with a
      backlog are fed one id that tick.
    buckets: how many row counts and cache windows each forward of a tick is compiled
      for (``lax.switch`` picks the smallest that holds what it feeds); 1: every row over
      the whole cache each tick, the fewest compiles (a mesh always runs 1).
    episode_keys: each token drawn with its own key, ``fold_in(fold_in(fold_in(key, e), a),
      t)`` for episode id e, agent a (0: the orchestrator, 1 + j: its j-th sub-agent slot)
      and position t in the agent's conversation: an episode samples the same ids whatever
      batch, mesh or process runs it (several processes need it). False: one key split per
      tick for the whole batch (the text PARL recipe's published runs).
    """

    chunk: int = 16
    wide_rows: float = 0.25
    buckets: int = 3
    episode_keys: bool = True

    def __post_init__(self):
        if self.chunk < 1:
            raise ValueError(f"swarm chunk must be >= 1, got {self.chunk}")
        if not 0.0 < self.wide_rows <= 1.0:
            raise ValueError(f"swarm wide_rows must be in (0, 1], got {self.wide_rows}")
        if self.buckets < 1:
            raise ValueError(f"swarm buckets must be >= 1, got {self.buckets}")


def check_budget(budget: int | None) -> None:
    """A critical-step budget (None: lifted) must allow one turn and an answer."""
    if budget is not None and budget < 2:
        raise ValueError(f"budget {budget} is below 2 (one turn and an answer)")


@dataclasses.dataclass(frozen=True)
class TextScripts:
    """Forced turns (tests, replays): ``orch[b]`` the ids of episode b's orchestrator
    turns in order; ``workers[b][k]`` those of its k-th sub-agent (spawn order);
    ``summarizers[b][k]`` the turn of its k-th frozen summariser. An agent whose script
    has run out samples."""

    orch: Sequence[Sequence[np.ndarray]]
    workers: Sequence[Sequence[Sequence[np.ndarray]]] = ()
    summarizers: Sequence[Sequence[np.ndarray]] = ()


@dataclasses.dataclass
class AgentTrace:
    """One agent's conversation as the rollout built it (host numpy).

    ids [T] int32, sampled [T] bool (ids this agent sampled), logprobs / model_logprobs
    [T] f32 (0 off ``sampled``), turn [T] int32 (its own turn a token belongs to, 0: prompt):
    the current segment. ``segments``: the :meth:`arrays` of earlier segments, each its
    own id stream (a context strategy restarted the conversation: :mod:`swarmjax.swarm.context`);
    ``dropped``: the ids those restarts took out of the conversation (what the next
    segment no longer holds: net of the ids it opens with).
    """

    name: str
    ids: list = dataclasses.field(default_factory=list)
    sampled: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    model_logprobs: list = dataclasses.field(default_factory=list)
    turn: list = dataclasses.field(default_factory=list)
    steps: int = 0
    stage: int = 0              # orchestrator step that started it (sub-agents)
    ok: bool = False
    reason: str = "running"
    answer: str | None = None
    segments: list = dataclasses.field(default_factory=list)
    dropped: int = 0

    def restart(self) -> dict[str, np.ndarray]:
        """Close the current segment (kept in ``segments``, returned) and start an empty
        one; turn counting goes on."""
        done = self.arrays()
        self.segments.append(done)
        self.ids, self.sampled, self.logprobs, self.model_logprobs, self.turn = [], [], [], [], []
        return done

    @property
    def peak(self) -> int:
        """The longest segment's length (ids)."""
        return max([len(self), *(len(s["ids"]) for s in self.segments)])

    def append(self, ids, *, sampled: bool, logprobs=None, model_logprobs=None, turn: int | None = None):
        """Append ids (their turn: ``turn``, default ``steps``, the turn they follow)."""
        ids = np.asarray(ids, np.int32)
        zeros = np.zeros(ids.shape, np.float32)
        self.ids.append(ids)
        self.sampled.append(np.full(ids.shape, sampled))
        self.logprobs.append(zeros if logprobs is None else np.asarray(logprobs, np.float32))
        self.model_logprobs.append(zeros if model_logprobs is None else np.asarray(model_logprobs, np.float32))
        self.turn.append(np.full(ids.shape, self.steps if turn is None else turn, np.int32))

    def arrays(self) -> dict[str, np.ndarray]:
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros((0,), dt)
        return {"ids": cat(self.ids, np.int32), "sampled": cat(self.sampled, bool),
                "logprobs": cat(self.logprobs, np.float32),
                "model_logprobs": cat(self.model_logprobs, np.float32), "turn": cat(self.turn, np.int32)}

    def __len__(self) -> int:
        return int(sum(len(x) for x in self.ids))


@dataclasses.dataclass
class TextRolloutResult:
    """Token-in-token-out output of B episodes (C = ``contexts.orchestrator``), host numpy.

    tokens [B, C] int32 (``pad_id`` past length), length [B], loss_mask [B, C] (ids the
    orchestrator sampled), logprobs / model_logprobs [B, C] f32, stage_ids [B, C] int32
    (orchestrator step of each id, 0: prompt): the orchestrator's conversation, or its
    last segment when a context strategy compacted it (the earlier ones:
    ``orchestrators[b].segments``, :meth:`segment_rows`); orch_steps, critical_steps, total_steps,
    spawned, finished [B] int32; end_reason [B] (index into
    :data:`swarmjax.envs.widesearch_jax.END_REASONS`);
    rewards: term -> [B] f32 (summed over each episode's steps); answers: final answer
    text per episode (None without one); orchestrators / subagents: the
    :class:`AgentTrace` of every agent; stats: timings and counts of the rollout;
    summarizers: per episode, the frozen summarisers' traces (``ContextConfig(summarizer=
    "frozen")``; in no training row).
    """

    tokens: np.ndarray
    length: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    model_logprobs: np.ndarray
    stage_ids: np.ndarray
    orch_steps: np.ndarray
    critical_steps: np.ndarray
    total_steps: np.ndarray
    spawned: np.ndarray
    finished: np.ndarray
    end_reason: np.ndarray
    rewards: dict[str, np.ndarray]
    answers: list
    orchestrators: list[AgentTrace]
    subagents: list[list[AgentTrace]]
    stats: dict[str, float]
    summarizers: list[list[AgentTrace]] = dataclasses.field(default_factory=list)

    def segment_rows(self) -> list[tuple[int, dict[str, np.ndarray]]]:
        """(episode, :meth:`AgentTrace.arrays`) of every orchestrator segment before the
        last (episodes a context strategy compacted), in episode order."""
        return [(b, seg) for b, t in enumerate(self.orchestrators) for seg in t.segments]
