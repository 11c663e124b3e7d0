"""A user's own agent harness (a plain loop over the ``openai`` client, its own tools) as
a rollout's environment (swarmjax.serve): the ids the server records for its requests are
the ids TextRollout builds for the same conversation through the generic tool agent, a
harness that rewrites its history is counted as template drift and trains on what was
sampled, and bad requests get OpenAI's error objects without touching any stream."""

import json

import jax
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from swarmjax.envs.harness import HarnessTask  # noqa: E402
from swarmjax.envs.task import EnvContext  # noqa: E402
from swarmjax.envs.tool_env import ToolAgentEnv  # noqa: E402
from swarmjax.models import init_params  # noqa: E402
from swarmjax.models.config import ModelConfig  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.serve.http import AGENT_HEADER, EPISODE_HEADER, HarnessServer  # noqa: E402
from swarmjax.serve.hub import Hub  # noqa: E402
from swarmjax.swarm.text_rollout import TextRollout, TextRolloutConfig, TextScripts  # noqa: E402
from swarmjax.text.bpe import train_bpe_tokenizer  # noqa: E402
from swarmjax.text.chat import chat_format  # noqa: E402
from swarmjax.text.runner import ToolRunner  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402
from swarmjax.text.tools import Tool  # noqa: E402

TABLE = {"alpha": "17", "beta": "42", "gamma": "8", "delta": "23"}
SYSTEM = "You answer questions about a table of keys. Use the lookup tool."


def lookup(key: str) -> str:
    """Look a key up in the table.

    Args:
      key: the key.
    """
    return TABLE.get(key, "unknown key")


TOOL = Tool.from_function(lookup)
SCHEMAS = [TOOL.schema()]


def messages(problem):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is the value of {problem}?"}]


def _streamed(client, model, history):
    """The assistant message of a streamed reply, put together from its chunks as a
    streaming harness does (content, think block, tool calls by index)."""
    msg, calls, usage = {"role": "assistant", "content": ""}, {}, None
    for chunk in client.chat.completions.create(model=model, messages=history, tools=SCHEMAS, stream=True,
                                                stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            d = choice.delta
            msg["content"] += d.content or ""
            if getattr(d, "reasoning_content", None):
                msg["reasoning_content"] = msg.get("reasoning_content", "") + d.reasoning_content
            for c in d.tool_calls or ():
                got = calls.setdefault(c.index, {"id": c.id, "type": "function",
                                                 "function": {"name": c.function.name, "arguments": ""}})
                got["function"]["arguments"] += c.function.arguments or ""
    assert usage is not None and usage.completion_tokens >= 1              # the last chunk: the usage
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        msg["content"] = msg["content"] or None
    return msg


def harness(problem, client, model, *, edit=False, stream=False):
    """The harness under test: its own loop, its own tool execution, no swarmjax import."""
    history = messages(problem)
    for turn in range(4):
        if edit and turn == 1:                               # rewrites its history: template drift
            history[0] = {"role": "system", "content": SYSTEM + " Be brief."}
        if stream:
            msg = _streamed(client, model, history)
        else:
            msg = client.chat.completions.create(model=model, messages=history,
                                                 tools=SCHEMAS).choices[0].message.model_dump(exclude_none=True)
        if not msg.get("tool_calls"):
            return msg["content"]
        history.append({k: v for k, v in msg.items() if v is not None})
        for call in msg["tool_calls"]:
            try:
                out = lookup(**json.loads(call["function"]["arguments"]))
            except (TypeError, ValueError) as e:
                out = f"Error: {e}"
            history.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    return ""


def editing_harness(problem, client, model):
    return harness(problem, client, model, edit=True)


def streaming_harness(problem, client, model):
    return harness(problem, client, model, stream=True)


def score(problem, answer):
    return float(TABLE[problem] in (answer or ""))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    corpus = [SYSTEM, *(f"What is the value of {k}? The value is {v}." for k, v in TABLE.items()),
              json.dumps(SCHEMAS)] * 20
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(
        corpus, tmp_path_factory.mktemp("tok"), vocab_size=400)))
    model = ModelConfig(vocab_size=chat.tokenizer.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                        num_kv_heads=1, head_dim=16, intermediate_size=64)
    runner = ToolRunner([], max_workers=4, timeout_s=5.0)
    rcfg = TextRolloutConfig(contexts=Roles(768, 256), max_turn_tokens=64, subagent_lanes=1, subagent_turns=2,
                             prefill_buckets=(16, 64, 256), min_window=256)
    engine = TextRollout(model, rcfg, stop_ids=chat.stop_ids)
    yield chat, runner, engine, init_params(model, jax.random.key(0))
    engine.close()
    runner.close()


