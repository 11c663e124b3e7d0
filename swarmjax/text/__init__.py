"""Host-side text (numpy, no jax): ``tokenizer`` (a local Hugging Face tokenizer adapter),
``bpe`` (train a byte-level BPE locally), ``chat`` (chat formats that build token-in-token-out
id streams) and the host tool-call modules; ``device/``: text parsed inside jitted code (tool
calls, JSON, answer lines). Import the module you need; this file imports nothing, so the
tool-call parsers do not pull in the ``tokenizers`` library."""
