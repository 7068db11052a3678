"""Schemathesis hooks for tests/test_server_openapi.py (loaded through SCHEMATHESIS_HOOKS).

A few refusals depend on more than one field, on the prompt's token count, on the model's chat
template or on what a grammar engine can enforce, which JSON Schema cannot express. The positive-data check may see those as "valid data
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
    "tool_choice needs tools",  # tool_choice without tools
    "which is not among the tools",
)
# Whether a JSON schema, regex, grammar or tool definition can be enforced is the grammar engine's judgement
# (its 400 names the field); JSON Schema can describe their shape, not that.
GRAMMAR_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                  "guided_grammar", "tools")


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    if type(failure).__name__ != "RejectedPositiveData" or response.status_code != 400:
        return True
    try:
        error = json.loads(response.content)["error"]
        message, param = error["message"], error.get("param")
    except (ValueError, KeyError, TypeError):
        return True
    return not (any(refusal in message for refusal in DYNAMIC_REFUSALS) or param in GRAMMAR_FIELDS)
