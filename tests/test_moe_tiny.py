"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral) on tiny random checkpoints saved by transformers: logits and
greedy text against transformers, the compiled forward against the eager one bit for bit (fp32, bf16 and
quantized experts), and the moe op itself: batch invariance, a row routed to every expert, router ties, a shared
expert."""
from __future__ import annotations


import pytest
import torch
import transformers

from shrike import kernels
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.executor.step import EagerStep
from shrike.layers.attention import KVCache
from shrike.model.config import ModelConfig
from shrike.model.moe import MoeCausalLM
from shrike.model.weights import CheckpointTensors
from shrike.ops import dense_linear_kernel, moe_kernel, moe_reference, weight_for_op
from shrike.sampling.params import SamplingParams
from shrike.weight_formats import ExpertWeights

from test_executor import _assert_same_logits, _quantize
from test_model_tiny import save_random

TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512)
VARIANTS = {
    # 3 of 8 experts, probabilities not renormalised, the middle layer a dense MLP (mlp_only_layers)
    "qwen3moe": (transformers.Qwen3MoeConfig, dict(num_hidden_layers=3, head_dim=32, num_experts=8, num_experts_per_tok=3,
                                                  moe_intermediate_size=32, norm_topk_prob=False, mlp_only_layers=[1])),
    "qwen3moe-norm": (transformers.Qwen3MoeConfig, dict(num_hidden_layers=2, head_dim=16, num_experts=4,
                                                       num_experts_per_tok=2, moe_intermediate_size=64,
                                                       norm_topk_prob=True)),
    "mixtral": (transformers.MixtralConfig, dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)),
    # a shared expert wider than the routed ones, behind its sigmoid gate; q/k/v biases
    "qwen2moe": (transformers.Qwen2MoeConfig, dict(num_hidden_layers=2, num_experts=6, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                                  norm_topk_prob=False)),
}


def _save(kind: str, directory, tokenizer_dir) -> transformers.PreTrainedModel:
    config_cls, extra = VARIANTS[kind]
    torch.manual_seed(0)
    return save_random(transformers.AutoModelForCausalLM.from_config(config_cls(**TINY, **extra)).eval(), directory,
                       tokenizer_dir)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_model_dir):
    saved = {}
    for kind in VARIANTS:
        directory = tmp_path_factory.mktemp(kind)
        saved[kind] = (directory, _save(kind, directory, default_model_dir))
    return saved


@pytest.mark.parametrize("kind", list(VARIANTS))
def test_prefill_logits_match_transformers(tiny, kind):
    directory, hf = tiny[kind]
    config = ModelConfig.from_dir(directory)
    model = MoeCausalLM(config, CheckpointTensors(directory), torch.float32)
    caches = [KVCache(4, 16, config.num_kv_heads, config.head_dim, torch.float32) for _ in range(config.num_layers)]
    ids = torch.randint(0, TINY["vocab_size"], (37,), generator=torch.Generator().manual_seed(1))
    got = model.forward(EagerStep.prefill(model.ops, ids, 16, torch.arange(37)), caches)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["qwen3moe", "mixtral", "qwen2moe"])
def test_greedy_generation_matches_transformers(tiny, kind):
    directory, hf = tiny[kind]
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float32", max_model_len=256, progress=False))
    assert engine.runner.compiled is not None, engine.runner.eager_reason
    prompts = [[1, 200, 3000, 45], [9, 8, 7, 6, 5, 4, 3, 2, 1, 600, 700]]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    for prompt, (out,) in zip(prompts, outputs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == ref


@pytest.mark.parametrize("kind", ["qwen3moe", "mixtral", "qwen2moe"])
def test_compiled_equals_eager_fp32(tiny, kind):
    _assert_same_logits(tiny[kind][0], "float32")


def test_compiled_equals_eager_bf16(tiny):
    _assert_same_logits(tiny["qwen3moe"][0], "bfloat16")


def test_compiled_equals_eager_with_an_int8_kv_cache(tiny):
    _assert_same_logits(tiny["mixtral"][0], "bfloat16", kv_cache_dtype="int8")


@pytest.mark.parametrize("scheme", ["w4a8-g32", "w8a8", "w4a16-g32", "w8a16"])
def test_compiled_equals_eager_quantized_experts(tiny, tmp_path, scheme):
    quantized = _quantize(tiny["qwen3moe"][0], tmp_path / "q", scheme)
    _assert_same_logits(quantized)
    engine = LLMEngine(EngineConfig(model=str(quantized), max_model_len=64, kv_cache_space=0.01, progress=False))
    block = engine.runner.model.layers[0].mlp
    assert block.experts.op == {"w4a8-g32": "w4a8_linear", "w8a8": "w8a8_linear"}.get(scheme, "weight_only_linear")
    assert isinstance(block.router.weight, torch.Tensor)  # the router stays dense


def test_a_request_gets_the_same_logprobs_batched_and_alone(tiny):
    engine = LLMEngine(EngineConfig(model=str(tiny["qwen3moe"][0]), dtype="bfloat16", max_model_len=128,
                                    kv_cache_space=0.02, progress=False))
    prompts = [[5, 900, 31, 77, 2048, 6], [400 + i for i in range(13)], [17, 3]]
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=3)

    def scored(outputs):
        return [(seqs[0].token_ids, [(s.logprob, s.top_ids, s.top_logprobs) for s in seqs[0].logprobs])
                for seqs in outputs]

    together = scored(engine.generate(prompts, params))
    alone = [scored(engine.generate([prompt], params))[0] for prompt in prompts]
    assert together == alone


# The op itself ----------------------------------------------------------------------------------

def _random_experts(num_experts: int, hidden: int, inter: int, fmt: str) -> ExpertWeights:
    g = torch.Generator().manual_seed(3)
    gate_up = [torch.randn(2 * inter, hidden, generator=g) * 0.2 for _ in range(num_experts)]
    down = [torch.randn(hidden, inter, generator=g) * 0.2 for _ in range(num_experts)]
    if fmt == "bf16":
        pack = lambda w: weight_for_op(w.bfloat16(), dense_linear_kernel)  # noqa: E731
        return ExpertWeights("dense_linear", [pack(w) for w in gate_up], [pack(w) for w in down], inter)
    def pack(w):  # symmetric int4 per group of 32, as a W4A8 checkpoint stores it
        scale = w.reshape(w.shape[0], -1, 32).abs().amax(-1) / 7  # (N, K / 32)
        values = torch.round(w / scale.repeat_interleave(32, 1)).clamp(-8, 7).to(torch.int8)
        return kernels.W4A8Weight.from_int8(values, scale, 32)
    return ExpertWeights("w4a8_linear", [pack(w) for w in gate_up], [pack(w) for w in down], inter)


def _run(op, x, logits, experts, top_k, normalize):
    out = torch.empty_like(x)
    op(x, logits, experts, out, top_k, normalize)
    return out


@pytest.mark.parametrize("fmt", ["bf16", "w4a8"])
def test_a_row_does_not_depend_on_the_rows_beside_it(fmt):
    experts = _random_experts(6, 64, 32, fmt)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(19, 64, generator=g).bfloat16()
    logits = torch.randn(19, 6, generator=g)
    together = _run(moe_kernel, x, logits, experts, 2, True)
    for t in range(19):
        alone = _run(moe_kernel, x[t:t + 1], logits[t:t + 1], experts, 2, True)
        assert torch.equal(alone[0], together[t]), f"row {t}"


def test_a_row_routed_to_every_expert_matches_the_reference():
    experts = _random_experts(5, 64, 32, "bf16")
    g = torch.Generator().manual_seed(5)
    x, logits = torch.randn(7, 64, generator=g).bfloat16(), torch.randn(7, 5, generator=g)
    for normalize in (False, True):
        got = _run(moe_kernel, x, logits, experts, 5, normalize)
        expected = _run(moe_reference, x, logits, experts, 5, normalize)
        torch.testing.assert_close(got.float(), expected.float(), atol=0, rtol=2 ** -7)
    # every expert, probabilities renormalised over all of them: the plain softmax-weighted sum
    mix = torch.stack([_mixture(row, experts, range(5), torch.softmax(row_logits, -1))
                       for row, row_logits in zip(x, logits)])
    torch.testing.assert_close(_run(moe_kernel, x, logits, experts, 5, True).float(), mix, atol=2e-2, rtol=2e-2)


def _dense(weight) -> torch.Tensor:
    """A bf16 expert weight (N, K) as float32, unpacked from AMX tiles where the CPU packs them."""
    return (weight.unpack() if isinstance(weight, kernels.DenseTileWeight) else weight).float()


def _mixture(x, experts, chosen, weights):
    """sum of weight * expert(x) over the chosen experts, in float32 from the bf16 weights."""
    total = torch.zeros(x.shape[-1])  # (hidden,)
    for e, w in zip(chosen, weights):
        gate_up, down = _dense(experts.gate_up[e]), _dense(experts.down[e])
        inter = experts.intermediate
        act = torch.nn.functional.silu(x.float() @ gate_up[:inter].T) * (x.float() @ gate_up[inter:].T)
        total += w * (act @ down.T)
    return total


def test_a_shared_expert_runs_on_every_row_behind_its_sigmoid_gate():
    """Qwen2-MoE: the last expert (of its own width) runs on every row, weighted by the sigmoid of the router's
    last logit, beside the top-k routed experts; a row's result does not depend on the rows beside it."""
    routed = _random_experts(5, 64, 32, "bf16")
    shared = _random_experts(1, 64, 48, "bf16")
    experts = ExpertWeights("dense_linear", routed.gate_up + shared.gate_up, routed.down + shared.down, 32, 48)
    g = torch.Generator().manual_seed(7)
    x, logits = torch.randn(9, 64, generator=g).bfloat16(), torch.randn(9, 6, generator=g)
    got = _run(moe_kernel, x, logits, experts, 2, False)
    torch.testing.assert_close(got.float(), _run(moe_reference, x, logits, experts, 2, False).float(), atol=0,
                               rtol=2 ** -7)
    for t in range(9):
        assert torch.equal(_run(moe_kernel, x[t:t + 1], logits[t:t + 1], experts, 2, False)[0], got[t]), f"row {t}"
        probs = torch.softmax(logits[t, :5], -1)
        top = torch.topk(probs, 2).indices.tolist()
        expected = _mixture(x[t], routed, top, probs[top]) + _mixture(x[t], shared, [0], torch.sigmoid(logits[t, 5:]))
        torch.testing.assert_close(got[t].float(), expected, atol=2e-2, rtol=2e-2)


