"""A verifiers v1 environment with a tool, written as ``vf init --add-tool`` scaffolds one and nothing in it
about FleetRL: a taskset of one addition task, a ``vf.Toolset`` MCP server with an ``add`` tool (built per
rollout in ``Task.toolsets``), and a ``@vf.reward`` that reads the agent's last answer.

verifiers loads a taskset by module name (``--env.taskset.id fleetrl_vf_calc``) and starts the toolset as
``python -m fleetrl_vf_calc``: the test puts this directory on ``sys.path`` and ``PYTHONPATH``.
"""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["CalcTaskset"]

QUESTION = "What is 2+3?"
ANSWER = "5"


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class CalcData(vf.TaskData):
    answer: str = ANSWER


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the agent's last reply states the sum."""
        return 1.0 if self.data.answer in trace.last_reply else 0.0


class CalcConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list[CalcTask]:
        return [CalcTask(CalcData(prompt=QUESTION), self.config.task)]


if __name__ == "__main__":
    CalcToolset.run()
