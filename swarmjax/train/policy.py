"""The policy a text job starts from: model, tokenizer and chat format.

Workdirs may be local or in an object store (``gs://``): every file goes through
``etils.epath``; a tokenizer is read from a local copy (``tokenizers`` reads local
files only).

The policy (:func:`prepare_policy`):

* ``hf_path``: a Hugging Face checkpoint directory (Qwen3, Qwen2/2.5, Llama;
  :func:`swarmjax.models.hf.from_hf`) and the tokenizer beside it (or ``tokenizer_path``);
* ``tokenizer_path`` alone: that tokenizer and a random model of ``model``'s shape;
* neither (the CPU default): a byte-level BPE trained on the task's ``corpus()`` and a
  random model.

The chat format is the one named (``chat=``) or the one the tokenizer's chat template is
written in (:func:`swarmjax.text.chat.detect_chat_format`). The tokenizer is copied to
``workdir/tokenizer`` and the model's ``config.json`` with the chat format to
``workdir/policy.json``: what ``swarmjax export`` and a resumed run read back.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from etils import epath

from swarmjax.models.config import ModelConfig
from swarmjax.models.hf import config_from_hf, config_to_hf, from_hf, hf_config
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import CHAT_FORMATS, ChatFormat, chat_format, detect_chat_format
from swarmjax.text.tokenizer import CONFIG_FILE as TOKENIZER_CONFIG
from swarmjax.text.tokenizer import TEMPLATE_FILE, TOKENIZER_FILE, TextTokenizer, TokenizerError

TOKENIZER_DIR = "tokenizer"
POLICY_FILE = "policy.json"
_TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG, TEMPLATE_FILE, "special_tokens_map.json")


# ------------------------------------------------------------------------ tokenizers


def _local_copy(directory: str) -> str:
    """A local directory holding ``directory``'s tokenizer files (itself when local)."""
    if "://" not in str(directory):
        return directory
    local = tempfile.mkdtemp(prefix="swarmjax-tokenizer-")
    for name in _TOKENIZER_FILES:
        if (epath.Path(directory) / name).exists():
            (epath.Path(directory) / name).copy(epath.Path(local) / name)
    return local


def copy_tokenizer(source: str, dest: str) -> None:
    """Copy a tokenizer directory's files into the directory ``dest``."""
    out = epath.Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for name in _TOKENIZER_FILES:
        if (epath.Path(source) / name).exists():
            (epath.Path(source) / name).copy(out / name, overwrite=True)


def read_tokenizer(directory: str, *, what: str = "tokenizer directory") -> TextTokenizer:
    """The tokenizer in ``directory`` (local or an object store); one clear error when it
    holds none."""
    path = epath.Path(directory)
    if not path.exists():
        raise ValueError(f"{what} {directory} does not exist")
    if not (path / TOKENIZER_FILE).exists() or not (path / TOKENIZER_CONFIG).exists():
        raise ValueError(f"{what} {directory} holds no tokenizer ({TOKENIZER_FILE} and {TOKENIZER_CONFIG}); "
                         "pass tokenizer_path= to a tokenizer directory")
    local = _local_copy(directory)
    try:
        return dataclasses.replace(TextTokenizer.from_dir(local), path=str(directory))   # named as given
    except TokenizerError as e:
        raise ValueError(str(e)) from None
    finally:
        if local != directory:
            shutil.rmtree(local, ignore_errors=True)


def train_tokenizer(corpus: list[str], workdir: str, chat: str, vocab_size: int) -> None:
    """A byte-level BPE trained on ``corpus`` plus the chat format's fixed texts (tool
    preamble, ...: merged into few ids), written to ``workdir/tokenizer``."""
    fixed = CHAT_FORMATS[chat].fixed_texts()
    with tempfile.TemporaryDirectory(prefix="swarmjax-bpe-") as tmp:
        train_bpe_tokenizer(corpus + fixed * 50, tmp, vocab_size=vocab_size, chat_format=chat)
        copy_tokenizer(tmp, str(epath.Path(workdir) / TOKENIZER_DIR))


def task_chat(corpus: list[str], workdir: str, chat: str, vocab_size: int) -> ChatFormat:
    """:func:`train_tokenizer`, then its chat format."""
    train_tokenizer(corpus, workdir, chat, vocab_size)
    return load_chat(workdir, chat)


def load_chat(workdir: str, chat: str) -> ChatFormat:
    """The chat format over the tokenizer a run saved in ``workdir/tokenizer``."""
    tok_dir = str(epath.Path(workdir) / TOKENIZER_DIR)
    if not (epath.Path(tok_dir) / TOKENIZER_FILE).exists():
        raise ValueError(f"{workdir} holds no tokenizer ({tok_dir}): not a text run's workdir")
    return chat_format(chat, read_tokenizer(tok_dir))


# ------------------------------------------------------------------------ the policy