def test_router_ties_go_to_the_lower_expert_index():
    experts = _random_experts(4, 64, 32, "bf16")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    # row 0: experts 1, 2, 3 tie for the best; row 1: all tie; row 2: 0 and 3 tie behind 2
    logits = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5], [0.25, -1.0, 2.0, 0.25]])
    got = _run(moe_kernel, x, logits, experts, 2, False)
    torch.testing.assert_close(got.float(), _run(moe_reference, x, logits, experts, 2, False).float(), atol=0,
                               rtol=2 ** -7)
    for row, chosen, passed_over in [(0, (1, 2), (1, 3)), (1, (0, 1), (2, 3)), (2, (2, 0), (2, 3))]:
        probs = torch.softmax(logits[row], -1)
        expected = _mixture(x[row], experts, chosen, probs[list(chosen)])
        other = _mixture(x[row], experts, passed_over, probs[list(passed_over)])
        torch.testing.assert_close(got[row].float(), expected, atol=1e-2, rtol=1e-2)
        assert not torch.allclose(got[row].float(), other, atol=1e-2, rtol=1e-2)


def test_synth_moe_checkpoint_runs_compiled(tmp_path):
    """shrike synth --like tiny-moe (Qwen3-30B-A3B's layout at small sizes): routers stay bf16, experts W4A8."""
    from shrike.synth import synthesize

    synthesize(tmp_path / "m", "tiny-moe", "w4a8-g64", progress=False)
    config = ModelConfig.from_dir(tmp_path / "m")
    assert "re:.*mlp.gate$" in config.quantization_config["ignore"]
    tokens = _assert_same_logits(tmp_path / "m")
    assert all(len(t) > 0 for t in tokens)


