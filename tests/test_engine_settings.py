"""One declaration of the engine settings (shrike.engine.config): every engine flag is taken by `shrike serve`,
`generate`, `eval-ppl` and `doctor` and as a keyword of `LLM`, with the same default, value and error text;
and the front ends run with them for real."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from shrike import LLM, SamplingParams
from shrike.cli import build_parser, main
from shrike.engine.config import EngineConfig, engine_config_from_args, engine_flags, flag_name
from shrike.errors import ConfigError
from shrike.speculative.config import SpeculativeConfig
from test_server_lifecycle import SERVED_NAME, running_server

TEXT = "tests/data/public_domain_english.txt"
# What each command needs besides the engine flags.
COMMANDS = {"serve": [], "generate": ["--prompt", "Hello"], "eval-ppl": [TEXT], "doctor": []}

# name -> (a value as typed on a command line, the value the engine then runs with); not the default.
GOOD = {
    "dtype": ("float32", "float32"),
    "max_model_len": ("128", 128),
    "max_num_seqs": ("3", 3),
    "max_num_batched_tokens": ("100", 100),
    "kv_cache_space": ("0.05", 0.05),
    "kv_cache_dtype": ("int8", "int8"),
    "chat_template": ("{{ messages[0]['content'] }}", "{{ messages[0]['content'] }}"),
    "enable_prefix_caching": (None, False),  # --no-enable-prefix-caching
    "cpu_threads": ("1", 1),
    "cpu_bind": ("0", "0"),
    "kernel_backend": ("reference", "reference"),
    "lm_head_quant": ("int8", "int8"),
    "activation_quant": ("int8", "int8"),
    "gguf_weights": ("bf16", "bf16"),
    "speculative_config": ('{"method": "ngram", "num_speculative_tokens": 2}',
                           SpeculativeConfig("ngram", 2, prompt_lookup_min=5, prompt_lookup_max=5)),
    "runner": ("pooling", "pooling"),
    "task": ("embed", "embed"),
    "enable_lora": (None, True),  # --enable-lora
    "lora_modules": ("sql=/adapters/sql", (("sql", "/adapters/sql"),)),
    "max_loras": ("2", 2),
    "max_lora_rank": ("8", 8),
    "allow_runtime_lora": (None, True),
}
# name -> a value each front end must refuse (a boolean flag has no wrong value on a command line).
BAD = {
    "dtype": "float8", "max_model_len": "1", "max_num_seqs": "0", "max_num_batched_tokens": "many",
    "kv_cache_space": "0", "kv_cache_dtype": "fp8", "chat_template": "no/such/template.jinja",
    "cpu_threads": "0", "cpu_bind": "0-x", "kernel_backend": "cuda", "lm_head_quant": "int4",
    "activation_quant": "fp8", "speculative_config": '{"method": "eagle", "num_speculative_tokens": 2}',
    "gguf_weights": "q4", "runner": "encode", "task": "classify", "lora_modules": "sql", "max_loras": "0", "max_lora_rank": "0",
}


def _flag_tokens(name: str) -> list[str]:
    typed, expected = GOOD[name]
    if typed is None:  # a boolean flag: --flag or --no-flag, whichever is not the default
        return [flag_name(name)] if expected else [f"--no-{flag_name(name)[2:]}"]
    return [flag_name(name), typed]


def test_every_engine_flag_has_a_test_value():
    assert set(GOOD) == set(engine_flags())
    assert set(BAD) == {name for name in engine_flags() if not isinstance(getattr(EngineConfig(), name), bool)}


@pytest.mark.parametrize("name", list(engine_flags()))
def test_every_front_end_takes_the_flag_with_one_default_and_one_value(name):
    typed, expected = GOOD[name]
    default = getattr(EngineConfig(), name)
    assert expected != default
    assert getattr(EngineConfig(**{name: expected}), name) == expected  # LLM(...) takes the same keyword
    parser = build_parser()
    for command, extra in COMMANDS.items():
        unset = engine_config_from_args(parser.parse_args([command, *extra]))
        assert getattr(unset, name) == default, command
        given = engine_config_from_args(parser.parse_args([command, *extra, *_flag_tokens(name)]))
        assert getattr(given, name) == expected, command


@pytest.mark.parametrize("name", list(BAD))
def test_a_wrong_value_is_the_same_one_line_everywhere(name, capsys):
    with pytest.raises(ConfigError) as refused:
        LLM(**{name: BAD[name]})  # refused before any model loads
    message = str(refused.value)
    assert "\n" not in message and (flag_name(name) in message or "speculative config" in message)
    for command, extra in COMMANDS.items():
        assert main([command, *extra, flag_name(name), BAD[name]]) == 2
        assert capsys.readouterr().err == f"shrike {command}: error: {message}\n"


def test_a_mistyped_flag_is_one_line_naming_its_command(capsys):
    for command, extra in COMMANDS.items():
        with pytest.raises(SystemExit) as exited:
            main([command, *extra, "--kv-cache-type=int8"])
        assert exited.value.code == 2
        assert capsys.readouterr().err == f"shrike {command}: error: unrecognized arguments: --kv-cache-type=int8\n"


# End to end: every command with engine flags it used to lack or ignore (the slow reference backend left out).
RUN_FLAGS = ["--max-model-len", "256", "--max-num-seqs", "2", "--max-num-batched-tokens", "64",
             "--kv-cache-space", "0.05", "--kv-cache-dtype", "int8", "--no-enable-prefix-caching",
             "--cpu-threads", "1", "--lm-head-quant", "int8",
             "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}']


def test_generate_runs_with_the_engine_flags(default_model_dir):
    result = subprocess.run([sys.executable, "-m", "shrike.cli", "generate", str(default_model_dir), *RUN_FLAGS,
                             "--prompt", "The capital of France is", "--max-tokens", "8", "--stats"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "speculative decoding:" in result.stderr and "Traceback" not in result.stderr


def test_eval_ppl_runs_with_the_engine_flags(default_model_dir):
    # A process of its own: --cpu-threads binds the process that runs it.
    result = subprocess.run([sys.executable, "-m", "shrike.cli", "eval-ppl", str(default_model_dir), TEXT, *RUN_FLAGS,
                             "--context", "64"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("perplexity ") and "chunks of up to 64" in result.stdout


def test_doctor_plans_with_the_engine_flags(default_model_dir, capsys):
    assert main(["doctor", str(default_model_dir), *RUN_FLAGS, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    kv = report["kv_cache"]
    assert kv["kv_dtype"] == "int8" and kv["max_model_len"] == 256
    assert kv["plan"]["source"] == "flag" and kv["plan"]["reason"] == "--kv-cache-space 0.05 GiB"
    assert len(report["topology"]["binding_cores"]) == 1  # --cpu-threads 1


def test_serve_runs_with_the_engine_flags(default_model_dir, tmp_path):
    with running_server(default_model_dir, tmp_path / "server.log", *RUN_FLAGS) as server:
        startup = next(line for line in server.log.splitlines() if "serving" in line)
        for part in ("max-model-len 256", "KV cache int8", "--kv-cache-space 0.05 GiB", "max-num-seqs 2"):
            assert part in startup
        body = {"model": SERVED_NAME, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
        response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200 and response.json()["choices"][0]["text"]


def test_int8_cache_with_a_draft_model_generates_what_int8_alone_does(default_model_dir):
    engine_args = dict(max_model_len=256, kv_cache_space=0.05, kv_cache_dtype="int8", progress=False)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = "The capital of France is"
    plain = LLM(str(default_model_dir), **engine_args).generate([prompt], params)[0].outputs[0]
    drafted = LLM(str(default_model_dir), **engine_args,
                  speculative_config={"model": str(default_model_dir), "num_speculative_tokens": 3})
    output = drafted.generate([prompt], params)[0].outputs[0]
    assert output.token_ids == plain.token_ids and len(output.token_ids) == 12
    assert drafted.llm_engine.speculator.stats.num_accepted > 0  # the draft really proposed
