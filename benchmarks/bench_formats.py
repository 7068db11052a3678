"""Checkpoint formats side by side on SmolLM2-135M: decode tokens/s and perplexity on two texts.

    python benchmarks/bench_formats.py [--out benchmarks/results/formats-smollm2-135m.md] [--rounds 3]
                                       [--lock /work/wt/bench.lock]

Checkpoints: bf16 (the default model); W4A16 g64 symmetric and asymmetric, W8A16 per channel and
FP8-dynamic, all quantized and compressed by the `compressed-tensors` library itself (min-max
qparams, round to nearest; the test extra installs it); W4A8-G64 by `shrike quantize` (round to
nearest). Weight-only checkpoints also run with `--activation-quant int8`.

Perplexity: tests/data/public_domain_english.txt and tests/data/calibration_bill_of_rights.txt,
non-overlapping 512-token chunks (shrike.eval_ppl). Decode: batch 1, 128 generated tokens after a
16-token prompt on the compiled forward; the rate is (128 - 1) tokens over the time after the first
token; every model runs once per round, the rounds interleaved, the median reported. With --lock,
only the timed part holds that file's lock (flock), so a shared machine runs one benchmark at a time.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from shrike import _C
from shrike.default_model import default_model_dir
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.eval_ppl import evaluate_perplexity, scoring_bos
from shrike.model.config import ModelConfig
from shrike.model.loader import load_model
from shrike.quantization.quantize_checkpoint import linear_prefixes, quantize_checkpoint
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.quantization.schemes import SCHEMES
from shrike.sampling.params import SamplingParams

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
TEXTS = {"declaration": DATA / "public_domain_english.txt", "bill of rights": DATA / "calibration_bill_of_rights.txt"}
CONTEXT = 512
DECODE_TOKENS = 128


def library_checkpoint(src: Path, dst: Path, preset: str, fmt: str, group_size: int | None) -> Path:
    """src's linears quantized and compressed by compressed-tensors (lm_head kept in bf16)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.model_compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    from safetensors.torch import save_file

    scheme = preset_name_to_scheme(preset, ["Linear"])
    scheme.weights.group_size = group_size
    scheme.weights.strategy = "group" if group_size else "channel"  # the W8A16 preset is per group of 128
    compressor = BaseCompressor.load_from_registry(fmt)
    source = CheckpointFiles(src)
    prefixes = set(linear_prefixes(ModelConfig.from_dir(src)))
    tensors = {}
    for name in source.names():
        prefix = name.removesuffix(".weight")
        weight = source.read(name)
        if prefix not in prefixes:
            tensors[name] = weight
            continue
        grouped = weight.float().reshape(weight.shape[0], -1, group_size or weight.shape[1])
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights)
        compressed = compressor.compress({"weight": weight, "weight_scale": scale.bfloat16(),
                                          "weight_zero_point": zero}, scheme)
        tensors.update({f"{prefix}.{k}": v for k, v in compressed.items()})
    dst.mkdir(parents=True)
    save_file(tensors, str(dst / "model.safetensors"))
    for file in src.iterdir():
        if file.suffix != ".safetensors" and file.is_file():
            (dst / file.name).write_bytes(file.read_bytes())
    ModelCompressor(quantization_config=QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                                           format=fmt)).update_config(str(dst))
    return dst


