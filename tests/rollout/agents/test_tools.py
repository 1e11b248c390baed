"""Tools: the model's mistakes are observations; the environment's failures fail the trajectory."""

import asyncio

import pytest

from services.rollout.agents.tool_calls import ToolCall
from services.rollout.agents.tools import Tool, ToolBox, ToolFailure, ToolInputError


def calc(expr: str) -> int:
    if not set(expr) <= set("0123456789+-* "):
        raise ToolInputError(f"cannot evaluate {expr!r}: only digits and + - *")
    return eval(expr)  # digits and operators only (checked above)


async def slow(**_):
    await asyncio.sleep(5)


def broken(**_):
    raise KeyError("database gone")


TOOLS = [Tool("calc", calc, "integer arithmetic", {"type": "object", "properties": {"expr": {"type": "string"}},
                                                   "required": ["expr"]}),
         Tool("slow", slow), Tool("broken", broken), Tool("garbage", lambda: object())]


@pytest.fixture()
def box():
    return ToolBox(TOOLS, timeout_s=0.2)


async def test_a_call_returns_text_and_a_tool_message(box):
    result = await box.call(ToolCall("calc", {"expr": "12*34"}, id="call_1"))
    assert (result.content, result.error) == ("408", False)
    assert result.message() == {"role": "tool", "tool_call_id": "call_1", "name": "calc", "content": "408"}
    assert box.schemas()[0]["function"]["parameters"]["required"] == ["expr"]


@pytest.mark.parametrize("call, needle", [
    (ToolCall("nope", {}), "no tool named 'nope'"),
    (ToolCall("calc", {}), "needs the argument(s) ['expr']"),
    (ToolCall("calc", {"expr": "import os"}), "only digits"),
    (ToolCall("calc", {"expr": "1", "extra": 2}), "unexpected keyword argument"),
])
async def test_the_models_mistakes_are_observations(box, call, needle):
    result = await box.call(call)
    assert result.error and needle in result.content and result.content.startswith("error:")


@pytest.mark.parametrize("name, needle", [("slow", "did not answer within 0.2s"),
                                          ("broken", "raised KeyError"), ("garbage", "neither text nor JSON")])
async def test_the_environments_failures_fail_the_trajectory(box, name, needle):
    with pytest.raises(ToolFailure, match=needle):
        await box.call(ToolCall(name, {}))
