"""``swarmjax serve``'s engine: asynchronous environments in the rollout (a row idles
while its env waits, the others decode), and a checkpoint served to concurrent
``openai`` clients, each reply the greedy decode of its own conversation."""

import json
import os
import signal
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from swarmjax.envs.api import Step
from swarmjax.models import init_params
from swarmjax.models.config import ModelConfig
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.sampling.sampler import Sampler, pad_prompts
from swarmjax.serve.harness_env import reply_message
from swarmjax.serve.http import HarnessServer
from swarmjax.serve.protocol import check_request
from swarmjax.serve.standalone import ChatEngine, ServeConfig
from swarmjax.swarm.text_rollout import TextRollout, TextRolloutConfig
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import chat_format
from swarmjax.text.tokenizer import TextTokenizer

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "the value of a key",
                                            "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                           "required": ["key"]}}}]
QUESTIONS = ["What is the value of alpha?", "Name a colour.", "Count to three.", "What is two plus two?",
             "Say hello.", "What is the value of gamma?", "Spell cat.", "Which is larger, 3 or 5?"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    corpus = [*QUESTIONS, json.dumps(TOOLS), "The value is 17. The answer is four. Hello!"] * 20
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(corpus, path, vocab_size=400)))
    model = ModelConfig(vocab_size=chat.tokenizer.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                        num_kv_heads=1, head_dim=16, intermediate_size=64)
    return chat, model, init_params(model, jax.random.key(0)), str(path)


class Waiter:
    """An asynchronous env: two turns; its first step waits until ``release`` is set
    (by the other episode's env after its own turns), at most 60 s."""

    asynchronous = True

    def __init__(self, prompt, release: threading.Event | None = None, sets: threading.Event | None = None,
                 turns: int = 2):
        self.prompt, self.release, self.sets, self.turns, self.steps = prompt, release, sets, turns, 0

    def reset(self, task):
        return self.prompt

    def step(self, turn, *, truncated=False):
        self.steps += 1
        if self.release is not None and self.steps == 1 and not self.release.wait(60):
            raise AssertionError("the other episode did not decode while this env waited")
        if self.steps >= self.turns:
            if self.sets is not None:
                self.sets.set()
            return Step(done=True, answer="done")
        return Step(reply=self.prompt[:3])


def test_rows_decode_while_an_asynchronous_env_waits(world):
    """Episode 0's env holds its first step until episode 1 has taken 3 turns: the
    rollout must decode episode 1 meanwhile (a rollout that waits for every env step
    before the next decode would wait for ever; the env gives up after 60 s)."""
    chat, model, params, _ = world
    rcfg = TextRolloutConfig(contexts=Roles(256, 64), max_turn_tokens=8, subagent_lanes=1, min_window=128)
    engine = TextRollout(model, rcfg, stop_ids=chat.stop_ids)
    prompt = chat.prompt_ids([{"role": "user", "content": QUESTIONS[0]}])
    gate = threading.Event()
    envs = [Waiter(prompt, release=gate), Waiter(prompt, sets=gate, turns=3)]
    res = engine(Roles.both(params), envs, [None, None], jax.random.key(0))
    engine.close()
    assert res.answers == ["done", "done"] and res.orch_steps.tolist() == [2, 3]
    assert res.stats["env_wait_s"] >= 0.0


def _reference(world, messages: list[list[dict]], max_tokens: int) -> list[np.ndarray]:
    """Each conversation's greedy reply ids (the stop id included when it stopped), by the
    plain sampler, one batch."""
    chat, model, params, _ = world
    prompts = [chat.prompt_ids(m, tools=TOOLS) for m in messages]
    tokens, mask = pad_prompts(prompts)
    sampler = Sampler(model, SamplingConfig(temperature=0.0, max_new_tokens=max_tokens))
    stops = np.tile(np.asarray(chat.stop_ids, np.int32), (len(prompts), 1))
    out = jax.device_get(sampler(params, tokens, prompt_mask=mask, key=jax.random.key(0), stop_tokens=stops))
    return [out.tokens[b, :out.lengths[b]] for b in range(len(prompts))]


