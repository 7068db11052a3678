"""The default bf16 model through a real `shrike serve`: a greedy request gives the same text
whether it runs alone or together with 7 others, because every linear layer and the lm_head run
on the batch-invariant dense kernel (torch's bf16 matmul rounds differently with the batch shape)."""
from __future__ import annotations

import asyncio

import openai
from test_server_lifecycle import SERVED_NAME, running_server

PROMPTS = [
    "The history of the printing press begins",
    "Write a short poem about the sea:\n",
    "The three laws of thermodynamics state that",
    "def fibonacci(n):\n",
    "My favourite recipe for pancakes is",
    "The largest planets in the solar system are",
    "Once upon a time, in a small village,",
    "To learn a new language quickly, you should",
]
MAX_TOKENS = 24


def test_bf16_greedy_text_alone_equals_batched_with_seven_others(default_model_dir, tmp_path):
    async def complete(client: openai.AsyncOpenAI, prompt: str) -> str:
        response = await client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=MAX_TOKENS,
                                                   temperature=0)
        return response.choices[0].text

    async def run(base_url: str):
        async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0,
                                      timeout=300) as client:
            alone = [await complete(client, p) for p in PROMPTS]
            together = await asyncio.gather(*[complete(client, p) for p in PROMPTS])
            return alone, list(together)

    # No --dtype: the checkpoint's bf16. The prefix cache is off so the batched run recomputes every prompt.
    with running_server(default_model_dir, tmp_path / "server.log", "--max-num-seqs", "8",
                        "--no-enable-prefix-caching") as server:
        alone, together = asyncio.run(run(server.base_url))
    assert "dtype bfloat16" in server.log
    assert all(len(text) > 0 for text in alone)
    assert together == alone
