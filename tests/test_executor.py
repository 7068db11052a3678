"""The compiled forward (one C++ call per step) against the eager Python model it replaces.

Both engines run the same requests with a small token budget, so steps include prompt chunks,
mixed prefill + decode batches and prefix-cache hits; every step's logits must be equal bit for
bit (quantized and fp32 checkpoints) and bf16 must give the same greedy tokens.
"""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from shrike import _C
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.kernels import DenseTileWeight
from shrike.quantization.quantize_checkpoint import quantize_checkpoint
from shrike.quantization.schemes import SCHEMES
from shrike.sampling.params import SamplingParams
from shrike.synth import synthesize

from test_gemma3_tiny import tiny_config as tiny_gemma3_config
from test_model_tiny import TOKENIZER_FILES, _save_tiny

PROMPT = [(7 * i + 3) % 5000 + 10 for i in range(40)]
SHARED_PREFIX = PROMPT[:33] + [11, 12, 13, 14, 15, 16, 17]  # its first two blocks are PROMPT's
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def _quantize(src, dst, scheme: str, **kwargs):
    fmt = "int-quantized" if scheme == "w8a8" else "pack-quantized"
    quantize_checkpoint(src, dst, SCHEMES[scheme], fmt, progress=False, **kwargs)
    return dst


def _engine(model_dir, compiled: bool, dtype: str = "auto", backend: str = "auto", **settings) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), dtype=dtype, max_model_len=256, max_num_seqs=4,
                                  max_num_batched_tokens=24, kv_cache_space=0.02, progress=False,
                                  compiled_forward=compiled, kernel_backend=backend, **settings))


def _recorded_run(engine: LLMEngine) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Runs the workload -> (logits of every step, greedy tokens of every request)."""
    steps: list[torch.Tensor] = []
    runner = engine.runner
    name = "_run_compiled" if runner.compiled is not None else "_run_eager"
    forward = getattr(runner, name)

    def recording(*args):
        logits = forward(*args)
        steps.append(logits.clone())
        return logits

    setattr(runner, name, recording)
    scored = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, prompt_logprobs=2)
    first = engine.generate([PROMPT, SHARED_PREFIX[:20], PROMPT[5:30]], [GREEDY, GREEDY, scored])
    second = engine.generate([SHARED_PREFIX, PROMPT], GREEDY)  # both start with cached blocks
    tokens = [seqs[0].token_ids for seqs in first + second]
    return steps, tokens


def _assert_same_logits(model_dir, dtype: str = "auto", **settings):
    compiled, eager = _engine(model_dir, True, dtype, **settings), _engine(model_dir, False, dtype, **settings)
    assert compiled.runner.compiled is not None, compiled.runner.eager_reason
    assert eager.runner.compiled is None
    compiled_steps, compiled_tokens = _recorded_run(compiled)
    eager_steps, eager_tokens = _recorded_run(eager)
    assert compiled.block_manager.prefix_hits > 0
    assert compiled_tokens == eager_tokens
    assert len(compiled_steps) == len(eager_steps)
    for step, (a, b) in enumerate(zip(compiled_steps, eager_steps)):
        assert torch.equal(a, b), f"step {step}: max difference {(a - b).abs().max().item()}"
    return compiled_tokens


def _relabel(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, default_model_dir):
    """fp32 tiny random checkpoints of every supported variant."""
    dirs = {}
    for kind in ("llama", "qwen2", "qwen3"):
        dirs[kind] = tmp_path_factory.mktemp(kind)
        _save_tiny(kind, dirs[kind], default_model_dir)
    minicpm = tmp_path_factory.mktemp("minicpm")
    shutil.copytree(dirs["llama"], minicpm, dirs_exist_ok=True)
    dirs["minicpm"] = _relabel(minicpm, architectures=["MiniCPMForCausalLM"], model_type="minicpm", scale_emb=12.0,
                               scale_depth=1.4, dim_model_base=16)
    longrope = tmp_path_factory.mktemp("minicpm-longrope")
    shutil.copytree(minicpm, longrope, dirs_exist_ok=True)
    half = 64 // 4 // 2  # head_dim / 2
    dirs["minicpm-longrope"] = _relabel(longrope, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0 + i / 8 for i in range(half)],
        "long_factor": [2.0 + i for i in range(half)], "original_max_position_embeddings": 32})
    return dirs


@pytest.mark.parametrize("kind, scheme", [(kind, "w4a8-g32") for kind in ("llama", "qwen2", "qwen3", "minicpm",
                                                                         "minicpm-longrope")]
                         + [("qwen2", "w8a8"), ("minicpm-longrope", "w8a8"), ("qwen2", "w4a16-g32"),
                            ("minicpm", "w8a16")])
def test_quantized_logits_are_bit_identical(tiny_dirs, tmp_path, kind, scheme):
    quantized = tmp_path / "q"
    _quantize(tiny_dirs[kind], quantized, scheme)
    _assert_same_logits(quantized)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "minicpm-longrope"])
def test_fp32_logits_are_bit_identical(tiny_dirs, kind):
    _assert_same_logits(tiny_dirs[kind], "float32")


def test_smollm2_shaped_w4a8_logits_are_bit_identical(tmp_path):
    """SmolLM2-135M's shapes (9 query heads over 3 KV heads, tied embeddings), 3 random layers."""
    synthesize(tmp_path / "smollm2", "smollm2-135m", "w4a8-g64", layers=3, progress=False)
    _assert_same_logits(tmp_path / "smollm2")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_bf16_logits_are_bit_identical(tiny_dirs, kind):
    """bf16 layers and the tied lm_head (AMX tiles on the amx level) in the plan and in the eager model."""
    model = _engine(tiny_dirs[kind], True, "bfloat16").runner.model
    tiles = _C.dense_variant("bfloat16", "bfloat16") == "amx"
    assert isinstance(model.layers[0].qkv_proj.weight, DenseTileWeight) == tiles
    assert isinstance(model.lm_head.weight, DenseTileWeight) == tiles
    _assert_same_logits(tiny_dirs[kind], "bfloat16")


