"""`shrike doctor` against fixture machines and this one."""

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from shrike import _C
from shrike.doctor import add_doctor_arguments, doctor_main, run_doctor
from shrike.engine.config import EngineConfig

FIXTURES = Path(__file__).parent / "fixtures" / "topology"


def roots(name: str, base: Path = FIXTURES) -> dict[str, str]:
    return {"sysfs_root": str(base / name / "sys"), "procfs_root": str(base / name / "proc")}


def make_model_dir(path: Path, weight_bytes: int, **config) -> Path:
    """A Llama-3.2-1B-shaped model directory: config.json and a (sparse) safetensors file of that size."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 2048, "head_dim": 64, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16", **config,
    }))
    with open(path / "model.safetensors", "wb") as weights:
        weights.truncate(weight_bytes)
    return path


@pytest.fixture
def model_dir(tmp_path):
    return make_model_dir(tmp_path / "llama-1b", 2_471_645_608)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cix_p1_report_shows_the_a720_binding(model_dir, capsys):
    assert run_doctor(EngineConfig(model=str(model_dir), max_model_len=8192),
                      as_json=False, **roots("cix_p1")) == 0
    out = capsys.readouterr().out
    assert "CPU           8x Cortex-A720 + 4x Cortex-A520" in out
    assert "Binding       0,1,6-11 (8 threads)" in out
    assert re.search(r"^  0 +Cortex-A720 \(0xd81\) +1024 +2600 +yes +yes +\*$", out, re.MULTILINE)
    assert re.search(r"^  2 +Cortex-A520 \(0xd80\) +279 +1800 +yes +yes$", out, re.MULTILINE)
    assert "speed classes by cpu_capacity" in out
    assert f"Kernels       {_C.active_isa()}" in out
    assert (f"Linear        W4A8 decode (M=1) {_C.linear_variant('w4a8', 1)}, prefill {_C.linear_variant('w4a8', 512)}; "
            f"W8A8 decode (M=1) {_C.linear_variant('w8a8', 1)}, prefill {_C.linear_variant('w8a8', 512)}") in out
    dense_bf16 = _C.dense_variant("bfloat16", "bfloat16")
    assert f"Dense         bfloat16 {dense_bf16}" in out
    assert ("amx-bf16 tiles (tdpbf16ps" in out) == (dense_bf16 == "amx")
    assert f"; float32 {_C.dense_variant('float32', 'float32')} (lanes order)" in out
    attention_int8 = _C.attention_variant("bfloat16", "int8", 128)
    assert "Attention     bfloat16 queries, bfloat16 cache " in out
    assert f"bfloat16 queries, int8 cache {'amx-bf16 tiles' if attention_int8 == 'amx' else attention_int8}" in out
    assert "Memory        total 30.7 GiB, available 28.7 GiB, cgroup limit none" in out
    assert "16 layers x 8 KV heads x 64 (bfloat16), weights 2.3 GiB, max-model-len 8192" in out
    assert "Ops           add_rmsnorm -> " in out
    for op in ("embedding", "rmsnorm", "w4a8_linear", "w8a8_linear", "dense_linear", "rope_write_kv", "paged_attention",
               "silu_mul"):
        assert f" {op} -> " in out
    assert "SHRIKE_CACHE_DIR=" in out


def test_json_shape(model_dir, capsys):
    assert run_doctor(EngineConfig(model=str(model_dir), max_model_len=8192),
                      as_json=True, **roots("cix_p1")) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"cpu", "topology", "memory", "kv_cache", "caches", "plugins", "environment", "problems"}
    assert report["problems"] == []
    assert report["cpu"]["model"] == "8x Cortex-A720 + 4x Cortex-A520"
    assert report["cpu"]["active_isa"] == _C.active_isa()
    assert report["cpu"]["dense_variants"] == {dtype: _C.dense_variant(dtype, dtype) for dtype in ("bfloat16", "float32")}
    assert report["cpu"]["attention_variants"]["float32 queries, float32 cache"] == \
        _C.attention_variant("float32", "float32", 128)
    assert set(report["cpu"]["features"]) == set(_C.cpu_features())
    topology = report["topology"]
    assert topology["binding"] == "0,1,6-11"
    assert topology["binding_cores"] == [0, 1, 6, 7, 8, 9, 10, 11]
    assert topology["cores"][2] == {"core": 2, "type": "Cortex-A520 (0xd80)", "efficiency_core": True, "capacity": 279,
                                    "max_freq_mhz": 1800, "online": True, "allowed": True}
    assert report["memory"]["available_bytes"] == 30104224 * 1024
    kv = report["kv_cache"]
    assert (kv["num_layers"], kv["num_kv_heads"], kv["head_dim"], kv["max_model_len"]) == (16, 8, 64, 8192)
    assert kv["plan"]["bytes_per_token"] == 2 * 16 * 8 * 64 * 2
    assert kv["plan"]["source"] == "auto" and kv["plan"]["max_concurrent_full_sequences"] >= 1
    assert report["plugins"]["op"]["rmsnorm"]["candidates"][-1]["source"] == "reference"
    assert report["caches"] == {"root": report["environment"]["SHRIKE_CACHE_DIR"], "exists": False}


def test_container_limits_appear(model_dir, capsys):
    assert run_doctor(EngineConfig(model=str(model_dir), max_model_len=4096),
                      as_json=False, **roots("container_restricted")) == 0
    out = capsys.readouterr().out
    assert "Binding       4,5 (2 threads)" in out
    assert "cgroup cpuset 4-11; cgroup CPU quota 2.5 cores" in out
    assert "cgroup limit 8.0 GiB" in out


def test_kv_plan_that_cannot_hold_one_sequence_fails_with_one_line(model_dir, capsys):
    assert run_doctor(EngineConfig(model=str(model_dir), max_model_len=131072),
                      as_json=False, **roots("container_restricted")) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("shrike doctor: the KV cache (")
    assert "lower --max-model-len to at most" in captured.err


def test_max_model_len_beyond_the_model_fails(model_dir, capsys):
    assert run_doctor(EngineConfig(model=str(model_dir), max_model_len=200000),
                      as_json=True, **roots("cix_p1")) == 1
    assert "more than the model's maximum 131072" in json.loads(capsys.readouterr().out)["problems"][0]


def test_missing_model_fails(tmp_path, capsys):
    assert run_doctor(EngineConfig(model=str(tmp_path / "nowhere"), max_model_len=None),
                      as_json=False, **roots("cix_p1")) == 1
    assert "nowhere" in capsys.readouterr().err


def test_no_usable_cores_fails(tmp_path, model_dir, capsys):
    shutil.copytree(FIXTURES / "container_restricted", tmp_path / "machine")
    status = tmp_path / "machine" / "proc" / "self" / "status"
    status.write_text(status.read_text().replace("Cpus_allowed_list:\t4-11", "Cpus_allowed_list:\t0-1"))
    assert run_doctor(EngineConfig(model=str(model_dir), max_model_len=4096),
                      as_json=False, **roots("machine", tmp_path)) == 1
    captured = capsys.readouterr()
    assert "Binding       none" in captured.out
    assert captured.err == "shrike doctor: no usable CPU cores: none of the online cores is in this process's " \
                           "affinity mask and cgroup cpuset\n"


def test_cache_sizes(isolated_cache, model_dir, capsys):
    (isolated_cache / "models" / "m").mkdir(parents=True)
    (isolated_cache / "models" / "m" / "weights.bin").write_bytes(b"\0" * 3 * 2**20)
    run_doctor(EngineConfig(model=str(model_dir), max_model_len=4096), as_json=True, **roots("cix_p1"))
    caches = json.loads(capsys.readouterr().out)["caches"]
    assert caches["exists"] and caches["bytes"] == 3 * 2**20 and caches["directories"] == {"models": 3 * 2**20}


def test_cli_entry_on_this_machine(model_dir, capsys):
    parser = argparse.ArgumentParser()
    add_doctor_arguments(parser)
    assert doctor_main(parser.parse_args([str(model_dir), "--max-model-len", "2048", "--json"])) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["topology"]["binding_cores"]
    assert report["kv_cache"]["max_model_len"] == 2048
