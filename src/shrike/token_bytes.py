"""Each token's raw bytes, and its text as logprobs show it.

Decoding a single token id through the tokenizer turns a token holding part of a UTF-8 character
(an emoji is often split over 2 to 4 byte-level tokens) into U+FFFD, which loses the bytes. Here the
bytes come from the vocabulary itself, so a client can concatenate them back into the exact text.
"""
from __future__ import annotations

import json
import re

from shrike.tokenizer import Tokenizer

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SENTENCEPIECE_SPACE = "\u2581"


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character; this maps it back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + shift)] = byte
            shift += 1
    return chars


class TokenBytes:
    def __init__(self, tokenizer: Tokenizer):
        fast = tokenizer._tokenizer
        spec = json.loads(fast.to_str())
        self._fast = fast
        self._byte_level = "ByteLevel" in json.dumps(spec.get("decoder") or {})
        self._alphabet = _byte_level_alphabet()
        self._added = {token["id"]: token["content"] for token in spec.get("added_tokens", [])}
        self._cache: dict[int, bytes] = {}
        self._rendered: dict[int, str] = {}

    def of(self, token_id: int) -> bytes:
        """The bytes this token contributes to the text (special tokens: their written form)."""
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._compute(token_id)
        return cached

    def _compute(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self._fast.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            if all(ch in self._alphabet for ch in piece):
                return bytes(self._alphabet[ch] for ch in piece)
            return piece.encode("utf-8")
        match = _BYTE_FALLBACK.fullmatch(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        return piece.replace(_SENTENCEPIECE_SPACE, " ").encode("utf-8")

    def text(self, token_id: int) -> str:
        """The token's text; bytes that are not whole UTF-8 characters as OpenAI writes them, `bytes:\\xf0\\x9f`."""
        rendered = self._rendered.get(token_id)
        if rendered is None:
            rendered = self._rendered[token_id] = render(self.of(token_id))
        return rendered


def render(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