@dataclasses.dataclass(frozen=True)
class PolicySource:
    """Where a text job's policy comes from (module docstring).

    hf_path: a Hugging Face checkpoint directory (weights, ``config.json``, usually the
      tokenizer); None: a random model of ``model``'s shape.
    tokenizer_path: a tokenizer directory (default: ``hf_path``'s; without either, a BPE
      of ``tokenizer_vocab`` ids is trained on the task's corpus).
    chat: a key of ``CHAT_FORMATS``; None: read from the tokenizer's chat template
      ("qwen3" for a trained BPE).
    model: the random model's shape (its ``vocab_size`` is the tokenizer's).
    """

    hf_path: str | None = None
    tokenizer_path: str | None = None
    chat: str | None = None
    tokenizer_vocab: int = 1024
    model: ModelConfig = ModelConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                                     intermediate_size=384)

    def __post_init__(self):
        if self.chat is not None and self.chat not in CHAT_FORMATS:
            raise ValueError(f"unknown chat format {self.chat!r}; known: {sorted(CHAT_FORMATS)}")
        if self.tokenizer_vocab < 300:
            raise ValueError("tokenizer_vocab must be >= 300 (bytes + merges)")

    def check(self) -> None:
        """One-line errors, naming the path as given, for what :func:`prepare_policy` would
        fail on: an ``hf_path`` that does not exist, is not local, or holds no
        ``config.json``; a tokenizer directory that does not exist or holds no tokenizer;
        a tokenizer without a chat template when ``chat`` is not named. Reads only."""
        if self.hf_path is not None:
            if "://" in self.hf_path:
                raise ValueError(f"hf_path {self.hf_path}: the weights are read from a local directory")
            if not epath.Path(self.hf_path).exists():
                raise ValueError(f"hf_path {self.hf_path} does not exist")
            hf_config(self.hf_path)                      # a checkpoint directory: its config.json
        source = self.tokenizer_path or self.hf_path
        if source is not None:
            tokenizer = read_tokenizer(source, what="tokenizer_path" if self.tokenizer_path else "hf_path")
            if self.chat is None:
                detect_chat_format(tokenizer)


def prepare_policy(src: PolicySource, workdir: str, *, fresh: bool,
                   corpus: Callable[[], list[str]] | None, write: bool = True) -> tuple[ModelConfig, Any, ChatFormat]:
    """(model config, initial params or None, chat format) of a run (module docstring).

    ``fresh``: a new run: the tokenizer is copied (or trained on ``corpus()``) to
    ``workdir/tokenizer`` and ``workdir/policy.json`` written (unless ``write`` is False:
    the processes of a job but the first read what it wrote); else both are read back.
    Params are the checkpoint's when ``hf_path`` is set on a fresh run, else None (a
    random init from the job's key, or the run's checkpoint). Raises ValueError for a
    checkpoint without a tokenizer, a tokenizer without a chat template and no ``chat``,
    and a model vocabulary smaller than the tokenizer's."""
    params = None
    if fresh and write:
        source = src.tokenizer_path or src.hf_path
        if source is not None:
            read_tokenizer(source, what="tokenizer_path" if src.tokenizer_path else "hf_path")   # checked first
            copy_tokenizer(source, str(epath.Path(workdir) / TOKENIZER_DIR))
        else:
            if corpus is None:
                raise ValueError("the task has no corpus() to train a tokenizer on: give hf_path or tokenizer_path")
            train_tokenizer(corpus(), workdir, src.chat or "qwen3", src.tokenizer_vocab)
    tokenizer = read_tokenizer(str(epath.Path(workdir) / TOKENIZER_DIR), what="workdir")
    name = src.chat or ("qwen3" if src.tokenizer_path is None and src.hf_path is None else
                        detect_chat_format(tokenizer))
    chat = chat_format(name, tokenizer)
    if src.hf_path is not None:
        if not fresh:
            cfg = hf_config(src.hf_path)         # the weights are the run's checkpoint's
        else:
            cfg, params = from_hf(src.hf_path)
        if cfg.vocab_size < tokenizer.vocab_size:
            raise ValueError(f"the model's vocabulary ({cfg.vocab_size} ids, {src.hf_path}) is smaller than its "
                             f"tokenizer's ({tokenizer.vocab_size} ids): not a matching pair")
    else:
        cfg = src.model.replace(vocab_size=tokenizer.vocab_size)
    if fresh and write:
        (epath.Path(workdir) / POLICY_FILE).write_text(json.dumps({"chat": name, "model": config_to_hf(cfg)},
                                                                  indent=2))
    return cfg, params, chat


def read_policy(workdir: str) -> tuple[ModelConfig, ChatFormat]:
    """The model config and chat format a run wrote (``policy.json``, ``tokenizer/``)."""
    file = epath.Path(workdir) / POLICY_FILE
    if not file.exists():
        raise ValueError(f"{workdir} holds no {POLICY_FILE}: not a text run's workdir")
    policy = json.loads(file.read_text())
    cfg = config_from_hf(policy["model"], source=str(file))[0]
    return cfg, load_chat(workdir, policy["chat"])