def test_footprint_counts_active_and_total_parameters(tmp_path):
    """Qwen3-30B-A3B's model card: 30.5 B parameters, 3.3 B activated; bytes per token skip 6 of 8 experts."""
    from shrike.model.footprint import checkpoint_tensor_bytes, footprint
    from shrike.synth import SHAPES, synthesize

    shape = SHAPES["qwen3-30b-a3b"]
    card = footprint(shape, checkpoint_tensor_bytes(tmp_path))  # no files: parameters only
    with torch.device("meta"):  # transformers' count, without memory
        hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **{k: v for k, v in shape.items() if k not in ("architectures", "model_type")}))
    assert card.total_params == sum(p.numel() for p in hf.parameters()) == 30_532_122_624
    assert 3.3e9 <= card.active_params < 3.4e9
    synthesize(tmp_path / "m", "tiny-moe", "bf16", progress=False)
    config = ModelConfig.from_dir(tmp_path / "m").raw
    counted = footprint(config, checkpoint_tensor_bytes(tmp_path / "m"))
    tensors = CheckpointTensors(tmp_path / "m")
    expert = sum(tensors.raw(n).numel() * 2 for n in tensors.names() if ".experts." in n)
    embedding = tensors.raw("model.embed_tokens.weight").numel() * 2
    assert counted.bytes_per_token == counted.weight_bytes - embedding - expert * 6 // 8
    assert counted.total_params * 2 == counted.weight_bytes  # bf16: two bytes per parameter
