"""``calculator``: an arithmetic task with a ``calculator`` tool; the answer is checked against the task's label.

The first messages are the task's prompt; the model may call ``calculator(expression)`` (``+ - * / // % **``
and parentheses over numbers, evaluated without ``eval``) as often as it likes; the first turn without a tool
call is its answer: reward 1 when the last number in it equals the label, else 0 — or, with
``environment_args: {judge: reward_service}``, no reward of its own: the reward service scores the answer
against the label with the run's scorers.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from services.rollout.agents.environments import EnvReply, EnvStart
from services.rollout.agents.tools import Tool, ToolInputError
from shared.schemas import PromptTask

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def evaluate(expression: str) -> float | int:
    """The value of an arithmetic expression; :class:`ToolInputError` for anything else."""
    def walk(node: ast.AST) -> float | int:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = walk(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ToolInputError("exponent too large")
            return _OPS[type(node.op)](left, right)
        raise ToolInputError(f"not arithmetic: {ast.dump(node)[:60]}")

    if not isinstance(expression, str) or len(expression) > 200:
        raise ToolInputError("expression must be a string of at most 200 characters")
    try:
        return walk(ast.parse(expression, mode="eval").body)
    except SyntaxError as exc:
        raise ToolInputError(f"cannot parse {expression!r}: {exc.msg}") from exc
    except ZeroDivisionError as exc:
        raise ToolInputError("division by zero") from exc


def calculator(expression: str) -> str:
    value = evaluate(expression)
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


CALCULATOR = Tool(
    name="calculator", fn=calculator, description="Evaluate an arithmetic expression.",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


class CalculatorEnv:
    def __init__(self, judge: str = "environment") -> None:
        if judge not in ("environment", "reward_service"):
            raise ValueError(f"judge must be 'environment' or 'reward_service', got {judge!r}")
        self.judge = judge
        self.label: Any = None

    async def reset(self, task: PromptTask) -> EnvStart:
        self.label = task.label
        messages = ([m.model_dump() for m in task.prompt] if isinstance(task.prompt, list)
                    else [{"role": "user", "content": task.prompt or ""}])
        return EnvStart(messages=messages, tools=[CALCULATOR])

    async def step(self, message: dict[str, Any]) -> EnvReply:
        if self.judge == "reward_service":
            return EnvReply(done=True)
        numbers = _NUMBER.findall(message.get("content") or "")
        correct = bool(numbers) and self.label is not None and _same(numbers[-1], self.label)
        return EnvReply(done=True, reward=1.0 if correct else 0.0)

    async def close(self) -> None:
        return None


def _same(answer: str, label: Any) -> bool:
    try:
        return abs(float(answer) - float(label)) < 1e-6
    except (TypeError, ValueError):
        return False
