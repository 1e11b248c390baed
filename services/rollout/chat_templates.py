"""What a request may do to the chat template, and a time bound on rendering one a request supplied.

``chat_template_kwargs`` of ``/v1/chat/completions`` are variables of the model's template (``enable_thinking``
...). A ``chat_template`` among them would replace the model's template with the caller's: refused unless the
operator sets ``trust_request_chat_template`` (vLLM's flag of the same name). Keys that are parameters of
``apply_chat_template`` itself (``tokenize``, ``tools`` ...) are refused too: they are not template variables.

A request's own template (when trusted) is rendered in transformers' sandboxed Jinja environment, is at most
``limits.max_chat_template_chars`` long, may not use ``**`` (Python integer powers run unbounded in one step),
and stops after ``limits.chat_template_timeout_s`` (:func:`within`): a 400, the render thread freed. Rendering
and tokenising always run off the event loop (:meth:`RolloutService.off_loop`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from services.rollout.errors import RequestError

T = TypeVar("T")

TEMPLATE_KEY = "chat_template"
RESERVED = frozenset({
    "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message", "tokenize", "padding",
    "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})
"""``apply_chat_template``'s own parameters: the request sets them by its fields, never through the kwargs."""


class RenderTimeout(BaseException):
    """Rendering ran past its deadline (a BaseException, so that no ``except Exception`` in between keeps it)."""


def check_template_kwargs(kwargs: dict[str, Any] | None, *, trusted: bool, max_chars: int) -> bool:
    """Refuse (400) what a request may not pass to the chat template; True when it supplies its own template."""
    if not kwargs:
        return False
    reserved = sorted(RESERVED & kwargs.keys())
    if reserved:
        raise RequestError(f"chat_template_kwargs may not set {', '.join(reserved)}: these are request fields or "
                           "parameters of the template call, not template variables")
    if TEMPLATE_KEY not in kwargs:
        return False
    if not trusted:
        raise RequestError("chat_template_kwargs.chat_template: this server renders the model's own chat template; "
                           "a request may supply one only when the operator sets trust_request_chat_template")
    template = kwargs[TEMPLATE_KEY]
    if not isinstance(template, str) or not template:
        raise RequestError("chat_template_kwargs.chat_template must be a non-empty Jinja template string")
    if len(template) > max_chars:
        raise RequestError(f"chat_template_kwargs.chat_template has {len(template)} characters; this server takes "
                           f"at most {max_chars} (limits.max_chat_template_chars)")
    _check_operators(template)
    return True


def _check_operators(template: str) -> None:
    from jinja2 import Environment, TemplateSyntaxError, nodes

    try:
        tree = Environment().parse(template)
    except TemplateSyntaxError as exc:
        raise RequestError(f"chat_template_kwargs.chat_template is not a valid Jinja template: {exc}") from None
    if next(tree.find_all(nodes.Pow), None) is not None:
        raise RequestError("chat_template_kwargs.chat_template uses `**`: a request's template may not compute "
                           "powers (one can take unbounded time)")


def within(timeout_s: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in this thread, stopped with a 400 once it has run ``timeout_s``: a trace function
    checks the clock on each line of Python it executes (a Jinja template's loops are Python)."""
    end = time.monotonic() + timeout_s

    def tracer(frame, event, arg):
        if time.monotonic() > end:
            raise RenderTimeout
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return fn(*args, **kwargs)
    except RenderTimeout:
        raise RequestError(f"the request's chat template did not render within {timeout_s:g}s "
                           "(limits.chat_template_timeout_s)") from None
    finally:
        sys.settrace(previous)
