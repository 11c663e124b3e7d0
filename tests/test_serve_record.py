"""The token streams a chat server keeps across a harness's requests (swarmjax.serve.record):
a harness that resends its whole history gets the sampled ids kept as sampled, a harness
that edits history opens a new segment counted as template drift, and the stream always
holds exactly what the model was given and sampled."""

import numpy as np
import pytest

from swarmjax.serve.record import ChatStream, message_key
from swarmjax.text.chat import chat_format
from test_text_chat import (CASES, FIRST, SCRIPT, TOOLS, call_dict, hf_toks, message, render, replies,  # noqa: F401
                             tokdirs, toks)


def sampled_turn(fmt, turn, *, spelled=False):
    """A turn's ids as the model samples it: canonical (assistant_ids), or ``spelled``: the
    same text one character at a time, a tokenization no re-render gives."""
    reasoning = turn.reasoning if fmt.thinking else None
    calls = [call_dict(*c) for c in turn.calls]
    ids = fmt.assistant_ids(turn.content, calls, reasoning=reasoning)
    if spelled:
        text = fmt.assistant_text(turn.content, calls, reasoning=reasoning)
        ids = np.concatenate([*(fmt.tokenizer.encode(ch) for ch in text), ids[-1:]]).astype(np.int32)
    return ids


def play(fmt, hf, *, spelled=(), edit_at=None, drop_reasoning=False):
    """Run SCRIPT through a ChatStream as a harness would: each request the whole history.
    Returns (stream, conversation, the ids the server decoded from at each request)."""
    stream, conv, prompts = ChatStream(fmt), list(FIRST), []
    for i, turn in enumerate(SCRIPT):
        if edit_at == i:                                  # the harness rewrites an earlier tool result
            j = next(k for k, m in enumerate(conv) if m["role"] == "tool")
            conv[j] = {"role": "tool", "content": conv[j]["content"] + " (edited)"}
        prompts.append(stream.prompt(conv, tools=TOOLS))
        ids = sampled_turn(fmt, turn, spelled=i in spelled)
        msg = message(fmt, turn, i)
        stream.reply(ids, np.linspace(-1, -0.1, ids.size), msg)
        if drop_reasoning:
            msg = {k: v for k, v in msg.items() if k != "reasoning_content"}
        conv += [msg, *replies(turn)]
        if not replies(turn):
            break
    return stream, conv, prompts


@pytest.mark.parametrize("name,thinking", CASES)
def test_a_resent_history_extends_the_stream(toks, hf_toks, name, thinking):
    """Canonical sampling: every request's ids are apply_chat_template of the history, the
    stream is one segment, the loss mask covers exactly the sampled turns."""
    fmt, hf = chat_format(name, toks[name], thinking=thinking), hf_toks[name]
    stream, conv, prompts = play(fmt, hf)
    for i, ids in enumerate(prompts):
        assert ids.tolist() == render(hf, fmt, conv[:_upto(conv, i)], generation_prompt=True)
    a = stream.trace.arrays()
    assert stream.template_drift == 0 and not stream.trace.segments and stream.requests == len(SCRIPT)
    turns = [sampled_turn(fmt, t) for t in SCRIPT]
    assert int(a["sampled"].sum()) == sum(t.size for t in turns)
    np.testing.assert_array_equal(a["ids"][a["sampled"]], np.concatenate(turns))
    assert (a["logprobs"][~a["sampled"]] == 0).all() and (a["logprobs"][a["sampled"]] < 0).all()
    assert a["turn"].max() == len(SCRIPT) and (a["turn"][:prompts[0].size] == 0).all()


def _upto(conv, i):
    """The number of messages of the history before assistant turn i."""
    seen = -1
    for k, m in enumerate(conv):
        if m["role"] == "assistant":
            seen += 1
            if seen == i:
                return k
    return len(conv)


def test_sampled_ids_are_kept_where_a_re_render_would_differ(toks, hf_toks):
    """A turn sampled as another tokenization of its text: the next request still extends
    the stream (no drift) and the stream keeps the sampled ids, which the re-render does not."""
    fmt, hf = chat_format("qwen3", toks["qwen3"]), hf_toks["qwen3"]
    stream, conv, prompts = play(fmt, hf, spelled={0, 3})
    assert stream.template_drift == 0 and not stream.trace.segments
    spelled = sampled_turn(fmt, SCRIPT[0], spelled=True)
    np.testing.assert_array_equal(prompts[1][prompts[0].size:prompts[0].size + spelled.size], spelled)
    rerender = render(hf, fmt, conv[:_upto(conv, 1)], generation_prompt=True)
    assert prompts[1].tolist() != rerender                 # what re-tokenising the history would have trained on
    assert len(prompts[1]) > len(rerender)


