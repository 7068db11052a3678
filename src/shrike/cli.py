"""`shrike` command line: generate, convert, doctor (and more as the engine grows)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shrike import __version__
from shrike.engine.config import add_engine_arguments, engine_config_from_args
from shrike.errors import ConfigError


class _OneLineErrorParser(argparse.ArgumentParser):
    """A mistyped command line gets one line naming what is wrong, not the usage block above it (as `serve` does)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--min-tokens", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="shrike", description="Shrike: CPU-native LLM serving with ahead-of-time compiled SIMD kernels.")
    parser.add_argument("--version", action="version", version=f"shrike {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = sub.choices  # name -> its parser, so a stray argument is reported by its command

    gen = sub.add_parser("generate", help="generate text from a prompt, streamed to the terminal",
                         description="Generate a continuation (or a chat answer with --chat) and stream it.")
    add_engine_arguments(gen)
    gen.add_argument("--prompt", required=True, help="prompt text (the user message with --chat)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--system", default=None, help="system message (with --chat)")
    _add_sampling_arguments(gen)
    gen.add_argument("--stats", action="store_true",
                     help="print time to first token, decode speed (and speculative acceptance) to stderr")

    conv = sub.add_parser("convert", help="convert a GGUF file to a Hugging Face-style directory",
                          description="Convert a GGUF (llama or gemma3 architecture, any common tensor type) into "
                                      "bf16 safetensors + tokenizer + config, or with --quantize into W4A8/W8A8.")
    conv.add_argument("src", type=Path, help="input .gguf file")
    conv.add_argument("dst", type=Path, help="output directory")
    from shrike.quantization.schemes import SCHEMES
    conv.add_argument("--quantize", default=None, choices=list(SCHEMES), metavar="SCHEME",
                      help=f"re-quantize the linear layers to {' | '.join(SCHEMES)} (compressed-tensors) "
                           "instead of writing bf16")

    from shrike.doctor import add_doctor_arguments
    doc = sub.add_parser("doctor", help="show CPU, kernels, core binding, memory plan, caches and plugins",
                         description="Explain what Shrike detected and would use on this machine.")
    add_doctor_arguments(doc)

    from shrike.server.args import add_serve_arguments
    from shrike.server.ray.args import add_ray_arguments
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                           description="Serve a model over an OpenAI-compatible HTTP API.")
    add_serve_arguments(serve)
    add_ray_arguments(serve)

    from shrike.eval_ppl import add_eval_ppl_arguments
    from shrike.quantization.quantize_checkpoint import add_quantize_arguments
    from shrike.synth import add_synth_arguments
    add_quantize_arguments(sub.add_parser("quantize", help="quantize a checkpoint to W4A8 or W8A8 (compressed-tensors)",
                                          description="Write a compressed-tensors W4A8 or W8A8 copy of a checkpoint."))
    add_synth_arguments(sub.add_parser("synth", help="write a random-weight checkpoint with a real model's shapes",
                                       description="Write a random-weight checkpoint for benchmarks and tests."))
    add_eval_ppl_arguments(sub.add_parser("eval-ppl", help="perplexity of a model on a text file",
                                          description="Perplexity over non-overlapping chunks of --context tokens."))
    bench = sub.add_parser("bench", help="run a benchmark (pass --help after the suite name): "
                           + ", ".join(sorted(BENCHMARKS)),
                           description="Benchmarks from benchmarks/ (see benchmarks/README.md): "
                                       "`shrike bench SUITE --help` for a suite's own options.")
    bench.add_argument("suite", choices=sorted(BENCHMARKS))
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark itself")
    return parser


ENGINE_COMMANDS = ("generate", "serve", "eval-ppl", "doctor")  # the commands that take every engine flag
BENCHMARKS = {"kernels": "bench_kernels", "serving": "bench_serving", "reference": "bench_reference", "soak": "soak",
              "spec": "bench_spec", "long-context": "bench_long_context", "gguf-import": "bench_gguf_import",
              "vllm": "bench_vs_vllm", "quality": "bench_quality"}


def _bench(args: argparse.Namespace) -> int:
    import importlib.util
    # Benchmarks live in the source checkout (benchmarks/), next to src/ of an editable install.
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{BENCHMARKS[args.suite]}.py"
    if not path.is_file():
        raise ConfigError(f"{path} not found: `shrike bench` runs from a source checkout (pip install -e .)")
    spec = importlib.util.spec_from_file_location(BENCHMARKS[args.suite], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(args.bench_args)


def _generate(args: argparse.Namespace) -> int:
    from shrike.generate import run_generate
    return run_generate(args)


def _convert(args: argparse.Namespace) -> int:
    from shrike.convert import convert_gguf
    if not args.src.is_file():
        raise ConfigError(f"{args.src} is not a file")
    if args.quantize is None:
        convert_gguf(args.src, args.dst)
    else:
        from shrike.convert.quantized import convert_and_quantize
        convert_and_quantize(args.src, args.dst, args.quantize)
    print(f"wrote {args.dst}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from shrike.doctor import doctor_main
    return doctor_main(args)


def _serve(args: argparse.Namespace) -> int:
    from shrike.server.ray.args import check_ray_arguments
    check_ray_arguments(args)
    if args.ray:
        from shrike.server.ray.launch import ray_serve_main
        return ray_serve_main(args)
    from shrike.server.serve import serve_main
    return serve_main(args)


def _quantize(args: argparse.Namespace) -> int:
    from shrike.quantization.quantize_checkpoint import run_quantize
    return run_quantize(args)


def _synth(args: argparse.Namespace) -> int:
    from shrike.synth import run_synth
    return run_synth(args)


def _eval_ppl(args: argparse.Namespace) -> int:
    from shrike.eval_ppl import run_eval_ppl
    return run_eval_ppl(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    handlers = {"generate": _generate, "convert": _convert, "doctor": _doctor, "bench": _bench, "serve": _serve,
                "quantize": _quantize, "synth": _synth, "eval-ppl": _eval_ppl}
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command in ENGINE_COMMANDS:
            engine_config_from_args(args)  # every engine flag is checked before any work starts
        return handlers[args.command](args)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"shrike {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
