"""An agent harness through the job's chat server against the same episodes run directly.

    python bench/harness.py [--batch 64] [--sizes 1m 30m] [--repeats 3] [--json]
    python bench/harness.py --slow-tool 0.5     # every 8th episode's tool takes 0.5 s

The harness of ``examples/harness/agent.py`` (a loop over the ``openai`` client, its own
``lookup`` tool) on ``--batch`` problems at once, each in its own thread against one
:class:`~swarmjax.serve.http.HarnessServer`, its requests turned into the rollout's
episodes by :class:`~swarmjax.serve.harness_env.HarnessEnv`; against the same problems
through :class:`~swarmjax.envs.tool_env.ToolAgentEnv` (the tool run in-process, no HTTP),
in one process. Both replay the same turns (a lookup call, then the answer: what a
trained policy does) with the same model, so they do the same device work and build the
same ids (checked); the ratio is what the server, HTTP, JSON and the harness threads
cost. Tokens per second count every id of the episodes (prompts, turns, replies).

``--latency N``: instead, N requests of one client against the server with an engine
that answers at once: a request's round trip through the ``openai`` client and through
raw ``httpx`` (what the server and HTTP cost alone, and what the client adds).

``--slow-tool S``: every 8th episode's tool takes S seconds (in every arm), and a third
arm runs the harnesses as asynchronous environments (``harness_async``: the rollout
decodes the other rows while a harness works, waiting at most ``async_wait`` for all of
them after a decode), so what a slow harness costs the others shows.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "harness"))
from common import base_parser, matmul_peak_flops, time_best  # noqa: E402

import agent  # noqa: E402  (examples/harness/agent.py: the harness)
import lookup_data  # noqa: E402

from swarmjax.envs.harness import HarnessTask  # noqa: E402
from swarmjax.envs.task import EnvContext  # noqa: E402
from swarmjax.envs.tool_env import ToolAgentEnv  # noqa: E402
from swarmjax.models import init_params  # noqa: E402
from swarmjax.models.config import preset  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.swarm.text_rollout import TextRollout, TextRolloutConfig, TextScripts  # noqa: E402
from swarmjax.text.bpe import train_bpe_tokenizer  # noqa: E402
from swarmjax.text.chat import chat_format  # noqa: E402
from swarmjax.text.runner import ToolRunner  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402
from swarmjax.text.tools import Tool  # noqa: E402


def main() -> None:
    p = base_parser(__doc__)
    p.set_defaults(sizes=["1m", "30m"], batch=64)
    p.add_argument("--slow-tool", type=float, default=0.0, help="seconds every 8th episode's tool takes")
    p.add_argument("--env-threads", type=int, default=None,
                   help="threads running environment steps (default: --batch, every episode's round trip at once)")
    p.add_argument("--latency", type=int, default=0, help="N requests of one client against an engine that "
                   "answers at once (round-trip latency only)")
    args = p.parse_args()
    if args.latency:
        return latency(args.latency)
    args.episodes = args.batch
    import tempfile

    problems = lookup_data.problems("test")[:args.episodes]
    slow = {p_["question"] for p_ in problems[::8]} if args.slow_tool else set()

    def run_tool(problem, name, arguments):
        if problem["question"] in slow:
            time.sleep(args.slow_tool)
        return agent.run_tool(problem["store"], name, arguments)

    def solve(problem, client, model):          # the harness, its tool slow for some problems
        return agent.solve(problem, client, model, run_tool=lambda store, name, a: run_tool(problem, name, a))

    task = HarnessTask(run=solve, verify=lookup_data.score, problems={"test": problems},
                       teacher=lookup_data.teacher, model="policy")
    corpus = task.corpus_text + tuple(json.dumps([list(r.messages), list(r.tools), m]) for p_ in problems[:32]
                                      for r, m in task.transcript(p_))
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(list(corpus), tempfile.mkdtemp(),
                                                                           vocab_size=512)))
    runner = ToolRunner([], max_workers=16, timeout_s=10.0)

    def bench_size(size: str) -> dict:
        cfg = preset(size).replace(vocab_size=chat.tokenizer.vocab_size)
        params = Roles.both(init_params(cfg, jax.random.key(0)))
        threads = args.env_threads or args.episodes
        rollout = TextRollout(cfg, TextRolloutConfig(contexts=Roles(512, 64), max_turn_tokens=48, subagent_lanes=1,
                                                     subagent_turns=1, env_threads=threads), stop_ids=chat.stop_ids)
        scripts = TextScripts(orch=[task.demonstration(p_, chat, None).turns for p_ in problems])
        tool = Tool(agent.TOOLS[0]["function"]["name"], agent.TOOLS[0]["function"]["description"],
                    agent.TOOLS[0]["function"]["parameters"], None)
        ctx = EnvContext(chat, runner, context=512)

        def direct_envs():
            def env(p_):
                bound = tool.bind(lambda key, q=p_: run_tool(q, "lookup", json.dumps({"key": key})))
                return ToolAgentEnv(chat, [bound], runner=runner,
                                    messages=lambda q: [{"role": "system", "content": agent.SYSTEM},
                                                        {"role": "user", "content": q["question"]}],
                                    verify=lambda q, a: {"r_perf": lookup_data.score(q, a)})
            return [env(p_) for p_ in problems]

        def async_envs():
            envs = [task.env(p_, ctx) for p_ in problems]
            for e in envs:
                e.asynchronous = True
            return envs

        arms = {"direct": direct_envs, "harness": lambda: [task.env(p_, ctx) for p_ in problems]}
        if args.slow_tool:
            arms["harness_async"] = async_envs
        figures, results = {"size": size, "params": cfg.num_params()}, {}
        for name, envs in arms.items():
            run = lambda: rollout(params, envs(), problems, jax.random.key(1), scripts=scripts)  # noqa: E731
            t0 = time.perf_counter()
            results[name] = run()
            figures[f"{name}_first_s"] = time.perf_counter() - t0
            figures[f"{name}_s"] = time_best(run, args.repeats)
        a, b = results["direct"], results["harness"]
        same = bool(np.array_equal(a.tokens, b.tokens) and np.array_equal(a.loss_mask, b.loss_mask))
        if not same:
            raise SystemExit("the harness and the direct rollout built different ids")
        ids = int(a.length.sum())
        figures.update(ids=ids, identical=same, accuracy=float(b.rewards["r_perf"].mean()),
                       direct_tok_s=ids / figures["direct_s"], harness_tok_s=ids / figures["harness_s"],
                       ratio=figures["direct_s"] / figures["harness_s"],
                       requests=int(b.rewards["requests"].sum()))
        figures.update({f"{name}_tok_s": ids / figures[f"{name}_s"] for name in arms}, arms=list(arms))
        rollout.close()
        return figures

    head = {"jax": jax.__version__, "backend": jax.default_backend(), "peak_flops": matmul_peak_flops(),
            "episodes": len(problems), "env_threads": args.env_threads or args.episodes}
    sizes = {size: bench_size(size) for size in args.sizes}
    runner.close()
    if args.json:
        print(json.dumps({**head, "sizes": sizes}))
        return
    print(f"jax {head['jax']} on {head['backend']} (float32 matmul peak {head['peak_flops'] / 1e9:.1f} GFLOP/s); "
          f"{len(problems)} harness episodes at once (examples/harness), {head['env_threads']} env threads")
    arms = sizes[args.sizes[0]]["arms"]
    print(f"{'size':12}{'arm':15}{'s/batch':>10}{'tok/s':>10}{'first call s':>14}")
    for size, f in sizes.items():
        for name in arms:
            print(f"{size:12}{name:15}{f[name + '_s']:10.3f}{f[name + '_tok_s']:10.0f}{f[name + '_first_s']:14.2f}")
        print(f"{size} ({f['params'] / 1e6:.2f}M, {f['ids']} ids, {f['requests']} requests): harness / direct tok/s "
              f"{f['ratio']:.2f}x, identical ids {f['identical']}" + (
                  f"; every 8th tool {args.slow_tool:g} s: harness_async / harness "
                  f"{f['harness_s'] / f['harness_async_s']:.2f}x" if args.slow_tool else ""))

def latency(n: int) -> None:
    """One request's round trip, ``n`` times: through the ``openai`` client (its reply
    dumped as a harness does) and through raw ``httpx``, against an engine that answers
    every request at once with a lookup call."""
    import threading

    import httpx
    import openai

    from swarmjax.serve.http import EPISODE_HEADER, HarnessServer
    from swarmjax.serve.hub import Hub
    from swarmjax.serve.protocol import completion

    hub = Hub()
    server = HarnessServer(hub, model="policy").start()
    episode = hub.open()
    reply = completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "red fox"}'}}]},
        model="policy", request_id="r", prompt_tokens=1, completion_tokens=1, truncated=False)

    def engine():
        while (event := episode.next_event(5.0)) is not None:
            event.respond(200, reply)
    threading.Thread(target=engine, daemon=True).start()
    messages = [{"role": "system", "content": agent.SYSTEM}, {"role": "user", "content": "What is the value of red fox?"}]
    client = openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0,
                           default_headers={EPISODE_HEADER: episode.key})
    raw = httpx.Client(headers={EPISODE_HEADER: episode.key})
    body = {"model": "policy", "messages": messages, "tools": agent.TOOLS}
    calls = {"openai client": lambda: client.chat.completions.create(
                 model="policy", messages=messages, tools=agent.TOOLS).choices[0].message.model_dump(exclude_none=True),
             "raw httpx": lambda: raw.post(server.base_url + "/chat/completions", json=body).json()}
    print(f"jax {jax.__version__} on {jax.default_backend()} (float32 matmul peak {matmul_peak_flops() / 1e9:.1f} "
          f"GFLOP/s); {n} sequential requests, an engine that answers at once")
    for name, call in calls.items():
        for _ in range(min(n, 20)):
            call()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        print(f"{name:14} {(time.perf_counter() - t0) / n * 1e3:.2f} ms a round trip")
    server.stop()


if __name__ == "__main__":
    main()