def test_smollm2_bf16_greedy_tokens_match(default_model_dir):
    prompts = [PROMPT[:6], SHARED_PREFIX[:9]]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    compiled, eager = _engine(default_model_dir, True), _engine(default_model_dir, False)
    assert compiled.runner.compiled is not None, compiled.runner.eager_reason
    outputs = [[seqs[0].token_ids for seqs in engine.generate(prompts, params)] for engine in (compiled, eager)]
    assert outputs[0] == outputs[1]


def test_reference_backend_runs_every_op_eagerly_with_the_same_tokens(tiny_dirs, tmp_path):
    quantized = tmp_path / "q"
    _quantize(tiny_dirs["qwen3"], quantized, "w4a8-g32")
    reference = _engine(quantized, True, backend="reference")
    assert reference.runner.compiled is None and "reference" in reference.runner.eager_reason
    assert all(impl.source == "reference" for impl in reference.runner.model.ops.chosen.values())
    kernel = _engine(quantized, True)
    prompts = [PROMPT, SHARED_PREFIX[:20]]
    assert [s[0].token_ids for s in reference.generate(prompts, GREEDY)] == \
        [s[0].token_ids for s in kernel.generate(prompts, GREEDY)]


def test_the_runner_leaves_sequences_to_the_scheduler(tiny_dirs, tmp_path):
    quantized = tmp_path / "q"
    _quantize(tiny_dirs["llama"], quantized, "w8a8")
    engine = _engine(quantized, True)
    engine.add_request("r", PROMPT[:10], GREEDY)
    batch = engine.scheduler.schedule()
    seq = batch[0].seq
    before = (list(seq.token_ids), seq.num_computed_tokens, list(seq.output_logprobs))
    outputs = engine.runner.step(batch)
    assert (list(seq.token_ids), seq.num_computed_tokens, list(seq.output_logprobs)) == before
    assert outputs[0].num_computed == 10 and len(outputs[0].tokens) == 1
    produced = engine.scheduler.postprocess(batch, outputs)
    assert produced == [(seq, None, 1)]
    assert seq.num_computed_tokens == 10 and seq.output_ids == outputs[0].tokens


