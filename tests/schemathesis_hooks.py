"""Schemathesis hooks for tests/test_server_openapi.py (loaded through SCHEMATHESIS_HOOKS).

A few refusals depend on more than one field, on the prompt's token count or on the model's chat
template, which JSON Schema cannot express. The positive-data check may see those as "valid data
rejected"; only they are dropped, and only when the server said exactly that (400, OpenAI error body).
"""
from __future__ import annotations

import json

import schemathesis

DYNAMIC_REFUSALS = (
    "maximum context length",  # prompt tokens plus max_tokens beyond --max-model-len
    "does not fit",
    "must not exceed max_tokens",  # min_tokens > max_tokens
    "the chat template refused these messages",  # e.g. a message without content, for this model's template
    "cannot be rendered with the chat template",
    "tool_choice 'required' or a named tool is not supported",  # refused only when tools are given
)


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    if type(failure).__name__ != "RejectedPositiveData" or response.status_code != 400:
        return True
    try:
        message = json.loads(response.content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return True
    return not any(refusal in message for refusal in DYNAMIC_REFUSALS)
