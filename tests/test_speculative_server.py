"""`shrike serve --speculative-config`: streamed answers through the openai client equal plain greedy
decoding, several tokens may arrive per chunk, and /metrics counts proposals and acceptances."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_server_api import wait_until_idle
from test_server_lifecycle import SERVED_NAME, running_server

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
PROMPT = ("Repeat the list.\nList: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates.\n"
          "Repeated: apples, pears,")


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(default_model_dir, log, "--dtype", "float32", "--speculative-config", NGRAM) as server:
        yield server


def test_streamed_completion_equals_plain_decoding(server, default_model_dir):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    chunks = list(client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=40, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    engine = LLMEngine(EngineConfig(model=str(default_model_dir), dtype="float32", max_model_len=256, progress=False))
    plain = engine.generate([engine.tokenizer.encode(PROMPT)], SamplingParams(max_tokens=40, temperature=0))[0][0]
    assert streamed == plain.text
    assert chunks[-1].usage.completion_tokens == len(plain.token_ids)
    text_chunks = [c for c in chunks if c.choices and c.choices[0].text]
    assert len(text_chunks) < len(plain.token_ids), "every chunk carried one token: nothing was accepted"

    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        m = wait_until_idle(http)
    assert m["shrike:spec_decode_num_accepted_tokens_total"] > 0
    assert m["shrike:spec_decode_num_draft_tokens_total"] >= m["shrike:spec_decode_num_accepted_tokens_total"]
    assert m["shrike:spec_decode_num_emitted_tokens_total"] > m["shrike:spec_decode_num_accepted_tokens_total"]
    assert 0 < m["shrike:spec_decode_draft_acceptance_rate"] <= 1


def test_streamed_chat_with_sampling_completes(server):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=30, temperature=0.7, seed=4,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