def test_executor_rejects_inputs_outside_its_buffers(tiny_dirs, tmp_path):
    quantized = tmp_path / "q"
    _quantize(tiny_dirs["llama"], quantized, "w8a8")
    compiled = _engine(quantized, True).runner.compiled
    buffers = compiled.inputs
    buffers.seqs[0] = torch.tensor([0, 0, 1], dtype=torch.int32)
    buffers.block_tables[0, 0] = 10 ** 6  # not a block of the cache
    with pytest.raises(ValueError, match="outside the cache"):
        compiled.run(1, 1, 1)
    buffers.block_tables[0, 0] = 0
    with pytest.raises(ValueError, match="num_tokens"):
        compiled.run(1, 10 ** 6, 1)
    assert math.isfinite(compiled.run(1, 1, 1).sum().item())


def test_the_op_timer_counts_every_op_of_a_step_and_changes_no_token(tiny_dirs, tmp_path):
    quantized = tmp_path / "q"
    _quantize(tiny_dirs["llama"], quantized, "w4a8-g32")
    engine = _engine(quantized, True)
    exe = engine.runner.compiled.exe
    assert len(exe.op_details) == len(exe.op_names)
    linears = {detail for name, detail in zip(exe.op_names, exe.op_details) if name.endswith("_linear")}
    config = json.loads((quantized / "config.json").read_text())
    assert f"{config['intermediate_size']}x{config['hidden_size']}" in linears or \
        f"{2 * config['intermediate_size']}x{config['hidden_size']}" in linears
    plain = engine.generate([PROMPT], GREEDY)[0][0].token_ids
    exe.set_profiling(True)
    assert exe.op_nanoseconds == [0] * len(exe)
    timed = engine.generate([PROMPT], GREEDY)[0][0].token_ids
    nanoseconds = exe.op_nanoseconds
    exe.set_profiling(False)
    assert timed == plain
    assert len(nanoseconds) == len(exe) and all(ns > 0 for ns in nanoseconds)
    engine.generate([PROMPT], GREEDY)
    assert exe.op_nanoseconds == nanoseconds  # off: nothing more is added


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory, default_model_dir):
    """A tiny random Gemma 3 (4-token sliding window, soft-capping, linear RoPE scaling) with SmolLM2's vocabulary."""
    import transformers

    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(tiny_gemma3_config(vocab_size=49152, max_position_embeddings=256)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    directory = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(default_model_dir / name, directory / name)
    return directory


def test_gemma3_on_the_executor_equals_eager_past_the_window(gemma3_dir):
    """fp32: every step's logits bit for bit, prompts far past the 4-token window."""
    _assert_same_logits(gemma3_dir, "float32")


def test_gemma3_quantized_on_the_executor_equals_eager(gemma3_dir, tmp_path):
    _assert_same_logits(_quantize(gemma3_dir, tmp_path / "q", "w4a8-g32"))


@pytest.mark.parametrize("kind", ["qwen3", "minicpm"])
def test_int8_kv_cache_logits_are_bit_identical(tiny_dirs, tmp_path, kind):
    _assert_same_logits(_quantize(tiny_dirs[kind], tmp_path / "q", "w8a8"), kv_cache_dtype="int8")


def test_a_python_op_splits_the_tape_with_the_same_logits(tiny_dirs, tmp_path, monkeypatch):
    """A plugin op without a C++ entry (here silu_mul as a Python function) runs between executor
    segments on the executor's own buffers; the step's logits stay those of the eager model."""
    from shrike.model import loader
    from shrike.ops import silu_mul_reference
    from shrike.plugins import PluginRegistrar, build_registry

    calls = []

    def python_silu_mul(gate_up, out):
        calls.append(gate_up.shape[0])
        silu_mul_reference(gate_up, out)

    def registry_with_the_plugin_op():
        registry = build_registry(environ={"SHRIKE_PLUGINS": ""})
        PluginRegistrar(registry, "python-silu").register_op("silu_mul", python_silu_mul)
        return registry

    monkeypatch.setattr(loader, "build_registry", registry_with_the_plugin_op)
    quantized = _quantize(tiny_dirs["qwen2"], tmp_path / "q", "w4a8-g32")
    engine = _engine(quantized, True)
    described = engine.runner.compiled.describe()
    assert described["python_ops"] == ["silu_mul"] * engine.runner.model.config.num_layers
    assert described["segments"] == 2 * engine.runner.model.config.num_layers + 1
    _assert_same_logits(quantized)
    assert calls and max(calls) == 24  # whole prefill chunks: the op sees the step's rows, not the buffers' capacity
