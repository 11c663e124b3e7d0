"""A numpy adapter over a LOCAL Hugging Face tokenizer directory.

The directory holds ``tokenizer.json`` (the ``tokenizers`` serialization) and
``tokenizer_config.json`` (special-token names, ``added_tokens_decoder``, chat
template). ``TextTokenizer`` reads both with the ``tokenizers`` library only, so it
never downloads and never imports ``transformers``; it encodes exactly as
``transformers`` does inside ``apply_chat_template`` (``add_special_tokens=False``,
added tokens in the text recognised as single ids).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tokenizers

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # where transformers >= 4.51 saves a template of its own
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# The flags that change how an added token is matched in text (``special`` only changes decoding).
_MATCH_FLAGS = ("lstrip", "rstrip", "single_word", "normalized")


class TokenizerError(ValueError):
    """A tokenizer directory that cannot be used; the message names the file."""


@dataclass(frozen=True)
class TextTokenizer:
    """Encode/decode text with a local tokenizer, ids as ``np.int32``.

    Attributes:
      backend: the ``tokenizers.Tokenizer`` (truncation and padding disabled).
      path: the directory it was read from.
      chat_template: the Jinja chat template of ``tokenizer_config.json`` (or of
        ``chat_template.jinja``), None when there is none.
      special_tokens: the named special tokens of the config, e.g.
        ``{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}``.
    """

    backend: tokenizers.Tokenizer
    path: str
    chat_template: str | None
    special_tokens: Mapping[str, str]

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> TextTokenizer:
        """Load ``path/tokenizer.json`` + ``path/tokenizer_config.json``; raises ``TokenizerError``."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise TokenizerError(f"{path}: no such tokenizer directory (nothing is downloaded)")
        tok_file, cfg_file = os.path.join(path, TOKENIZER_FILE), os.path.join(path, CONFIG_FILE)
        for file in (tok_file, cfg_file):
            if not os.path.isfile(file):
                raise TokenizerError(f"{file}: missing (a tokenizer directory needs {TOKENIZER_FILE} "
                                     f"and {CONFIG_FILE})")
        try:
            backend = tokenizers.Tokenizer.from_file(tok_file)
        except Exception as e:  # the Rust side raises a bare Exception for bad JSON or schema
            raise TokenizerError(f"{tok_file}: not a loadable tokenizers file: {e}") from None
        config = _read_config(cfg_file)
        special = _named_tokens(config, cfg_file)
        _reconcile_added_tokens(backend, config, special, cfg_file)
        # transformers keeps encode_special_tokens equal to split_special_tokens (default False).
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        backend.no_truncation()  # an id stream must never be cut or padded behind our back
        backend.no_padding()
        return cls(backend=backend, path=path, chat_template=_chat_template(config, path, cfg_file),
                   special_tokens=special)

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text``: int32 [T]. No BOS/EOS added; added tokens in the text are single ids."""
        return np.asarray(self.backend.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray, *, skip_special_tokens: bool = False) -> str:
        """Text of ids [T] (any int dtype)."""
        return self.backend.decode([int(i) for i in np.asarray(ids).reshape(-1)],
                                   skip_special_tokens=skip_special_tokens)

    def token_id(self, piece: str) -> int:
        """The id of a string that encodes to exactly one id (an added/special token)."""
        ids = self.encode(piece)
        if ids.shape != (1,):
            raise TokenizerError(f"{os.path.join(self.path, TOKENIZER_FILE)}: {piece!r} is not a single token "
                                 f"(encodes to {ids.size} ids)")
        return int(ids[0])

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (ids are 0 .. vocab_size-1)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def added_tokens(self) -> dict[str, int]:
        """Added tokens (special or not), content -> id."""
        return {t.content: i for i, t in self.backend.get_added_tokens_decoder().items()}

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self.special_tokens.get("pad_token")


def _read_config(file: str) -> dict[str, Any]:
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{file}: unreadable JSON: {e}") from None
    if not isinstance(config, dict):
        raise TokenizerError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def _token_content(value: Any, key: str, file: str) -> str | None:
    # The config writes a token either as a string or as a serialized AddedToken dict.
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{file}: {key} is neither a string nor a token object: {value!r}")


def _named_tokens(config: Mapping[str, Any], file: str) -> dict[str, str]:
    named = {k: _token_content(config.get(k), k, file) for k in _NAMED_TOKENS}
    return {k: v for k, v in named.items() if v is not None}


def _reconcile_added_tokens(backend: tokenizers.Tokenizer, config: Mapping[str, Any],
                            named: Mapping[str, str], file: str) -> None:
    """Check the config against tokenizer.json, then apply its added-token flags.

    transformers re-adds the config's ``added_tokens_decoder`` entries (updating an
    existing token's flags) and adds the named special tokens as special added
    tokens; doing the same here keeps ``encode`` identical to its tokenization.
    """
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise TokenizerError(f"{file}: added_tokens_decoder is not an object")
    current = backend.get_added_tokens_decoder()
    updates = []
    for key, spec in decoder.items():
        content = _token_content(spec, f"added_tokens_decoder[{key}]", file)
        if not str(key).isdigit() or content is None:
            raise TokenizerError(f"{file}: bad added_tokens_decoder entry {key!r}: {spec!r}")
        found = backend.token_to_id(content)
        if found != int(key):
            raise TokenizerError(f"{file}: added_tokens_decoder maps id {key} to {content!r}, but "
                                 f"{TOKENIZER_FILE} has it as {'no token' if found is None else f'id {found}'}")
        have = current.get(found)
        want = {f: bool(spec.get(f, getattr(have, f, False))) for f in (*_MATCH_FLAGS, "special")}
        if have is None or any(getattr(have, f) != v for f, v in want.items()):
            updates.append(tokenizers.AddedToken(content, **want))
    for key, content in named.items():
        found = backend.token_to_id(content)
        if found is None:
            raise TokenizerError(f"{file}: {key} {content!r} is not a token of {TOKENIZER_FILE}")
        if found not in current and not any(t.content == content for t in updates):
            updates.append(tokenizers.AddedToken(content, special=True, normalized=False))
    if updates:
        backend.add_tokens(updates)  # tokenizers updates the flags of an existing token in place


def _chat_template(config: Mapping[str, Any], path: str, file: str) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # the multi-template form: [{"name": ..., "template": ...}]
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    if template is None and os.path.isfile(os.path.join(path, TEMPLATE_FILE)):
        with open(os.path.join(path, TEMPLATE_FILE), encoding="utf-8") as f:
            template = f.read()
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{file}: chat_template is not a string")
    return template
