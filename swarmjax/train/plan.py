"""Will it fit? Per-device memory of the learner update and the rollout on a mesh,
planned before booking the machines.

:func:`plan_memory` compiles both programs ahead of time from abstract shapes
(``jax.ShapeDtypeStruct`` with their ``NamedSharding``; nothing is allocated):

* the learner update (:class:`~swarmjax.rl.update.Learner`, the jitted step with
  the state donated) on a batch of ``batch`` trajectories of ``seq`` tokens;
* the rollout: the sampler (:class:`~swarmjax.sampling.sampler.Sampler`) decoding
  ``rollout_batch`` rows of a ``prompt``-token prompt to ``seq`` tokens (its KV cache
  holds ``seq`` slots per row);
* the warm start's step (:func:`~swarmjax.train.sft.sft_program`, what every job's warm
  start runs) on ``warm_batch`` rows of ``seq`` ids for each of ``warm_roles`` roles.

Sizes per device:

* ``params`` / ``opt_state`` / ``frozen`` (the reference model when the loss has a KL
  term): each leaf's shard shape on the mesh times its item size;
* ``temp``: XLA's temporaries of the update (``memory_analysis().temp_size_in_bytes``:
  activations kept for the backward pass, gradients, optimizer scratch);
* ``kv_cache`` and ``rollout_temp``: the rollout's cache and temporaries;
* ``update_total``: XLA's arguments + outputs - donated aliases + temporaries of the update;
  ``rollout_total`` likewise for the rollout, plus the optimizer state and frozen trees,
  which stay resident while it runs; ``warm_start_temp`` / ``warm_start_total`` the warm
  start's step (its own optimizer state; its [B, T, V] log-probs a ``logits_chunk`` of
  positions at a time, as the job runs it); ``total``: the largest.

The compile runs on simulated CPU devices (``swarmjax plan`` asks JAX for as many as
the mesh has), so the numbers are XLA:CPU's view of the SPMD program: a TPU or GPU
compile fuses and lays out differently (and may add its own scratch), so leave
headroom. What is exact is the parameter and optimizer-state arithmetic, and how the
temporaries scale with batch, sequence, mesh and remat.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from swarmjax.models.config import ModelConfig
from swarmjax.models.lora import frozen_part
from swarmjax.models.transformer import abstract_params, init_cache
from swarmjax.optim import OptimConfig
from swarmjax.rl.trajectory import TrajectoryBatch
from swarmjax.rl.update import Learner, TrainState, UpdateConfig
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.sampling.sampler import Sampler
from swarmjax.sharding.mesh import batch_sharding

GIB = 1 << 30

# Memory per chip (HBM) of the accelerators people book: Cloud TPU v5e / v5p / v6e
# (cloud.google.com/tpu/docs/v5e, /v5p, /v6e) and the NVIDIA H100 SXM.
DEVICE_MEMORY: dict[str, int] = {"v5e": 16 * GIB, "v5p": 95 * GIB, "v6e": 32 * GIB, "h100": 80 * GIB}


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes of one configuration (see the module docstring)."""

    params: int
    opt_state: int
    frozen: int
    temp: int
    update_total: int
    kv_cache: int
    rollout_temp: int
    rollout_total: int
    devices: int
    mesh: tuple[int, int, int]
    judge_temp: int = 0
    judge_total: int = 0
    warm_start_temp: int = 0
    warm_start_total: int = 0
    swarm: Any = None                 # a plan_swarm.SwarmPlan of the swarm rollout, or None
    largest: Any = None               # {program: largest_arrays(...)} when asked for

    @property
    def total(self) -> int:
        return max(self.update_total, self.rollout_total, self.judge_total, self.warm_start_total,
                   0 if self.swarm is None else self.swarm.total)

    def fits(self, device: str, *, headroom: float = 0.9) -> bool:
        """Whether ``total`` fits in ``headroom`` of ``device``'s memory (:data:`DEVICE_MEMORY`)."""
        if device not in DEVICE_MEMORY:
            raise ValueError(f"unknown device {device!r}; known: {sorted(DEVICE_MEMORY)}")
        return self.total <= headroom * DEVICE_MEMORY[device]

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["swarm"] = None if self.swarm is None else self.swarm.as_dict()
        out["mesh"] = list(self.mesh)
        out["total"] = self.total
        out["fits"] = {d: self.fits(d) for d in DEVICE_MEMORY}
        return out


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of ``ShapeDtypeStruct`` with shardings: each
    leaf's shard shape (``sharding.shard_shape``) times its item size."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