def test_an_edited_history_opens_a_segment_counted_as_drift(toks, hf_toks):
    fmt, hf = chat_format("qwen3", toks["qwen3"]), hf_toks["qwen3"]
    clean, _, clean_prompts = play(fmt, hf)
    stream, conv, prompts = play(fmt, hf, edit_at=2)
    assert stream.template_drift == 1 and len(stream.trace.segments) == 1
    first = stream.trace.segments[0]
    # the closed segment is the stream up to the edit, sampled ids and all
    np.testing.assert_array_equal(first["ids"], np.concatenate([clean_prompts[1], sampled_turn(fmt, SCRIPT[1]),
                                                                fmt.after_turn_ids(sampled_turn(fmt, SCRIPT[1]))]))
    assert int(first["sampled"].sum()) == sampled_turn(fmt, SCRIPT[0]).size + sampled_turn(fmt, SCRIPT[1]).size
    # the new one opens with the re-render of the edited history, nothing of it trained on
    assert prompts[2].tolist() == render(hf, fmt, conv[:_upto(conv, 2)], generation_prompt=True)
    a = stream.trace.arrays()
    assert not a["sampled"][:prompts[2].size].any() and a["sampled"].any()


def test_dropped_reasoning_is_no_drift_and_the_stream_keeps_the_think_block(toks, hf_toks):
    """A harness that echoes assistant turns without reasoning_content (what Qwen3's
    published template drops by design) still extends the stream."""
    fmt, hf = chat_format("qwen3", toks["qwen3"], thinking=True), hf_toks["qwen3"]
    stream, _, _ = play(fmt, hf, drop_reasoning=True)
    assert stream.template_drift == 0
    a = stream.trace.arrays()
    text = fmt.tokenizer.decode(a["ids"][a["sampled"]].tolist())
    assert SCRIPT[0].reasoning in text and SCRIPT[1].reasoning in text


def test_message_keys_and_bad_requests(toks):
    fmt = chat_format("qwen3", toks["qwen3"])
    call = lambda args: {"role": "assistant", "content": " hi\n", "tool_calls": [  # noqa: E731
        {"id": "x", "type": "function", "function": {"name": "search", "arguments": args}}]}
    assert message_key(call('{"b": 1, "a": 2}')) == message_key(call({"a": 2, "b": 1}))
    assert message_key(call('{"a": 3}')) != message_key(call({"a": 2}))
    assert message_key({"role": "assistant", "content": "<think>\nx\n</think>\n\nhi"}) == \
        message_key({"role": "assistant", "content": "hi", "reasoning_content": "y"})
    with pytest.raises(ValueError, match="unknown message role"):
        message_key({"role": "robot", "content": "x"})
    stream = ChatStream(fmt, name="orchestrator")
    with pytest.raises(ValueError, match="end with a user or tool"):
        stream.prompt(FIRST + [{"role": "assistant", "content": "x"}])
    with pytest.raises(RuntimeError, match="no request awaits"):
        stream.reply([1], [0.0], {"role": "assistant", "content": ""})
    before = stream.prompt(FIRST, tools=TOOLS)
    with pytest.raises(RuntimeError, match="awaits its reply"):
        stream.prompt(FIRST, tools=TOOLS)
    with pytest.raises(ValueError, match="differ in length"):
        stream.reply([1, 2], [0.0], {"role": "assistant", "content": ""})
    stream.cancel()                                        # the client went away: as if never asked
    assert len(stream.trace) == 0 and stream.requests == 0
    np.testing.assert_array_equal(stream.prompt(FIRST, tools=TOOLS), before)


def test_cancel_after_a_drift_reopens_the_segment(toks):
    fmt = chat_format("qwen3", toks["qwen3"])
    stream = ChatStream(fmt)
    stream.prompt(FIRST, tools=TOOLS)
    ids = fmt.assistant_ids("done")
    stream.reply(ids, np.full(ids.size, -0.5), {"role": "assistant", "content": "done"})
    kept = stream.trace.arrays()
    stream.prompt([FIRST[0], {"role": "user", "content": "another question"}], tools=TOOLS)
    assert stream.template_drift == 1
    stream.cancel()
    assert stream.template_drift == 0 and not stream.trace.segments
    for k, v in stream.trace.arrays().items():
        np.testing.assert_array_equal(v, kept[k])
    # and the stream still extends as before the cancelled request
    stream.prompt(FIRST + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}], tools=TOOLS)
    assert stream.template_drift == 0
