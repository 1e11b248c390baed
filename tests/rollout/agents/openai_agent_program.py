"""An agent program for the openai_agent tests: the plain ``openai`` client configured by nothing but the
environment (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), as any agent is. Two chat turns with a user follow-up
between them; then, on its last stdout line, a reward (its sample index + 0.5) unless told to leave the reward
to the reward service. The task's ``metadata.mode`` picks a misbehaviour: ``crash`` (exit 3 with a message on
stderr), ``hang``, ``no_call``, ``rewrite`` (a third call that does not continue the conversation), ``score``
(no reward line), ``bad_reward``. With ``metadata.record_dir`` it writes the ids and logprobs the server
returned for each turn there (``<task id>-<index>.json``)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import openai


def main() -> int:
    task = json.loads(os.environ["FLEETRL_TASK"])
    if json.loads(sys.stdin.read()) != task:
        print("stdin and FLEETRL_TASK differ", file=sys.stderr)
        return 2
    mode = task["metadata"].get("mode", "chat")
    if mode == "crash":
        print("boom: the agent broke", file=sys.stderr)
        return 3
    if mode == "hang":
        time.sleep(3600)
    if mode == "no_call":
        print(json.dumps({"reward": 1.0}))
        return 0
    client = openai.OpenAI(timeout=60, max_retries=0)  # OPENAI_BASE_URL, OPENAI_API_KEY
    model = os.environ["FLEETRL_MODEL"]
    messages = [{"role": "user", "content": task["prompt"]}]
    turns = []
    for k in range(2):
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=1.0,
                                           logprobs=True, extra_body={"return_token_ids": True})
        choice = r.choices[0]
        turns.append({"prompt_ids": r.model_extra["prompt_token_ids"], "output_ids": choice.model_extra["token_ids"],
                      "logprobs": [c.logprob for c in choice.logprobs.content]})
        messages.append(choice.message.model_dump(exclude_none=True))
        if k == 0:
            messages.append({"role": "user", "content": "Are you sure?"})
    if mode == "rewrite":
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "start over"}], max_tokens=3)
    if task["metadata"].get("record_dir"):
        Path(task["metadata"]["record_dir"], f"{task['id']}-{task['index']}.json").write_text(json.dumps(turns))
    print("agent done")
    if mode == "bad_reward":
        print(json.dumps({"reward": "high"}))
    elif mode != "score":
        reward = task["index"] + 0.5
        print(json.dumps({"reward": reward, "reward_components": {"index": reward}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
