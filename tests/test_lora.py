"""LoRA adapters (issue 38) written by peft itself, served by Shrike: logits equal peft's model and the merged
model on SmolLM2 and a tiny Qwen3, on the compiled executor and the eager reference path; requests for two
adapters and the base model in one batch get what each gets alone; prefix caching never shares KV blocks
between adapters; a real server picks the adapter by `model`, lists it, 404s an unknown one, and loads and
unloads adapters at run time."""
from __future__ import annotations

import httpx
import openai
import peft
import pytest
import torch
import transformers

from shrike import LLM, LoRARequest, SamplingParams
from shrike.errors import ConfigError
from shrike.ops import lora_kernel, lora_reference
from test_model_tiny import _save_tiny
from test_reference_hf import FP32_LOGIT_ATOL
from test_server_lifecycle import SERVED_NAME, running_server

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# (name, rank, lora_alpha, use_rslora, target modules, seed)
ADAPTERS = [("r8", 8, 16, False, TARGETS, 1), ("r16", 16, 32, True, ["q_proj", "v_proj", "down_proj"], 2)]


def save_adapter(base: transformers.PreTrainedModel, directory, rank: int, alpha: int, rslora: bool, targets, seed):
    """A peft adapter with random non-zero A and B (a trained adapter's B is not zero), saved by peft."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, use_rslora=rslora, target_modules=targets,
                             init_lora_weights=False)
    model = peft.get_peft_model(base, config)
    model.save_pretrained(directory)
    model.unload()  # the base model back as it was, for the next adapter


def peft_logprobs(base_dir, adapter_dir, ids: list[int], merged: bool = False) -> torch.Tensor:
    """(len(ids) - 1,) log-probabilities peft's model (or the merged model) gives each prompt token after the first."""
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    model = peft.PeftModel.from_pretrained(base, adapter_dir).eval() if adapter_dir else base
    if adapter_dir and merged:
        model = model.merge_and_unload()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1], -1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def shrike_logprobs(llm: LLM, prompts: list[str], loras: list) -> list[torch.Tensor]:
    """Each prompt's prompt-token log-probabilities, all prompts run in one batch."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    outputs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    return [torch.tensor([position[t].logprob for position, t in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])])
            for out in outputs]


@pytest.fixture(scope="module")
def smollm_adapters(default_model_dir, tmp_path_factory):
    base = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    directory = tmp_path_factory.mktemp("adapters")
    for name, rank, alpha, rslora, targets, seed in ADAPTERS:
        save_adapter(base, directory / name, rank, alpha, rslora, targets, seed)
    return {name: str(directory / name) for name, *_ in ADAPTERS}


@pytest.fixture(scope="module")
def smollm(default_model_dir):
    return LLM(str(default_model_dir), dtype="float32", max_model_len=256, enable_lora=True, max_loras=2,
               progress=False)


def requests_of(adapters: dict[str, str]) -> dict[str, LoRARequest]:
    return {name: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(adapters.items())}


def test_kernel_equals_reference():
    torch.manual_seed(0)

    class Slots:
        shrink = torch.randn(3, 2 * 16, 320)  # 3 slots, 2 parts, max rank 16, k 320
        expand = torch.randn(3, 16, 200)
        ranks = torch.tensor([8, 16, 0], dtype=torch.int32)
        part_end = torch.tensor([72, 200], dtype=torch.int32)

    slots = torch.tensor([0, -1, 1, 2, 0, 1, 1, -1, 0], dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        x, base = torch.randn(9, 320).to(dtype), torch.randn(9, 200).to(dtype)
        ours, ref = base.clone(), base.clone()
        lora_kernel(x, Slots, slots, ours)
        lora_reference(x, Slots, slots, ref)
        torch.testing.assert_close(ours, ref, atol=1e-3, rtol=1e-5 if dtype == torch.float32 else 1e-2)
        untouched = (slots == -1) | (slots == 2)  # no adapter, or a slot of rank 0
        assert torch.equal(ours[untouched], base[untouched]) and not torch.equal(ours[~untouched], base[~untouched])


def test_smollm_logits_equal_peft_and_merged(smollm, smollm_adapters, default_model_dir):
    loras = requests_of(smollm_adapters)
    ids = smollm.get_tokenizer().encode(PROMPTS[2])
    ours = shrike_logprobs(smollm, [PROMPTS[2]] * 3, [None, loras["r8"], loras["r16"]])
    base = peft_logprobs(default_model_dir, None, ids)
    torch.testing.assert_close(ours[0], base, atol=FP32_LOGIT_ATOL, rtol=0)
    for name, got in zip(("r8", "r16"), ours[1:]):
        assert (got - base).abs().max() > 0.1  # the adapter changes the model
        for merged in (False, True):
            expected = peft_logprobs(default_model_dir, smollm_adapters[name], ids, merged)
            torch.testing.assert_close(got, expected, atol=FP32_LOGIT_ATOL, rtol=0)


def test_a_batch_mixing_adapters_equals_each_alone(smollm, smollm_adapters):
    loras = requests_of(smollm_adapters)
    mix = [None, loras["r8"], loras["r16"], loras["r8"], None, loras["r16"]]
    prompts = [PROMPTS[i % 3] for i in range(len(mix))]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    together = smollm.generate(prompts, params, lora_request=mix, use_tqdm=False)
    for prompt, lora, out in zip(prompts, mix, together):
        (alone,) = smollm.generate([prompt], params, lora_request=lora, use_tqdm=False)
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids
        assert [lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids)] == \
            [lp[t].logprob for lp, t in zip(alone.outputs[0].logprobs, alone.outputs[0].token_ids)]
    texts = {out.outputs[0].text for out in together[:3]}
    assert len(texts) == 3  # base, r8 and r16 continue differently


def test_prefix_cache_is_not_shared_between_adapters(smollm, smollm_adapters):
    loras = requests_of(smollm_adapters)
    prompt = "Shrike serves LoRA adapters next to the base model. " * 4  # several full KV blocks
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    blocks = smollm.llm_engine.block_manager
    outputs = {}
    for name in ("r8", "r16", None):
        hits = blocks.prefix_hits
        outputs[name] = smollm.generate([prompt], params, lora_request=loras.get(name), use_tqdm=False)[0]
        assert blocks.prefix_hits == hits  # a prompt seen with another adapter is computed afresh
    hits = blocks.prefix_hits
    again = smollm.generate([prompt], params, lora_request=loras["r16"], use_tqdm=False)[0]
    assert blocks.prefix_hits > hits  # the same adapter reuses its own blocks
    assert again.outputs[0].token_ids == outputs["r16"].outputs[0].token_ids


def test_more_adapters_than_slots_wait_for_one(default_model_dir, smollm_adapters, smollm):
    loras = requests_of(smollm_adapters)
    one_slot = LLM(str(default_model_dir), dtype="float32", max_model_len=256, enable_lora=True, max_loras=1,
                   progress=False)
    mix = [loras["r8"], loras["r16"], None, loras["r8"]]
    prompts = PROMPTS + PROMPTS[:1]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = one_slot.generate(prompts, params, lora_request=mix, use_tqdm=False)
    expected = smollm.generate(prompts, params, lora_request=mix, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_tiny_qwen3_logits_equal_peft(backend, tmp_path, default_model_dir):
    base_dir = tmp_path / "qwen3"
    hf = _save_tiny("qwen3", base_dir, default_model_dir).float()
    save_adapter(hf, tmp_path / "adapter", 8, 16, False, TARGETS, 3)
    llm = LLM(str(base_dir), dtype="float32", max_model_len=128, enable_lora=True, kernel_backend=backend,
              lora_modules={"tiny": str(tmp_path / "adapter")}, progress=False)
    ids = llm.get_tokenizer().encode(PROMPTS[1])
    (ours,) = shrike_logprobs(llm, [PROMPTS[1]], [LoRARequest("tiny", 1, str(tmp_path / "adapter"))])
    expected = peft_logprobs(base_dir, tmp_path / "adapter", ids)
    assert (ours - peft_logprobs(base_dir, None, ids)).abs().max() > 0.1
    torch.testing.assert_close(ours, expected, atol=FP32_LOGIT_ATOL, rtol=0)


def test_adapters_that_cannot_be_served_are_one_line_errors(default_model_dir, smollm_adapters, tmp_path):
    with pytest.raises(ConfigError, match="--max-lora-rank 16 or more"):
        LLM(str(default_model_dir), enable_lora=True, max_lora_rank=8, lora_modules={"r16": smollm_adapters["r16"]},
            progress=False)
    with pytest.raises(ConfigError, match="need --enable-lora"):
        LLM(str(default_model_dir), lora_modules={"r8": smollm_adapters["r8"]}, progress=False)
    with pytest.raises(ConfigError, match="no adapter_config.json"):
        LLM(str(default_model_dir), enable_lora=True, lora_modules={"x": str(tmp_path)}, progress=False)
    plain = LLM(str(default_model_dir), max_model_len=128, progress=False)
    with pytest.raises(ValueError, match="--enable-lora"):
        plain.generate(["Hi"], lora_request=LoRARequest("r8", 1, smollm_adapters["r8"]))


def test_server_serves_adapters_by_model_name(default_model_dir, smollm_adapters, smollm, tmp_path):
    loras = requests_of(smollm_adapters)
    flags = ["--dtype", "float32", "--enable-lora", "--lora-modules", f"r8={smollm_adapters['r8']}",
             "--max-loras", "2", "--allow-runtime-lora"]
    with running_server(default_model_dir, tmp_path / "server.log", *flags) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {SERVED_NAME, "r8"} and models["r8"].parent == SERVED_NAME

        def complete(model: str) -> str:
            return client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=8, temperature=0).choices[0].text

        params = SamplingParams(max_tokens=8, temperature=0)
        for name in ("r8", None):
            expected = smollm.generate([PROMPTS[0]], params, lora_request=loras.get(name), use_tqdm=False)[0]
            assert complete(name or SERVED_NAME) == expected.outputs[0].text
        chat = client.chat.completions.create(model="r8", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert chat.choices[0].message.content

        with pytest.raises(openai.NotFoundError) as unknown:
            complete("r16")
        assert f"'{SERVED_NAME}', 'r8'" in unknown.value.message

        load = httpx.post(f"{server.base_url}/v1/load_lora_adapter",
                          json={"lora_name": "r16", "lora_path": smollm_adapters["r16"]}, timeout=60)
        assert load.status_code == 200, load.text
        expected = smollm.generate([PROMPTS[0]], params, lora_request=loras["r16"], use_tqdm=False)[0]
        assert complete("r16") == expected.outputs[0].text
        assert "r16" in {m.id for m in client.models.list().data}
        again = httpx.post(f"{server.base_url}/v1/load_lora_adapter",
                           json={"lora_name": "r16", "lora_path": smollm_adapters["r16"]}, timeout=60)
        assert again.status_code == 400 and "loaded already" in again.json()["error"]["message"]
        bad = httpx.post(f"{server.base_url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
        assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]

        unload = httpx.post(f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": "r16"}, timeout=60)
        assert unload.status_code == 200, unload.text
        with pytest.raises(openai.NotFoundError):
            complete("r16")
        gone = httpx.post(f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": "r16"}, timeout=60)
        assert gone.status_code == 404


def test_runtime_loading_is_off_unless_allowed(default_model_dir, smollm_adapters, tmp_path):
    with running_server(default_model_dir, tmp_path / "server.log", "--enable-lora") as server:
        response = httpx.post(f"{server.base_url}/v1/load_lora_adapter",
                              json={"lora_name": "r8", "lora_path": smollm_adapters["r8"]}, timeout=60)
        assert response.status_code == 404 and "--allow-runtime-lora" in response.json()["error"]["message"]


def test_adapters_apply_to_a_gguf_run_natively(smollm_adapters, default_model_dir):
    """The default GGUF's linears run from its quant blocks; an adapter moves their log-probabilities as peft's
    adapter moves those of the file's dequantized weights, up to the int8 activation rounding (which a random
    adapter's larger activations make larger than the base model's: up to 0.4 nats at one position here)."""
    from shrike.default_model import default_gguf_path
    llm = LLM(str(default_gguf_path()), dtype="float32", max_model_len=256, enable_lora=True, max_loras=1,
              progress=False)
    assert {layer.qkv_proj.format for layer in llm.llm_engine.runner.model.layers} == {"grouped"}
    lora = requests_of(smollm_adapters)["r8"]
    ids = llm.get_tokenizer().encode(PROMPTS[2])
    base, adapted = shrike_logprobs(llm, [PROMPTS[2]] * 2, [None, lora])
    expected_shift = peft_logprobs(default_model_dir, smollm_adapters["r8"], ids) - \
        peft_logprobs(default_model_dir, None, ids)
    assert expected_shift.abs().max() > 0.5
    assert (adapted - base - expected_shift).abs().mean() < 0.15 * expected_shift.abs().mean()