def with_shardings(tree: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct``s of ``tree``'s leaves with ``shardings`` (a matching tree)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
               "f64": 8, "s64": 8, "u64": 8}
_HLO_ARRAY = re.compile(r"\s*(?:ROOT )?%?[\w.\-]+ = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(")


def largest_arrays(compiled, top: int = 8) -> list[tuple[int, str, str]]:
    """The ``top`` largest arrays a compiled program computes on one device, from its
    optimised HLO: ``(bytes, "dtype[shape] opcode", the JAX op that made it)``, one line
    per (shape, op). What to look at when a plan's temporaries are larger than expected
    (e.g. a batch left whole on every device, or weights gathered whole); it lists
    arrays, not what is live at once (XLA's buffer assignment decides that)."""
    seen: dict[str, tuple[int, str, str]] = {}
    for line in compiled.as_text().splitlines():
        m = _HLO_ARRAY.match(line)
        if not m or m.group(1) not in _ITEM_BYTES or m.group(3) in ("parameter", "bitcast", "get-tuple-element"):
            continue
        array = f"{m.group(1)}[{m.group(2)}]"
        if array not in seen:                       # the first op that makes an array of that shape
            where = re.search(r'op_name="([^"]*)"', line)
            size = math.prod(int(d) for d in m.group(2).split(",") if d) * _ITEM_BYTES[m.group(1)]
            seen[array] = (size, f"{array} {m.group(3)}", where.group(1)[-80:] if where else "")
    return sorted(seen.values(), reverse=True)[:top]


def xla_total(compiled) -> tuple[int, int]:
    """(arguments + outputs - aliased + temporaries, temporaries) of a compiled program."""
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes,
            m.temp_size_in_bytes)


def abstract_train_state(learner: Learner) -> TrainState:
    """The learner's state as shapes with their shardings (the reference model in
    ``frozen`` when the loss has a KL term)."""
    params = abstract_params(learner.model_cfg)
    frozen = {"reference": frozen_part(params)} if learner.cfg.loss.kl_beta > 0 else None   # LoRA: adapters
    state = jax.eval_shape(lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=p,
                                                opt_state=learner.optimizer.init(p), frozen=frozen), params)
    return with_shardings(state, learner.state_shardings(state))


def abstract_batch(mesh: Mesh, batch: int, seq: int) -> TrajectoryBatch:
    """A :class:`TrajectoryBatch` of ``batch`` x ``seq`` as shapes, sharded over the data axes."""
    rows = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    b = TrajectoryBatch(tokens=rows(batch, seq), token_mask=jax.ShapeDtypeStruct((batch, seq), bool),
                        loss_mask=jax.ShapeDtypeStruct((batch, seq), bool),
                        sampler_logprobs=jax.ShapeDtypeStruct((batch, seq), jnp.float32),
                        advantages=jax.ShapeDtypeStruct((batch,), jnp.float32), group_ids=rows(batch),
                        rewards=jax.ShapeDtypeStruct((batch,), jnp.float32))
    return with_shardings(b, jax.tree.map(lambda x: batch_sharding(mesh, x.ndim, batch_size=batch), b))


def plan_update(learner: Learner, batch: int, seq: int):
    """The update compiled ahead of time: (compiled, abstract state)."""
    mesh = learner.mesh
    state = abstract_train_state(learner)
    data = abstract_batch(mesh, batch, seq)
    step = jax.jit(learner._update_impl, donate_argnums=0,
                   in_shardings=(jax.tree.map(lambda x: x.sharding, state), jax.tree.map(lambda x: x.sharding, data)),
                   out_shardings=(jax.tree.map(lambda x: x.sharding, state), NamedSharding(mesh, PartitionSpec())))
    return step.lower(state, data).compile(), state


def plan_rollout(cfg: ModelConfig, mesh: Mesh, batch: int, prompt: int, seq: int):
    """The sampler's generate compiled ahead of time: (compiled, abstract cache)."""
    sampler = Sampler(cfg, SamplingConfig(temperature=1.0, max_new_tokens=seq - prompt), mesh=mesh)
    params = abstract_params(cfg)
    params = with_shardings(params, sampler.param_shardings(params))
    cache = jax.eval_shape(lambda: init_cache(cfg, batch, seq))
    cache = with_shardings(cache, sampler._cache_shardings(batch, seq))
    fn = sampler._compile(params, batch, cache, (False, False, False))
    tokens = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
    mask = jax.ShapeDtypeStruct((batch, prompt), bool)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return fn.lower(params, tokens, mask, key, cache, None, None, None).compile(), cache