def build_checkpoints(src: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (checkpoint directory, --activation-quant)."""
    w4_sym = library_checkpoint(src, root / "w4a16-g64", "W4A16", "pack-quantized", 64)
    w4_asym = library_checkpoint(src, root / "w4a16-g64-asym", "W4A16_ASYM", "pack-quantized", 64)
    w8 = library_checkpoint(src, root / "w8a16", "W8A16", "pack-quantized", None)
    fp8 = library_checkpoint(src, root / "fp8-dynamic", "FP8_DYNAMIC", "float-quantized", None)
    quantize_checkpoint(src, root / "w4a8-g64", SCHEMES["w4a8-g64"], progress=False)
    return {"bf16": (src, "none"),
            "W4A16 g64 sym": (w4_sym, "none"), "W4A16 g64 asym": (w4_asym, "none"), "W8A16": (w8, "none"),
            "W4A16 g64 sym, --activation-quant int8": (w4_sym, "int8"),
            "W4A16 g64 asym, --activation-quant int8": (w4_asym, "int8"),
            "W8A16, --activation-quant int8": (w8, "int8"),
            "FP8-dynamic (-> int8 W8A8)": (fp8, "none"), "W4A8-G64 (shrike quantize)": (root / "w4a8-g64", "none")}


def perplexities(path: Path, activation_quant: str) -> dict[str, float]:
    loaded = load_model(str(path), progress=False, activation_quant=activation_quant)
    out = {}
    for name, text in TEXTS.items():
        ids = loaded.tokenizer.encode(text.read_text(), add_special_tokens=False)
        bos, _ = scoring_bos(loaded.tokenizer, loaded.model_dir)  # none for SmolLM2; as eval-ppl scores
        out[name] = evaluate_perplexity(loaded.model, ids, CONTEXT, bos_token_id=bos).perplexity
    return out


def decode_seconds(engine: LLMEngine, prompt: list[int], tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    engine.generate([prompt], params)
    return time.perf_counter() - start


@contextlib.contextmanager
def _locked(path: Path | None):
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "formats-smollm2-135m.md")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lock", type=Path, default=None, help="hold this file's flock while timing")
    args = p.parse_args()
    src = default_model_dir()
    with tempfile.TemporaryDirectory() as tmp:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the library's quantizer: many small tensors, faster on one thread
        checkpoints = build_checkpoints(src, Path(tmp))
        torch.set_num_threads(threads)
        ppl = {name: perplexities(path, act) for name, (path, act) in checkpoints.items()}
        write_report(args.out, checkpoints, ppl, None, args.rounds)
        engines = {name: LLMEngine(EngineConfig(model=str(path), activation_quant=act, max_model_len=512,
                                                kv_cache_space=0.05, max_num_seqs=1, progress=False))
                   for name, (path, act) in checkpoints.items()}
        prompt = engines["bf16"].tokenizer.encode("The history of the printing press begins")[:16]
        rates: dict[str, list[float]] = {name: [] for name in engines}
        with _locked(args.lock):
            for name, engine in engines.items():  # warm-up
                decode_seconds(engine, prompt, 8)
            for _ in range(args.rounds):
                for name, engine in engines.items():
                    first = decode_seconds(engine, prompt, 1)
                    total = decode_seconds(engine, prompt, DECODE_TOKENS)
                    rates[name].append((DECODE_TOKENS - 1) / (total - first))
    write_report(args.out, checkpoints, ppl, rates, args.rounds)


def write_report(out: Path, checkpoints: dict, ppl: dict, rates: dict[str, list[float]] | None, rounds: int) -> None:
    """The results table; rates None: perplexity only (written before the timed part waits for the lock)."""
    bf16_rate = statistics.median(rates["bf16"]) if rates else None
    rows = ["| checkpoint | decode tok/s (median) | vs bf16 | ppl declaration | ppl bill of rights |",
            "|---|---|---|---|---|"]
    for name in checkpoints:
        rate = statistics.median(rates[name]) if rates else None
        timing = f"{rate:.1f} | {rate / bf16_rate:.2f}x" if rates else "not yet timed | "
        rows.append(f"| {name} | {timing} | {ppl[name]['declaration']:.3f} | {ppl[name]['bill of rights']:.3f} |")
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True, text=True,
                         check=False).stdout
    report = "\n".join([
        "# Checkpoint formats on SmolLM2-135M-Instruct",
        "",
        f"`python benchmarks/bench_formats.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{cpu.split(':', 1)[-1].strip() or platform.processor()}, kernel variant {_C.active_isa()}, "
        f"{torch.get_num_threads()} torch threads; decode batch 1, {DECODE_TOKENS} tokens, median of "
        f"{rounds} interleaved rounds; perplexity with {CONTEXT}-token chunks. Timed on a shared machine "
        "(other jobs running): compare the ratios, not the absolute rates.",
        "",
        *rows,
        ""])
    out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
