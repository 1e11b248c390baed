"""SGLang's own frontend language against a rollout service, in a process of its own (``import sglang`` patches
transformers process-wide, which the other tests in a pytest worker must not inherit).

    python -m tests.rollout.clients.sglang_frontend URL [--no-select]  ->  one JSON line: {"single", "batch",
    "stream", "select"} (``--no-select``: without ``sgl.select``, whose batch of texts sglang-router does not route)

The program is SGLang's (``sgl.function`` + ``sgl.gen``), run by SGLang's ``RuntimeEndpoint`` and interpreter: the
requests are the ones its code builds. SGLang 0.5.23's package ``__init__`` imports ``triton`` (through
``sglang.srt.utils.common``; a 1 GB GPU compiler the frontend never calls): where it is not installed, an empty
module of that name stands in for it, so the client installs with ``--no-deps`` as the Makefile does.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from importlib.machinery import ModuleSpec

PREFIX = "You are a careful assistant. Answer the question that follows with one short phrase.\n"
"""Longer than 64 characters: ``run_batch`` caches it first (SGLang's ``cache_prefix``: ``max_new_tokens=0``)."""
QUESTIONS = [f"Q: what is {i} plus {i}?\nA:" for i in range(8)]
PICK = "Q: which pet do you like best?\nA:"
CHOICES = [" cat", " dog", " parrot"]
STREAM_TOKENS = 32
"""The streamed run's length (EOS ignored): long enough that SGLang's ``text_iter`` sees it arrive in pieces (4
tokens came as one piece once: the client read after the whole answer had arrived)."""


class _Inert(types.ModuleType):
    """``triton`` and its submodules: every attribute is another inert module, a call returns what it decorates."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Inert(f"{self.__name__}.{name}")
        setattr(self, name, sub)
        return sub

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn


def _stand_in_for_triton() -> None:
    if importlib.util.find_spec("triton") is not None:
        return
    for name in ("triton", "triton.language", "triton.runtime", "triton.runtime.jit", "triton.testing"):
        module = _Inert(name)
        module.__spec__ = ModuleSpec(name, None)
        module.__path__ = []
        module.__version__ = "0.0.0"
        sys.modules[name] = module


def main(url: str, select: bool = True) -> None:
    _stand_in_for_triton()
    import sglang as sgl

    @sgl.function
    def answer(s, question):
        s += PREFIX + question
        s += sgl.gen("answer", max_tokens=4, temperature=0)

    @sgl.function
    def tell(s, question):
        s += PREFIX + question
        s += sgl.gen("answer", max_tokens=STREAM_TOKENS, temperature=0, ignore_eos=True)

    @sgl.function
    def pick(s):
        s += PREFIX + PICK
        s += sgl.select("pet", choices=CHOICES)

    backend = sgl.RuntimeEndpoint(url)
    single = answer.run(question=QUESTIONS[0], backend=backend)["answer"]
    states = answer.run_batch([{"question": q} for q in QUESTIONS], backend=backend, num_threads=8)
    streamed = tell.run(question=QUESTIONS[0], backend=backend, stream=True)
    pieces = list(streamed.text_iter("answer"))
    out = {"version": sgl.__version__, "single": single, "batch": [st["answer"] for st in states],
           "stream_pieces": pieces, "stream": streamed["answer"]}
    if select:
        picked = pick.run(backend=backend)
        out.update({"select": picked["pet"], "select_meta": picked.get_meta_info("pet")})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], select="--no-select" not in sys.argv[2:])