def plan_judge(cfg: ModelConfig, mesh: Mesh, batch: int, prompt: int):
    """The judge's yes/no forward (:func:`swarmjax.rl.judge.yes_no_scores`) of model
    ``cfg`` over ``batch`` rows of ``prompt`` ids compiled ahead of time, its weights
    sharded by the logical rules (as the frozen sub-agents')."""
    from swarmjax.models.transformer import param_logical_axes
    from swarmjax.rl.judge import yes_no_scores
    from swarmjax.sharding.mesh import tree_shardings

    params = abstract_params(cfg)
    params = with_shardings(params, tree_shardings(param_logical_axes(cfg), params, mesh))
    rows = batch_sharding(mesh, 2, batch_size=batch)
    fn = jax.jit(functools.partial(yes_no_scores, cfg=cfg, yes=0, no=1),
                 in_shardings=(jax.tree.map(lambda x: x.sharding, params), rows, rows))
    tokens = jax.ShapeDtypeStruct((batch, prompt), jnp.int32, sharding=rows)
    mask = jax.ShapeDtypeStruct((batch, prompt), bool, sharding=rows)
    return fn.lower(params, tokens, mask).compile(), params


def plan_warm_start(cfg: ModelConfig, mesh: Mesh, batch: int, seq: int, *, roles: int = 1,
                    optim: OptimConfig = OptimConfig(), remat: str = "dots"):
    """The warm start's step (:func:`~swarmjax.train.sft.sft_program`: the program every
    job's warm start runs, its logits chunk included) compiled ahead of time for ``roles``
    batches of ``batch`` rows of ``seq`` ids [B, T], its params and optimizer state sharded
    as the job shards them, the rows over the mesh's batch axes, the layers rematerialised
    per ``remat``."""
    from swarmjax.train.sft import sft_program

    params = abstract_params(cfg)
    opt, shardings, opt_shardings, step = sft_program(cfg, optim, params, roles=tuple(f"r{i}" for i in range(roles)),
                                                      mesh=mesh, remat=remat)
    params = with_shardings(params, shardings)
    opt_state = with_shardings(jax.eval_shape(opt.init, params), opt_shardings)
    rows = batch_sharding(mesh, 2, batch_size=batch)
    batches = [tuple(jax.ShapeDtypeStruct((batch, seq), dt, sharding=rows) for dt in (jnp.int32, bool, bool))
               for _ in range(roles)]
    return step.lower(params, opt_state, *batches).compile()


def plan_memory(cfg: ModelConfig, mesh: Mesh, *, batch: int, seq: int, update: UpdateConfig = UpdateConfig(),
                rollout_batch: int | None = None, prompt: int | None = None,
                judge_batch: int = 0, judge_prompt: int = 0, judge_model: ModelConfig | None = None,
                warm_batch: int = 0, warm_roles: int = 1, warm_optim: OptimConfig = OptimConfig(),
                largest: int = 0) -> MemoryPlan:
    """Per-device memory of the update and the rollout of ``cfg`` on ``mesh``.

    Args:
      cfg: the model (e.g. ``PRESETS["qwen3-8b"]``; its ``param_dtype``/``dtype``).
      mesh: a ``(data, fsdp, tensor)`` mesh (:func:`~swarmjax.sharding.mesh.make_mesh`).
      batch: trajectories per update (divisible by the update's mini x micro batches).
      seq: tokens per trajectory, and KV slots per rollout row.
      update: the learner's config (loss, optimizer, minibatches, ``remat``).
      rollout_batch: rows decoded at once (default ``batch``); prompt: prompt tokens of
        a rollout row (default ``seq // 2``).
      judge_batch, judge_prompt: an LLM judge's yes/no forward (:mod:`swarmjax.rl.judge`)
        over that many rows of that many ids (0: no judge); its weights join ``frozen``
        (resident throughout), its run is ``judge_total``.
      judge_model: the judge's model (another checkpoint's shape; None: a frozen copy
        of the policy).
      warm_batch, warm_roles, warm_optim: the warm start's step (:func:`plan_warm_start`)
        on ``warm_roles`` batches of ``warm_batch`` rows of ``seq`` ids (0: not planned),
        its layers rematerialised as the update's (``update.remat``).
      largest: also list each program's that many largest arrays (:func:`largest_arrays`).
    """
    if seq < 2 or batch < 1:
        raise ValueError(f"need batch >= 1 and seq >= 2, got batch={batch}, seq={seq}")
    prompt = seq // 2 if prompt is None else prompt
    if not 0 < prompt < seq:
        raise ValueError(f"prompt must be in [1, seq), got {prompt}")
    learner = Learner(cfg, update, mesh=mesh)
    compiled, state = plan_update(learner, batch, seq)
    update_total, temp = xla_total(compiled)
    rollout, cache = plan_rollout(cfg, mesh, rollout_batch or batch, prompt, seq)
    resident = per_device_bytes(state.opt_state) + (0 if state.frozen is None else per_device_bytes(state.frozen))
    rollout_total, rollout_temp = xla_total(rollout)
    frozen = 0 if state.frozen is None else per_device_bytes(state.frozen)
    judge_total = judge_temp = judge_params = 0
    programs = {"update": compiled, "rollout": rollout}
    if judge_batch and judge_prompt:
        judged, judge_tree = plan_judge(judge_model or cfg, mesh, judge_batch, judge_prompt)
        programs["judge"] = judged
        judge_total, judge_temp = xla_total(judged)
        judge_params = per_device_bytes(judge_tree)
        judge_total += per_device_bytes(state.params) + per_device_bytes(state.opt_state) + frozen  # resident
    warm_total = warm_temp = 0
    if warm_batch:
        programs["warm start"] = plan_warm_start(cfg, mesh, warm_batch, seq, roles=warm_roles, optim=warm_optim,
                                                 remat=update.remat)
        warm_total, warm_temp = xla_total(programs["warm start"])
    return MemoryPlan(params=per_device_bytes(state.params), opt_state=per_device_bytes(state.opt_state),
                      frozen=frozen + judge_params, temp=temp,
                      update_total=update_total + judge_params, kv_cache=per_device_bytes(cache),
                      rollout_temp=rollout_temp, rollout_total=rollout_total + resident + judge_params,
                      devices=mesh.devices.size, mesh=tuple(mesh.devices.shape), judge_temp=judge_temp,
                      judge_total=judge_total, warm_start_temp=warm_temp, warm_start_total=warm_total,
                      largest={k: largest_arrays(c, largest) for k, c in programs.items()} if largest else None)


