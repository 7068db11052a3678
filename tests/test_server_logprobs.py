"""Logprobs a client can rebuild text from: raw token bytes, prompt scoring with echo, /tokenizer_info."""
from __future__ import annotations

import httpx
import openai
import pytest
from test_server_lifecycle import SERVED_NAME, running_server

from shrike.token_bytes import TokenBytes, render
from shrike.tokenizer import Tokenizer

TEXT = "Grüße 😀 and 你好世界 🐉!"


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logprobs") / "server.log"
    with running_server(default_model_dir, log, "--max-num-seqs", "2", "--dtype", "float32") as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_token_bytes_of_emoji_and_cjk_concatenate_to_the_text(default_model_dir):
    tokenizer = Tokenizer(default_model_dir)
    token_bytes = TokenBytes(tokenizer)
    ids = tokenizer.encode(TEXT)
    assert b"".join(token_bytes.of(t) for t in ids) == TEXT.encode("utf-8")
    partial = [t for t in ids if token_bytes.text(t).startswith("bytes:")]
    assert partial, "expected the emoji to be split over byte tokens"
    for t in partial:
        raw = token_bytes.of(t)
        assert token_bytes.text(t) == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    assert render("你".encode()) == "你" and render(b"\xf0\x9f") == "bytes:\\xf0\\x9f"


def test_chat_answer_bytes_rebuild_the_answer(client):
    # The model repeats text it was shown, emoji and CJK included (greedy, so the answer is the same every run).
    messages = [
        {"role": "system", "content": "Repeat the user's message exactly."},
        {"role": "user", "content": "Hello 👋 world"}, {"role": "assistant", "content": "Hello 👋 world"},
        {"role": "user", "content": TEXT},
    ]
    response = client.chat.completions.create(model=SERVED_NAME, messages=messages, temperature=0, max_tokens=40,
                                              logprobs=True, top_logprobs=2)
    choice = response.choices[0]
    answer = choice.message.content
    assert any(ord(ch) > 0xFFFF for ch in answer), f"no emoji in {answer!r}"
    assert any("\u4e00" <= ch <= "\u9fff" for ch in answer), f"no CJK in {answer!r}"
    tokens = choice.logprobs.content
    raw = b"".join(bytes(t.bytes) for t in tokens)
    assert raw.startswith("Grüße 😀 and 你好世界".encode())
    if choice.finish_reason == "stop" or not answer.endswith("\ufffd"):
        assert raw == answer.encode("utf-8")
    else:  # cut by max_tokens inside a character: the text ends with U+FFFD where its bytes stop
        assert raw.decode("utf-8", errors="replace") == answer
    assert any(t.token.startswith("bytes:\\x") for t in tokens)  # a piece of an emoji
    assert all(t.top_logprobs and t.top_logprobs[0].bytes is not None for t in tokens)
    if choice.finish_reason == "stop":
        assert len(tokens) == response.usage.completion_tokens - 1  # the EOS that ended it is not shown
    # Streamed, the same bytes arrive chunk by chunk.
    stream = client.chat.completions.create(model=SERVED_NAME, messages=messages, temperature=0, max_tokens=40,
                                            logprobs=True, stream=True)
    streamed = b"".join(bytes(t.bytes) for chunk in stream for c in chunk.choices if c.logprobs
                        for t in c.logprobs.content)
    assert streamed == raw


def test_echo_with_max_tokens_0_scores_the_prompt(client):
    prompt = "The capital of France is Paris"
    response = client.completions.create(model=SERVED_NAME, prompt=prompt, echo=True, max_tokens=0, logprobs=1)
    choice = response.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert response.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == prompt
    assert logprobs.token_logprobs[0] is None and all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert len(logprobs.tokens) == response.usage.prompt_tokens
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    # The prompt's logprobs are what a generation that echoes it reports for the same tokens.
    generated = client.completions.create(model=SERVED_NAME, prompt=prompt, echo=True, max_tokens=1, logprobs=1,
                                          temperature=0)
    assert generated.choices[0].logprobs.token_logprobs[:len(logprobs.tokens)] == logprobs.token_logprobs
    stream = client.completions.create(model=SERVED_NAME, prompt=[prompt, "Hello"], echo=True, max_tokens=0,
                                       logprobs=0, stream=True)
    texts = {c.index: c.text for chunk in stream for c in chunk.choices}
    assert texts == {0: prompt, 1: "Hello"}
    with pytest.raises(openai.BadRequestError, match="echo") as refused:
        client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=0)
    assert refused.value.body["param"] == "max_tokens"


def test_legacy_offsets_count_characters_across_split_emoji(client):
    response = client.completions.create(model=SERVED_NAME, prompt=TEXT, echo=True, max_tokens=0, logprobs=0)
    logprobs = response.choices[0].logprobs
    assert response.choices[0].text == TEXT
    # Each offset is where the token's text starts; a split character starts at its first byte token.
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    assert logprobs.text_offset[-1] == len(TEXT) - 1  # "!" ends it


def test_tokenizer_info_lets_a_client_tokenize_like_the_server(server, default_model_dir):
    info = httpx.get(f"{server.base_url}/tokenizer_info").json()
    tokenizer = Tokenizer(default_model_dir)
    assert info["eos_token"] == "<|im_end|>" and info["bos_token"] == "<|im_start|>"
    assert info["model_max_length"] == 2048 and info["vocab_size"] == tokenizer.vocab_size
    assert info["tokenizer_class"] and "{% for message in messages %}" in info["chat_template"]
    messages = [{"role": "user", "content": "Hi"}]
    served = httpx.post(f"{server.base_url}/tokenize", json={"messages": messages}).json()["tokens"]
    assert served == tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
