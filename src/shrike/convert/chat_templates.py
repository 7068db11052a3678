"""Chat templates for GGUF files that carry none, by architecture.

Gemma's turn format: <start_of_turn>user / <start_of_turn>model, each turn closed by
<end_of_turn> and a newline; it has no system role, so a system message is prepended to the
first user turn, separated by a blank line.
"""

from __future__ import annotations

_GEMMA = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] if messages[0]['content'] is string "
    "else messages[0]['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') -%}"
    "{%- set first_user_prefix = prefix + '\n\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{{- first_user_prefix if loop.first else '' -}}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_BY_ARCHITECTURE = {"gemma3": _GEMMA}


def default_chat_template(architecture: str) -> str | None:
    return _BY_ARCHITECTURE.get(architecture)