# what shrinks each program's memory, as ``swarmjax plan`` flags (the job's config fields in
# brackets), most effective first
_REMEDIES: dict[str, tuple[str, ...]] = {
    "update": ("--remat block (rl.update.remat)", "more --microbatches (rl.update.num_microbatches)",
               "a larger fsdp axis in --mesh (mesh.fsdp)", "--lora 16 (lora.rank)"),
    "rollout": ("a smaller --rollout-batch (the rows decoded at once)", "a shorter --seq (rollout.contexts)",
                "a larger fsdp or tensor axis in --mesh (mesh.fsdp, mesh.tensor)"),
    "judge": ("a smaller --judge-batch (judge.batch)", "a shorter --judge-prompt"),
    "warm start": ("--remat block (sft.remat)", "a smaller --warm-batch (sft.batch)",
                   "a larger fsdp axis in --mesh (mesh.fsdp)"),
    "swarm": ("fewer --subagents or --subagent-lanes (rollout.subagent_lanes)", "a shorter --subagent-context",
              "a larger data axis in --mesh (mesh.data)"),
}


def fit_advice(plan: MemoryPlan, device: str, *, headroom: float = 0.9) -> list[str]:
    """Why ``plan`` does not fit ``headroom`` of ``device`` (empty when it fits): each
    program past the line, by how much, and the settings that shrink it."""
    line = headroom * DEVICE_MEMORY[device]
    programs = {"update": plan.update_total, "rollout": plan.rollout_total, "judge": plan.judge_total,
                "warm start": plan.warm_start_total, "swarm": 0 if plan.swarm is None else plan.swarm.total}
    out = []
    for name, total in sorted(programs.items(), key=lambda kv: -kv[1]):
        if total > line:
            out.append(f"does not fit {device} ({DEVICE_MEMORY[device] / GIB:.0f} GiB, {headroom:.0%}): the {name} "
                       f"needs {total / GIB:.2f} GiB a device, {(total - line) / GIB:.2f} over; try "
                       + "; ".join(_REMEDIES[name]))
    return out


