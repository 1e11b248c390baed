"""Tool calls parsed from the model's text: well-formed, several, and every malformed shape an observation."""

import json

import pytest

from services.rollout.agents.tool_calls import ToolCall, parse_tool_calls, render_hermes


def test_one_call_and_the_text_around_it():
    turn = parse_tool_calls('Let me compute. <tool_call>{"name": "calc", "arguments": {"expr": "12*34"}}</tool_call>')
    assert turn.content == "Let me compute." and turn.errors == []
    [call] = turn.calls
    assert (call.name, call.arguments) == ("calc", {"expr": "12*34"})
    oa = call.openai()
    assert oa["type"] == "function" and json.loads(oa["function"]["arguments"]) == {"expr": "12*34"}
    assert oa["id"].startswith("call_")


def test_several_calls_string_arguments_and_a_round_trip():
    calls = [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    turn = parse_tool_calls(render_hermes(calls) + '<tool_call>{"name": "c", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert [(c.name, c.arguments) for c in turn.calls] == [("a", {"x": 1}), ("b", {}), ("c", {"y": 2})]


@pytest.mark.parametrize("body, needle", [
    ('{"name": "calc", "arguments": {"expr": "1+1"', "not valid JSON"),
    ('["calc"]', "must be a JSON object"),
    ('{"arguments": {}}', "no 'name'"),
    ('{"name": "calc", "arguments": [1, 2]}', "must be a JSON object"),
    ('{"name": "calc", "arguments": "{oops"}', "not valid JSON"),
])
def test_malformed_calls_are_errors_to_show_the_model_not_exceptions(body, needle):
    turn = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert turn.calls == [] and len(turn.errors) == 1 and needle in turn.errors[0]


def test_an_unclosed_call_at_the_end_of_a_truncated_turn_is_still_read():
    turn = parse_tool_calls('<tool_call>{"name": "calc", "arguments": {}}')
    assert [c.name for c in turn.calls] == ["calc"]


def test_no_call_is_a_plain_answer():
    turn = parse_tool_calls("The answer is 408.")
    assert turn.calls == [] and turn.errors == [] and turn.content == "The answer is 408."
