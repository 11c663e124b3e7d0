"""``swarmjax serve``: a Hugging Face checkpoint behind an OpenAI-compatible chat endpoint.

    swarmjax serve --hf DIR                       # http://127.0.0.1:8000/v1, greedy
    swarmjax serve --hf DIR --port 9000 --api-key KEY --slots 32 --temperature 0.7

``POST /v1/chat/completions`` (tools, ``tool_choice`` auto/none, ``stream``,
``max_tokens``) and ``GET /v1/models``; concurrent requests are decoded together, a new
one joining the running decode (:mod:`swarmjax.serve.standalone`). It binds to
127.0.0.1 unless ``--host`` says otherwise; ``--api-key`` (or ``SWARMJAX_API_KEY``)
requires ``Authorization: Bearer <key>``. Ctrl-C or SIGTERM stops it: the requests being
decoded finish, waiting ones get 503.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from swarmjax.cli import register


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf", dest="hf_path", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--tokenizer", dest="tokenizer_path", help="tokenizer directory (default: the --hf one)")
    p.add_argument("--chat-format", help="the chat format by name (default: read from the template)")
    p.add_argument("--thinking", action="store_true", help="Qwen3: enable_thinking=True")
    p.add_argument("--model", help="the model name requests give (default: the checkpoint directory's name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
    p.add_argument("--api-key", default=os.environ.get("SWARMJAX_API_KEY"),
                   help="require this bearer token (default: $SWARMJAX_API_KEY, else none)")
    p.add_argument("--slots", type=int, default=16, help="conversations decoded at once")
    p.add_argument("--context", type=int, default=4096, help="ids a conversation may hold, reply included")
    p.add_argument("--max-tokens", type=int, default=512, help="the most ids a reply may sample")
    p.add_argument("--requests-per-slot", type=int, default=64, help="requests a row serves before its round ends")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from swarmjax.cli.sample import read_chat
    from swarmjax.models.hf import from_hf
    from swarmjax.sampling.processors import SamplingConfig
    from swarmjax.serve.http import HarnessServer
    from swarmjax.serve.standalone import ChatEngine, ServeConfig

    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ValueError("swarmjax serve needs aiohttp: pip install 'swarmjax[serve]' (or -e '.[serve]')") from None
    sampling = SamplingConfig(temperature=args.temperature, **{k: v for k, v in dict(
        top_k=args.top_k, top_p=args.top_p).items() if v is not None})
    config = ServeConfig(slots=args.slots, context=args.context, max_tokens=args.max_tokens,
                         requests_per_slot=args.requests_per_slot, sampling=sampling)
    chat, stops = read_chat(args.hf_path, args.tokenizer_path, chat_format=args.chat_format, thinking=args.thinking)
    cfg, params = from_hf(args.hf_path)
    model = args.model or os.path.basename(os.path.normpath(args.hf_path))
    engine = ChatEngine(params, cfg, chat, stop_ids=stops, model=model, config=config, seed=args.seed).start()
    server = HarnessServer(engine.inbox, model=model, host=args.host, port=args.port, api_key=args.api_key)
    try:
        server.start()
    except OSError as e:
        engine.stop()
        raise ValueError(str(e)) from None
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(f"serving {model!r} ({cfg.num_params() / 1e6:.2f}M params, chat format {chat.name}) at "
          f"{server.base_url}: {config.slots} slots, context {config.context}, replies up to "
          f"{config.max_tokens} ids, {'greedy' if sampling.greedy else f'temperature {sampling.temperature:g}'}"
          f"{', API key required' if args.api_key else ''}", flush=True)
    while not done.wait(1.0):
        if engine.failure is not None:
            break
    server.stop()
    engine.stop()
    print(f"stopped: {engine.served} requests answered in {engine.rounds} rounds, {server.errors} refused",
          flush=True)
    if engine.failure is not None:
        raise RuntimeError(f"the engine failed: {engine.failure}") from engine.failure
    return 0


register("serve", "serve a checkpoint on an OpenAI-compatible chat endpoint")((add_arguments, run))