def _call_turn(chat, key):
    return chat.assistant_ids("", [{"name": "lookup", "arguments": {"key": key}}])


def _run(world, envs, problems, scripts):
    chat, _, engine, params = world
    return engine(Roles.both(params), envs, problems, jax.random.key(3), scripts=scripts)


def test_a_harness_gets_the_ids_the_tool_agent_gets(world):
    """The same problems through HarnessTask (an openai-client loop in a thread, its
    replies whole or streamed) and through ToolAgentEnv, the same scripted turns (a lookup
    call, run by each side's own tool, then an answer, right for alpha, wrong for gamma):
    the same ids, loss mask, log-probs, steps and rewards."""
    chat, runner, _, _ = world
    problems = ["alpha", "gamma"]
    scripts = TextScripts(orch=[[_call_turn(chat, p), chat.assistant_ids(f"The value is {v}.")]
                                for p, v in zip(problems, ("17", "9"))])
    want = _run(world, [ToolAgentEnv(chat, [TOOL], runner=runner, messages=messages,
                                     verify=lambda p, a: {"r_perf": score(p, a)}) for p in problems],
                problems, scripts)
    for run in (harness, streaming_harness):
        task = HarnessTask(run=run, verify=score, problems={"train": problems})
        ctx = EnvContext(chat, runner, context=768)
        got = _run(world, [task.env(p, ctx) for p in problems], problems, scripts)
        for field in ("tokens", "length", "loss_mask", "logprobs", "orch_steps", "end_reason"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
        assert got.rewards["r_perf"].tolist() == want.rewards["r_perf"].tolist() == [1.0, 0.0]
        assert got.answers == want.answers == ["The value is 17.", "The value is 9."]
        assert (got.rewards["requests"] == 2).all() and (got.rewards["template_drift"] == 0).all()
        assert (got.rewards["harness_error"] == 0).all(), run.__name__
        hub, server = task.server()
        assert len(hub) == 0 and server.requests == 4 and server.errors == 0


def test_sampled_turns_round_trip_through_the_client_without_drift(world):
    """Turns sampled by a random model (any bytes, broken calls) go to the harness as
    OpenAI messages and come back in its history: every request extends the stream,
    whole replies or streamed ones (the same sampled ids either way)."""
    chat, runner, _, _ = world
    problems = ["alpha", "beta", "gamma", "delta"]
    runs = []
    for run in (harness, streaming_harness):
        task = HarnessTask(run=run, verify=score, problems={"train": problems})
        got = _run(world, [task.env(p, EnvContext(chat, runner, context=768)) for p in problems], problems, None)
        assert (got.rewards["template_drift"] == 0).all() and (got.rewards["harness_error"] == 0).all(), run
        assert got.rewards["requests"].tolist() == got.orch_steps.tolist() and (got.orch_steps >= 1).all()
        assert all(isinstance(a, str) for a in got.answers)
        runs.append(got)
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)


def test_a_harness_that_rewrites_its_history_trains_on_what_was_sampled(world):
    """Its second request does not extend the stream: a new segment (the re-rendered
    history, loss mask 0) counted as template drift; the first segment keeps the sampled
    call as sampled."""
    chat, runner, _, _ = world
    task = HarnessTask(run=editing_harness, verify=score, problems={"train": ["beta"]})
    call = _call_turn(chat, "beta")
    got = _run(world, [task.env("beta", EnvContext(chat, runner, context=768))], ["beta"],
               TextScripts(orch=[[call]]))
    assert got.rewards["template_drift"][0] == 1 and got.orch_steps[0] == 2
    (b, first), = got.segment_rows()
    np.testing.assert_array_equal(first["ids"][first["sampled"]], call)     # the sampled call, as sampled
    last = got.tokens[0, :got.length[0]]
    opening = chat.prompt_ids([{"role": "system", "content": SYSTEM + " Be brief."}, messages("beta")[1]],
                              tools=SCHEMAS)
    assert last[:len(opening)].tolist() == opening.tolist()                 # the edited history, re-rendered
    assert not got.loss_mask[0, :len(opening)].any() and got.loss_mask[0, :got.length[0]].any()


