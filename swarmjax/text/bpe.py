"""Train a small byte-level BPE tokenizer directory locally.

This exists so that tests, benches and the CPU configs get a REAL byte-level BPE
(Qwen2/Qwen3 pre-tokenizer, the chat family's added tokens, a chat template)
built on the spot from a few texts: nothing is downloaded, yet the directory
loads with both ``transformers.AutoTokenizer.from_pretrained(out_dir)`` and
``swarmjax.text.TextTokenizer.from_dir(out_dir)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from swarmjax.text.chat import CHAT_FORMATS
from swarmjax.text.tokenizer import CONFIG_FILE, TOKENIZER_FILE

# Qwen2/Qwen3's split pattern (contractions, letter runs, single digits, punctuation runs, newlines, spaces).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level_bpe(*, model: models.BPE | None = None) -> tokenizers.Tokenizer:
    """An (untrained) tokenizer with Qwen2's pipeline, minus its NFC normalizer: byte-level BPE
    needs none, and without it ``decode(encode(s)) == s`` for every string."""
    tok = tokenizers.Tokenizer(model or models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # as Qwen2's tokenizer.json
    return tok


def train_bpe_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, *, vocab_size: int,
                        chat_format: str = "qwen3", model_max_length: int = 32768) -> str:
    """Train a byte-level BPE on ``texts`` and write ``out_dir/{tokenizer.json,tokenizer_config.json}``.

    ``vocab_size`` counts every id: the 256 byte symbols, the learned merges (fewer when the
    texts run out of pairs) and the family's added tokens, which take the last ids. The
    config carries the family's chat template (package data), eos/pad tokens and
    ``added_tokens_decoder``. Returns ``out_dir``.
    """
    if chat_format not in CHAT_FORMATS:
        raise ValueError(f"unknown chat format {chat_format!r}; known: {sorted(CHAT_FORMATS)}")
    fmt = CHAT_FORMATS[chat_format]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(fmt.tokens):
        raise ValueError(f"vocab_size={vocab_size} < 256 bytes + {len(fmt.tokens)} added tokens")
    tok = _byte_level_bpe()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(fmt.tokens), initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    added = [tokenizers.AddedToken(t.content, special=t.special, normalized=False) for t in fmt.tokens]
    tok.add_tokens(added)  # add_tokens keeps each token's own `special` flag (add_special_tokens would not)
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, TOKENIZER_FILE))
    decoder = {str(tok.token_to_id(t.content)): {"content": t.content, "lstrip": False, "normalized": False,
                                                 "rstrip": False, "single_word": False, "special": t.special}
               for t in fmt.tokens}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "bos_token": fmt.bos_token,
        "eos_token": fmt.eos_token,
        "pad_token": fmt.pad_token,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": decoder,
        "chat_template": fmt.template(),
    }
    with open(os.path.join(out_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    return out_dir