def format_plan(plan: MemoryPlan, *, title: str = "") -> str:
    """A small table of the plan in GiB and whether it fits each device."""
    g = lambda n: f"{n / GIB:9.2f}"
    rows = [("params", plan.params), ("opt_state", plan.opt_state), ("frozen", plan.frozen),
            ("update temp", plan.temp), ("update total", plan.update_total), ("kv_cache", plan.kv_cache),
            ("rollout temp", plan.rollout_temp), ("rollout total", plan.rollout_total)]
    if plan.judge_total:
        rows += [("judge temp", plan.judge_temp), ("judge total", plan.judge_total)]
    if plan.warm_start_total:
        rows += [("warm temp", plan.warm_start_temp), ("warm total", plan.warm_start_total)]
    if plan.swarm is not None:
        sw = plan.swarm
        rows += [(f"swarm: {sw.episodes} orchestrator rows, {sw.sub_rows} sub-agent rows", None),
                 ("  orch cache", sw.orch_cache), ("  sub cache", sw.sub_cache), ("  sub params", sw.sub_params),
                 ("  tick temp", sw.tick_temp), ("  swarm total", sw.total)]
    rows.append(("total", plan.total))
    lines = [title] if title else []
    lines.append(f"per device of {plan.devices} (mesh data, fsdp, tensor = {plan.mesh}), GiB:")
    lines += [f"  {name:<14}{g(n)}" if n is not None else f"  {name}" for name, n in rows]
    for program, arrays in (plan.largest or {}).items():
        lines.append(f"  largest arrays of the {program}:")
        lines += [f"    {size / (1 << 20):10.1f} MiB  {array}  {op}" for size, array, op in arrays]
    lines.append("  fits (90% of memory): " + ", ".join(
        f"{d} {DEVICE_MEMORY[d] // GIB} GiB: {'yes' if plan.fits(d) else 'no'}" for d in DEVICE_MEMORY))
    return "\n".join(lines)


def format_summary(plans: list[tuple[str, Any, MemoryPlan]]) -> str:
    """One line a (model, sub-agents K, plan): the update's, the rollout's (the swarm's
    with K) and the step's per-device GiB, and the devices the step fits (90%)."""
    g = lambda n: f"{n / GIB:8.2f}"
    lines = [f"{'model':<22}{'K':>4}{'update':>9}{'rollout':>9}{'total':>9}  fits (90% of memory)"]
    for name, k, p in plans:
        rollout = p.rollout_total if p.swarm is None else p.swarm.total
        fits = ", ".join(d for d in DEVICE_MEMORY if p.fits(d)) or "none"
        lines.append(f"{name:<22}{'-' if k is None else k:>4}{g(p.update_total)}{g(rollout)}{g(p.total)}  {fits}")
    return "\n".join(lines)


def smallest_slices(records: list[dict[str, Any]]) -> dict[tuple[str, Any], dict[str, int | None]]:
    """The fewest devices of each chip kind (:data:`DEVICE_MEMORY`) on which each (model,
    sub-agents K) fits, among the meshes planned.

    ``records``: one dict a plan as ``swarmjax plan --json`` prints them (``model``,
    ``subagents``, ``devices``, ``fits``: :meth:`MemoryPlan.as_dict` and the job's fields).
    Returns {(model, K): {chip: devices, or None when no planned mesh fits}}."""
    out: dict[tuple[str, Any], dict[str, int | None]] = {}
    for r in records:
        best = out.setdefault((r["model"], r.get("subagents")), dict.fromkeys(DEVICE_MEMORY))
        for chip, fits in r["fits"].items():
            if fits and (best[chip] is None or r["devices"] < best[chip]):
                best[chip] = r["devices"]
    return out


def format_slices(records: list[dict[str, Any]]) -> str:
    """The step's per-device GiB of each (model, K) on each mesh planned (columns by mesh,
    ``data x fsdp x tensor``), then the fewest devices among those meshes that hold it on
    each chip kind (90% of its memory; "none": no planned mesh does)."""
    meshes = sorted({tuple(r["mesh"]) for r in records}, key=lambda m: (math.prod(m), m))
    total = {(r["model"], r.get("subagents"), tuple(r["mesh"])): r["total"] for r in records}
    label = lambda m: "x".join(map(str, m))                                    # noqa: E731
    width = max(9, *(len(label(m)) + 2 for m in meshes))
    head = f"{'model':<22}{'K':>4}" + "".join(f"{label(m):>{width}}" for m in meshes) + \
        "".join(f"{chip:>7}" for chip in DEVICE_MEMORY)
    lines = ["per-device GiB of the step on each mesh, and the fewest devices of each chip that hold it:", head]
    for (model, k), best in smallest_slices(records).items():
        cells = "".join(f"{total[model, k, m] / GIB:{width}.2f}" if (model, k, m) in total else f"{'-':>{width}}"
                        for m in meshes)
        fewest = "".join(f"{best[c] or 'none':>7}" for c in DEVICE_MEMORY)
        lines.append(f"{model:<22}{'-' if k is None else k:>4}{cells}{fewest}")
    return "\n".join(lines)