def test_concurrent_clients_get_their_own_greedy_replies(world):
    """16 requests from 16 threads against 3 slots that serve 2 requests a round: every
    request answered once, each reply the message the plain greedy sampler's ids give for
    its own conversation (usage and finish reason too); rounds turn over; a request past
    the context gets ``context_length_exceeded``, a bad one 400, without disturbing the
    others."""
    chat, model, params, _ = world
    T = 12
    engine = ChatEngine(params, model, chat, model="tiny", seed=0,
                        config=ServeConfig(slots=3, context=480, max_tokens=T, requests_per_slot=2)).start()
    server = HarnessServer(engine.inbox, model="tiny").start()
    try:
        got = _ask_concurrently(world, server, T)
    finally:
        server.stop()
        engine.stop()
    assert engine.served == 16 and engine.rounds >= 2 and engine.failure is None
    assert len({r.id for r in got.values()}) == 16


def _ask_concurrently(world, server, T):
    chat = world[0]
    client = openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0)
    conversations = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + " " * (i // len(QUESTIONS))}]
                     for i in range(16)]
    got: dict[int, object] = {}
    errors: list = []

    def ask(i):
        try:
            got[i] = client.chat.completions.create(model="tiny", messages=conversations[i], tools=TOOLS,
                                                    max_tokens=T - (i % 3))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                "content": " ".join(map(str, range(600)))}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "assistant", "content": "no user turn"}])
    for t in threads:
        t.join(120)
    assert not errors and sorted(got) == list(range(16))
    assert long.value.code == "context_length_exceeded"
    for limit in (T, T - 1, T - 2):
        idx = [i for i in range(16) if T - (i % 3) == limit]
        for i, ids in zip(idx, _reference(world, [conversations[i] for i in idx], limit)):
            reply = got[i].model_dump()
            req = check_request({"model": "tiny", "messages": conversations[i], "tools": TOOLS}, model="tiny")
            want = reply_message(chat, req, ids, call_id="x")
            have = reply["choices"][0]["message"]
            for call in have.get("tool_calls") or []:
                call["id"] = "x"
            assert {k: have.get(k) for k in want} == want, i
            stopped = len(ids) and ids[-1] in chat.stop_ids
            assert reply["choices"][0]["finish_reason"] in (("stop", "tool_calls") if stopped else ("length",))
            assert reply["usage"]["completion_tokens"] == len(ids)
            assert reply["usage"]["prompt_tokens"] == len(chat.prompt_ids(conversations[i], tools=TOOLS))
    return got


@pytest.mark.slow
def test_serve_command_answers_and_stops_on_sigterm(world, tmp_path):
    """``swarmjax serve --hf DIR`` from a shell: it prints its address, answers an
    ``openai`` client with an API key (and refuses one without), and stops on SIGTERM."""
    from swarmjax.models.hf import to_hf

    chat, model, params, tok = world
    to_hf(model, params, str(tmp_path))
    for name in os.listdir(tok):
        with open(os.path.join(tok, name), "rb") as src, open(tmp_path / name, "wb") as dst:
            dst.write(src.read())
    proc = subprocess.Popen([sys.executable, "-m", "swarmjax", "serve", "--hf", str(tmp_path), "--port", "0",
                             "--chat-format", "qwen3", "--max-tokens", "8", "--context", "256", "--slots", "2",
                             "--api-key", "k3y"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving" in line and "API key required" in line, line
        url = line.split(" at ")[1].split(":", 2)
        base = ":".join(url[:2]) + ":" + url[2].split("/")[0].split()[0] + "/v1"
        model_name = os.path.basename(str(tmp_path))
        ok = openai.OpenAI(base_url=base, api_key="k3y", max_retries=0)
        reply = ok.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say hello."}])
        assert reply.usage.completion_tokens <= 8
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": "hi"}])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped: 1 requests answered" in out, out
