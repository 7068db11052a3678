"""The prompt prefix of a request body, as cumulative block hashes for the prefix-affinity router.

Computed from the raw JSON without tokenizing: the ingress must stay cheap, and text blocks
line up with token blocks well enough to tell which replica holds a conversation's KV cache.
Bodies the replica will reject anyway (bad JSON, unknown shapes) simply get no prefix.
"""
from __future__ import annotations

import hashlib
import json

BLOCK_CHARS = 128  # about 32 tokens of English text
MAX_BLOCKS = 256  # beyond 32k characters the routing decision is long made

# Only these endpoints compute over a prompt; the rest are not worth an affinity.
PROMPT_PATHS = ("/v1/chat/completions", "/v1/completions")


def prefix_hashes(path: str, body: bytes) -> tuple[int, ...]:
    """Hash i covers the prompt text from its start to the end of block i (whole blocks only)."""
    if path not in PROMPT_PATHS:
        return ()
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ()
    if not isinstance(request, dict):
        return ()
    text = _prompt_text(request)
    hashes = []
    running = hashlib.blake2b(digest_size=8)
    for start in range(0, min(len(text), BLOCK_CHARS * MAX_BLOCKS) - BLOCK_CHARS + 1, BLOCK_CHARS):
        running.update(text[start:start + BLOCK_CHARS].encode("utf-8", "surrogatepass"))
        hashes.append(int.from_bytes(running.copy().digest(), "little"))
    return tuple(hashes)


def _prompt_text(request: dict) -> str:
    messages = request.get("messages")
    if isinstance(messages, list):
        # Tools are rendered into the system turn, ahead of every message.
        parts = [json.dumps(request["tools"], sort_keys=True)] if request.get("tools") else []
        for message in messages:
            if isinstance(message, dict):
                parts.append(f"{message.get('role')}\x1f{_content_text(message.get('content'))}\x1e")
        return "".join(parts)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch goes where its first prompt's prefix lives
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        # Token ids: fixed-width text, so a shared id prefix is a shared text prefix.
        return "".join(f"{t:08x}" for t in prompt if isinstance(t, int))
    return ""


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""