def test_bad_requests_get_openai_errors_and_touch_no_stream(world):
    chat, runner, _, _ = world
    hub = Hub()
    with HarnessServer(hub, model="m", api_key="k3y") as server:
        ep = hub.open()
        client = openai.OpenAI(base_url=server.base_url, api_key="k3y", max_retries=0,
                               default_headers={EPISODE_HEADER: ep.key})
        msgs = messages("alpha")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).chat.completions.create(
                model="m", messages=msgs)
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="other", messages=msgs)
        assert e.value.code == "model_not_found" and e.value.param == "model"
        with pytest.raises(openai.BadRequestError, match="last message"):
            client.chat.completions.create(model="m", messages=[*msgs, {"role": "assistant", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(model="m", messages=msgs, tools=SCHEMAS, tool_choice="required")
        with pytest.raises(openai.BadRequestError, match="stream_options"):
            client.chat.completions.create(model="m", messages=msgs, stream_options={"include_usage": True})
        with pytest.raises(openai.BadRequestError, match="tools"):
            client.chat.completions.create(model="m", messages=msgs, tools=[{"type": "function", "function": {}}])
        with pytest.raises(openai.NotFoundError) as e:
            openai.OpenAI(base_url=server.base_url, api_key="k3y", max_retries=0).chat.completions.create(
                model="m", messages=msgs, user="not-an-episode")
        assert e.value.code == "episode_not_found"
        import urllib.request
        req = urllib.request.Request(server.base_url + "/chat/completions", data=b"{not json",
                                     headers={"Authorization": "Bearer k3y", "Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == 400 and "error" in json.loads(e.value.read())
        assert ep.requests == 0 and server.errors == 8               # nothing reached the episode
        hub.close(ep)
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="m", messages=msgs)
        assert e.value.status_code == 410 and e.value.code == "episode_closed"


def test_a_conversation_past_the_context_is_refused(world):
    """context_length_exceeded, as a server answers it, with the stream unchanged: at the
    first request the harness cannot be trained on (one clear error); at a later one the
    harness sees the error (here it gives up: harness_error) and the episode ends."""
    from swarmjax.serve.harness_env import HarnessError

    chat, runner, _, _ = world
    task = HarnessTask(run=harness, verify=score, problems={"train": ["alpha"]})
    with pytest.raises(HarnessError, match="context holds 40 tokens"):
        _run(world, [task.env("alpha", EnvContext(chat, runner, context=40))], ["alpha"], None)
    call = _call_turn(chat, "alpha")
    fits = len(chat.prompt_ids(messages("alpha"), tools=SCHEMAS)) + len(call) + 3
    got = _run(world, [task.env("alpha", EnvContext(chat, runner, context=fits))], ["alpha"],
               TextScripts(orch=[[call]]))
    assert got.orch_steps[0] == 1 and got.rewards["refused"][0] == 1 and got.rewards["harness_error"][0] == 1
    assert got.rewards["r_perf"][0] == 0 and got.length[0] == fits - 3


def test_64_concurrent_harness_episodes_and_a_malformed_request_beside_them(world):
    """One rollout of 64 harness episodes (64 client threads against one server), with
    malformed requests sent while it runs: every request answered once, every episode's
    stream complete (its requests are its turns), the bad requests refused with 4xx."""
    import threading
    import urllib.request

    chat, runner, _, _ = world
    problems = [list(TABLE)[i % len(TABLE)] for i in range(64)]
    task = HarnessTask(run=harness, verify=score, problems={"train": problems})
    hub, server = task.server()
    before = server.requests
    codes, stop = [], threading.Event()

    def pester():
        while not stop.is_set():
            req = urllib.request.Request(server.base_url + "/chat/completions", data=b'{"model": "swarmjax"}',
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req)
            except urllib.error.HTTPError as e:
                codes.append(e.code)
            stop.wait(0.05)

    thread = threading.Thread(target=pester)
    thread.start()
    try:
        got = _run(world, [task.env(p, EnvContext(chat, runner, context=768)) for p in problems], problems, None)
    finally:
        stop.set()
        thread.join()
    assert codes and set(codes) == {400}
    assert got.rewards["requests"].tolist() == got.orch_steps.tolist() and (got.orch_steps >= 1).all()
    assert (got.rewards["template_drift"] == 0).all() and (got.rewards["harness_error"] == 0).all()
    assert server.requests - before == int(got.rewards["requests"].sum()) and len(hub) == 0


DELEGATE = {"type": "function", "function": {
    "name": "delegate", "description": "Ask a helper to look a key up.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}


def orchestrating_harness(problem, client, model, *, edit=False):
    """An orchestrator that starts its own sub-agents: each delegate call of its turn runs
    a sub-agent (the tool-using harness above; ``edit``: one that rewrites its history) in
    a thread of its own, its requests named by the X-Agent-Id header; their answers (or
    the errors they got) come back as the calls' results."""
    import threading

    history = [{"role": "system", "content": "Delegate lookups."},
               {"role": "user", "content": f"What is the value of {problem}?"}]
    while True:
        msg = client.chat.completions.create(model=model, messages=history, tools=[DELEGATE]).choices[0].message
        msg = msg.model_dump(exclude_none=True)
        if not msg.get("tool_calls"):
            return msg["content"]
        history.append(msg)
        answers = {}

        def sub(i, call):
            named = client.with_options(default_headers={AGENT_HEADER: f"sub-{len(history)}-{i}"})
            try:
                answers[i] = harness(json.loads(call["function"]["arguments"])["key"], named, model, edit=edit)
            except openai.APIStatusError as e:
                answers[i] = f"Error: {e.status_code} {e.code}"
        threads = [threading.Thread(target=sub, args=(i, c)) for i, c in enumerate(msg["tool_calls"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        history += [{"role": "tool", "tool_call_id": c["id"], "content": answers[i]}
                    for i, c in enumerate(msg["tool_calls"])]


@pytest.fixture(scope="module")
def stage_engine(world):
    """A rollout with two sub-agent lanes, sub-agents of two turns."""
    chat, _, engine, _ = world
    stage = TextRollout(engine.cfgs, TextRolloutConfig(contexts=Roles(1024, 1024), max_turn_tokens=128,
                                                        subagent_lanes=2, subagent_turns=2,
                                                        prefill_buckets=(16, 64, 256), min_window=256),
                        stop_ids=chat.stop_ids)
    yield stage
    stage.close()


def _stage_run(world, stage_engine, run, sub_script):
    chat, runner, _, params = world
    delegate = chat.assistant_ids("", [{"name": "delegate", "arguments": {"key": "alpha"}}] * 2)
    final = chat.assistant_ids("The value is 17.")
    task = HarnessTask(run=run, verify=score, problems={"train": ["alpha"]})
    got = stage_engine(Roles.both(params), [task.env("alpha", EnvContext(chat, runner, context=1024))], ["alpha"],
                       jax.random.key(3), scripts=TextScripts(orch=[[delegate, final]],
                                                              workers=[[sub_script, sub_script]]))
    hub, _ = task.server()
    assert len(hub) == 0
    return got


def test_a_harness_that_starts_sub_agents_runs_them_as_a_stage(world, stage_engine):
    """Two sub-agents started together (X-Agent-Id) are one parallel stage of the rollout:
    each its own id stream sampled with the sub-agent parameters (a lookup, then an
    answer), critical steps 1 + 2 + 1 against 6 in all, both finished, their terms under
    subagent/; the orchestrator's stream extends across the stage with no drift."""
    chat = world[0]
    sub = [_call_turn(chat, "alpha"), chat.assistant_ids("The value is 17.")]
    got = _stage_run(world, stage_engine, orchestrating_harness, sub)
    assert got.answers == ["The value is 17."] and got.rewards["r_perf"].tolist() == [1.0]
    assert got.spawned.tolist() == [2] and got.finished.tolist() == [2]
    assert got.critical_steps.tolist() == [4] and got.total_steps.tolist() == [6]
    assert got.rewards["template_drift"].tolist() == [0.0] and got.rewards["harness_error"].tolist() == [0.0]
    assert got.rewards["requests"].tolist() == [2.0] and got.rewards["subagent/requests"].tolist() == [4.0]
    assert got.rewards["subagent/tool_calls"].tolist() == [2.0] and got.rewards["tool_calls"].tolist() == [2.0]
    assert [t.name for t in got.subagents[0]] == ["sub-3-0", "sub-3-1"]          # in the order of their names
    for t in got.subagents[0]:
        ids, sampled = (np.concatenate(x) for x in (t.ids, t.sampled))
        np.testing.assert_array_equal(ids[sampled], np.concatenate(sub))     # each sub-agent's turns, as sampled
        assert t.ok and t.reason == "answer" and t.answer == "The value is 17."


def test_sub_agents_cut_by_their_turn_limit_or_editing_their_history_fail(world, stage_engine):
    """A sub-agent the rollout stops at its turn limit gets 410 agent_stopped; one whose
    harness edits its history gets 400 and ends without an answer: neither finishes, the
    orchestrator goes on with the errors as results, and nothing waits out a timeout."""
    import time

    chat = world[0]
    lookup = _call_turn(chat, "alpha")
    t0 = time.monotonic()
    cut = _stage_run(world, stage_engine, orchestrating_harness, [lookup, lookup])
    edited = _stage_run(world, stage_engine, lambda p, c, m: orchestrating_harness(p, c, m, edit=True), [lookup])
    assert time.monotonic() - t0 < 30
    for got, reason in ((cut, "turns"), (edited, "ended")):
        assert got.spawned.tolist() == [2] and got.finished.tolist() == [0], reason
        assert [t.reason for t in got.subagents[0]] == [reason, reason]
        assert got.answers == ["The value is 17."] and got.rewards["harness_error"].tolist() == [0.0]
    assert edited.rewards["subagent/refused"].tolist() == [2.0]
    assert edited.rewards["subagent/template_drift"].tolist() == [0.0]     # the edited request was taken back
