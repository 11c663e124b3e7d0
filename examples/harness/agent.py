"""An agent harness as people write them: a loop over the `openai` client with its own
tools. Nothing here knows about swarmjax; `swarmjax train` runs `solve` unchanged
(config.py), pointing the client at its own server.

    python agent.py --base-url http://127.0.0.1:8000/v1 --model my-model   # against any server
"""

from __future__ import annotations

import argparse
import json

SYSTEM = ("You answer questions about a key-value store. Call the lookup tool with the key the "
          "question names, then answer with the value it returns.")
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "The value stored under a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string", "description": "the key"}},
                   "required": ["key"]}}}]


def run_tool(store: dict, name: str, arguments: str) -> str:
    """The harness's own tool execution (errors go back to the model as text)."""
    if name != "lookup":
        return f"Error: no tool named {name!r}"
    try:
        key = json.loads(arguments)["key"]
    except (ValueError, KeyError, TypeError):
        return "Error: lookup takes {\"key\": <string>}"
    return store.get(key, f"Error: no key {key!r} in the store")


def solve(problem: dict, client, model: str, *, max_turns: int = 4, run_tool=run_tool) -> str:
    """Answer ``problem["question"]`` over ``problem["store"]``; returns the final answer
    (``run_tool(store, name, arguments)`` runs a call)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem["question"]}]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(problem["store"], call.function.name, call.function.arguments)})
    return ""


if __name__ == "__main__":
    import openai

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="unused")
    args = p.parse_args()
    store = {"red fox": "17", "blue owl": "42"}
    print(solve({"question": "What is the value of blue owl?", "store": store},
                openai.OpenAI(base_url=args.base_url, api_key=args.api_key), args.model))
