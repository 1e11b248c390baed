"""Token-in/token-out: stitched ids equal the template's rendering of the whole conversation."""

import pytest
from transformers import AutoTokenizer

from services.rollout.chat_tokens import ChatTokens, TemplateNotAppendOnly


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_stitched_conversation_equals_the_rendered_one(tok):
    ct = ChatTokens(tok)
    msgs = [{"role": "user", "content": "What is 12*34?"}]
    ids = ct.prompt(msgs)
    model_turn = "<tool_call>{}</tool_call>"
    out = tok.encode(model_turn, add_special_tokens=False) + ct.end_of_turn  # the model stopped at end-of-turn
    ids += out + ct.close_turn(out)
    tool = {"role": "tool", "content": "408"}
    ids += ct.delta([tool])
    rendered = ct.render_ids([*msgs, {"role": "assistant", "content": model_turn}, tool], add_generation_prompt=True)
    assert ids == rendered
    assert tok.decode(ct.end_of_turn) == "<|im_end|>" and tok.decode(ct.glue) == "\n"


def test_a_turn_stopped_by_a_stop_string_gets_the_end_of_turn_token(tok):
    ct = ChatTokens(tok)
    out = tok.encode("</tool_call>", add_special_tokens=False)
    assert ct.close_turn(out) == ct.end_of_turn + ct.glue
    assert ct.close_turn(out + ct.end_of_turn) == ct.glue


def test_a_template_that_rewrites_earlier_turns_is_refused(tok):
    tok2 = AutoTokenizer.from_pretrained(tok.name_or_path)
    # renders the number of messages first: adding a message changes the beginning
    tok2.chat_template = ("{{ messages|length }}{% for m in messages %}{{ m['role'] + ':' + m['content'] + '\n' }}"
                          "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    with pytest.raises(TemplateNotAppendOnly):
        ChatTokens(tok2).delta([{"role": "tool", "content": "x"}])


def test_prompts_and_deltas_are_rendered_once_per_message_list(tok, monkeypatch):
    """The n trajectories of a group share their first prompt, and an environment may send the same reply again:
    the template renders each message list once; what comes back is the same ids, and the caller's copy to keep."""
    ct = ChatTokens(tok)
    renders = []
    real = ct.render_ids
    monkeypatch.setattr(ct, "render_ids", lambda *a, **k: renders.append(1) or real(*a, **k))
    msgs = [{"role": "user", "content": "hello"}]
    reply = [{"role": "user", "content": "ok"}]
    first = ct.prompt(msgs)
    first.append(-1)  # the caller's own list: the memo is not changed through it
    assert ct.prompt([dict(m) for m in msgs]) == real(msgs, add_generation_prompt=True)
    assert ct.delta(reply) == ct.delta([{"content": "ok", "role": "user"}])  # key order does not matter
    assert len(renders) == 2  # one prompt, one delta
    assert ct.delta([{"role": "user", "content": "other"}]) != ct.delta(reply) and len(renders) == 3
