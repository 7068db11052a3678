"""--speculative-config is parsed as vLLM spells it; a bad one is a one-line error before anything loads."""
from __future__ import annotations

import subprocess
import sys

import pytest

from shrike import LLM
from shrike.errors import ConfigError
from shrike.speculative.config import SpeculativeConfig, parse_speculative_config


def test_ngram_defaults_follow_vllm():
    assert parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 5}') == \
        SpeculativeConfig("ngram", 5, prompt_lookup_min=5, prompt_lookup_max=5)
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}) == \
        SpeculativeConfig("ngram", 4, prompt_lookup_min=3, prompt_lookup_max=3)
    assert parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}') == \
        SpeculativeConfig("ngram", 5, prompt_lookup_min=2, prompt_lookup_max=4)
    assert parse_speculative_config('{"model": "/m", "num_speculative_tokens": 4}') == \
        SpeculativeConfig("draft_model", 4, model="/m")
    assert parse_speculative_config(None) is None


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method must be"),
    ('{"method": "ngram"}', "num_speculative_tokens is required"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be"),
    ('{"method": "ngram", "num_speculative_tokens": "4"}', "num_speculative_tokens must be"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
     "must not exceed"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "promt_lookup_max": 2}', "unknown key"),
    ('{"method": "draft_model", "num_speculative_tokens": 4}', "needs .model."),
])
def test_bad_configs_are_one_line_errors(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_speculative_config(text)
    assert "\n" not in str(info.value)


def test_python_api_rejects_a_bad_config():
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        LLM(speculative_config={"method": "ngram", "num_speculative_tokens": -1})


def test_cli_rejects_a_bad_config_in_one_line():
    result = subprocess.run([sys.executable, "-m", "shrike.cli", "generate", "--prompt", "hi",
                             "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "x": 1}'],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key(s) x" in lines[0], result.stderr
