"""POST /v1/embeddings on a real `shrike serve` process, through the official openai client: the vectors equal
sentence-transformers' encode of the same checkpoint, in both encodings and for text or token-id input, requests
sent together are batched without changing their vectors, and bad requests are 400s naming the problem."""
from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers

from embedding_models import sentence_transformers_dir
from test_server_lifecycle import SERVED_NAME, running_server

TEXTS = ["A cat sat on the mat.", "Paris is the capital of France. " * 6, "Vectors for search and retrieval."]


@pytest.fixture(scope="module")
def embedding_server(default_model_dir, tmp_path_factory):
    model_dir = sentence_transformers_dir(default_model_dir, tmp_path_factory.mktemp("st") / "model", "mean", True)
    with running_server(model_dir, tmp_path_factory.mktemp("log") / "server.log", "--dtype", "float32",
                        "--max-num-batched-tokens", "32", "--max-model-len", "512") as server:
        yield server, model_dir


@pytest.fixture(scope="module")
def client(embedding_server):
    server, _ = embedding_server
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_openai_client_vectors_equal_transformers_mean_pooled(embedding_server, client):
    """(test_embeddings.py checks every pooling mode against sentence-transformers itself.)"""
    server, model_dir = embedding_server
    assert "embedding model (/v1/embeddings), 576 dimensions, pooling mean, normalized" in server.log
    assert "chat page off" in server.log and httpx.get(f"{server.base_url}/").status_code == 404
    operation = httpx.get(f"{server.base_url}/openapi.json").json()["paths"]["/v1/embeddings"]["post"]
    assert {"200", "400", "404", "503"} <= set(operation["responses"]) and "422" not in operation["responses"]
    response = client.embeddings.create(model=SERVED_NAME, input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in response.data] == [0, 1, 2] and response.model == SERVED_NAME
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(map(len, ids))
    with torch.no_grad():
        for prompt, item in zip(ids, response.data):
            mean = model(torch.tensor([prompt])).last_hidden_state[0].mean(0)
            assert float((torch.tensor(item.embedding) - mean / mean.norm()).abs().max()) < 2e-5
    as_floats = client.embeddings.create(model=SERVED_NAME, input=TEXTS, encoding_format="float")
    assert [d.embedding for d in as_floats.data] == [d.embedding for d in response.data]
    # Token ids, one list or several, give the vectors of the texts they spell.
    by_ids = client.embeddings.create(model=SERVED_NAME, input=ids, encoding_format="float")
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in as_floats.data]
    one = client.embeddings.create(model=SERVED_NAME, input=ids[0], encoding_format="float")
    assert one.data[0].embedding == as_floats.data[0].embedding


def test_base64_is_little_endian_float32(embedding_server):
    server, _ = embedding_server
    body = {"model": SERVED_NAME, "input": TEXTS[0]}
    floats = httpx.post(f"{server.base_url}/v1/embeddings", json=body, timeout=60).json()
    packed = httpx.post(f"{server.base_url}/v1/embeddings", json={**body, "encoding_format": "base64"}, timeout=60)
    decoded = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), dtype="<f4")
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    assert decoded.tolist() == floats["data"][0]["embedding"] and len(decoded) == 576


def test_requests_sent_together_equal_each_alone(client):
    texts = [f"Request {i}: " + "words about embeddings " * (i % 5 + 1) for i in range(12)]
    alone = [client.embeddings.create(model=SERVED_NAME, input=t, encoding_format="float").data[0].embedding
             for t in texts]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda t: client.embeddings.create(model=SERVED_NAME, input=t,
                                                                    encoding_format="float").data[0].embedding, texts))
    for a, b in zip(alone, together):
        assert float(np.abs(np.array(a) - np.array(b)).max()) < 1e-6


@pytest.mark.parametrize("body, status, words", [
    ({"input": []}, 400, "input must not be an empty list"),
    ({"input": ""}, 400, "input[0] is an empty string"),
    ({"input": [[]]}, 400, "input[0] is an empty list of token ids"),
    ({"input": [49152]}, 400, "input must be token ids in [0, 49152)"),
    ({"input": [7] * 513}, 400, "the prompt has 513 tokens"),
    ({"input": 5}, 400, "input"),
    ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": "hi", "dimensions": 64}, 400, "not a Matryoshka model"),
    ({"input": "hi", "dimensions": 0}, 400, "dimensions"),
    ({"input": "hi", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens must be -1"),
    ({"input": "hi", "model": "other"}, 404, "does not exist"),
])
def test_bad_requests_are_one_line(embedding_server, body, status, words):
    server, _ = embedding_server
    response = httpx.post(f"{server.base_url}/v1/embeddings", json={"model": SERVED_NAME, **body}, timeout=60)
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert words in message and "\n" not in message


def test_truncate_prompt_tokens_keeps_the_last_tokens(embedding_server, client):
    long = list(range(1000, 1600))  # 600 tokens: more than --max-model-len 512
    kept = client.embeddings.create(model=SERVED_NAME, input=long, encoding_format="float",
                                    extra_body={"truncate_prompt_tokens": -1})
    tail = client.embeddings.create(model=SERVED_NAME, input=long[-512:], encoding_format="float")
    assert kept.data[0].embedding == tail.data[0].embedding and kept.usage.prompt_tokens == 512
    short = client.embeddings.create(model=SERVED_NAME, input=long, encoding_format="float",
                                     extra_body={"truncate_prompt_tokens": 5})
    assert short.data[0].embedding == client.embeddings.create(
        model=SERVED_NAME, input=long[-5:], encoding_format="float").data[0].embedding


def test_an_embedding_server_refuses_generation_and_keeps_serving(embedding_server, client):
    server, _ = embedding_server
    with pytest.raises(openai.BadRequestError, match="generates no text"):
        client.completions.create(model=SERVED_NAME, prompt="Hello", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="generates no text"):
        client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": "Hi"}])
    assert client.embeddings.create(model=SERVED_NAME, input="still here").data
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_a_generation_server_says_how_to_serve_embeddings(default_model_dir, tmp_path):
    with running_server(default_model_dir, tmp_path / "server.log") as server:
        response = httpx.post(f"{server.base_url}/v1/embeddings", json={"input": "Hello"}, timeout=60)
        assert response.status_code == 400 and "--runner pooling" in response.json()["error"]["message"]
        assert "/v1/embeddings" not in httpx.get(f"{server.base_url}/openapi.json").json()["paths"]
