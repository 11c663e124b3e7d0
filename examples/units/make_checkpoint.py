"""Write a tiny random Hugging Face Qwen3 checkpoint with its own tokenizer:

    python examples/units/make_checkpoint.py [OUT_DIR]     # default: examples/units/tiny-qwen3

The tokenizer is a byte-level BPE trained on the units task's text, with Qwen3's special
tokens and chat template; the model is `transformers`' Qwen3ForCausalLM with random
weights, saved with save_pretrained. Stand-ins for a real checkpoint directory.
"""

import json
import os
import sys

from units_task import UnitsTask

from swarmjax.envs.orchestration import Orchestration
from swarmjax.envs.task import ORCHESTRATOR_NOTE
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import Qwen3Format


def make_checkpoint(out: str, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> str:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from swarmjax.text.tokenizer import TextTokenizer

    task = UnitsTask()
    tools = task.tools() + Orchestration(lambda _: None).tools()          # an orchestrator's prompt too
    fixed = [json.dumps(t.schema()) for t in tools] + [Qwen3Format.TOOLS_HEAD, Qwen3Format.TOOLS_TAIL,
                                                       ORCHESTRATOR_NOTE]
    train_bpe_tokenizer(task.corpus() + fixed * 50, out, vocab_size=1024, chat_format="qwen3")
    vocab = TextTokenizer.from_dir(out).vocab_size
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    Qwen3ForCausalLM(config).save_pretrained(out)
    return out


if __name__ == "__main__":
    print(make_checkpoint(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "tiny-qwen3")))
