"""Available memory (host and cgroup) and KV-cache sizing."""

from pathlib import Path

import pytest

from shrike.errors import ConfigError
from shrike.platform.memory import AUTO_KV_FRACTION, GIB, RUNTIME_RESERVE_BYTES, plan_kv_cache, read_memory

FIXTURES = Path(__file__).parent / "fixtures" / "topology"
# A Llama-3-8B-shaped model: 32 layers, 8 KV heads of 128, bf16 cache -> 128 KiB per token.
LLAMA8B = dict(num_layers=32, num_kv_heads=8, head_dim=128, kv_dtype_bytes=2, block_size=16)


def fixture_memory(name: str):
    return read_memory(FIXTURES / name / "sys", FIXTURES / name / "proc")


def test_host_memory_without_cgroup_limit():
    memory = fixture_memory("cix_p1")
    assert memory.total_bytes == 32212168 * 1024
    assert memory.available_bytes == memory.host_available_bytes == 30104224 * 1024
    assert memory.cgroup_limit_bytes is None


def test_cgroup_v2_limit_caps_available_memory():
    memory = fixture_memory("container_restricted")
    assert memory.cgroup_limit_bytes == 8 * GIB
    # 8 GiB limit - (1.5 GiB charged - 0.25 GiB reclaimable page cache)
    assert memory.available_bytes == 8 * GIB - (1536 - 256) * 2**20
    assert memory.host_available_bytes > 100 * GIB


def test_cgroup_v1_limit_caps_available_memory():
    memory = fixture_memory("cgroup_v1_container")
    assert memory.cgroup_limit_bytes == 4 * GIB
    assert memory.available_bytes == 4 * GIB - (1280 - 256) * 2**20


def test_this_machine():
    memory = read_memory()
    assert 0 < memory.available_bytes <= memory.total_bytes


def test_bytes_per_token_counts_keys_and_values():
    plan = plan_kv_cache(**LLAMA8B, max_model_len=8192, weight_bytes=0, kv_cache_space_gib=4, available_bytes=64 * GIB)
    assert plan.bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_flag_sets_the_cache_size():
    plan = plan_kv_cache(**LLAMA8B, max_model_len=8192, weight_bytes=16 * GIB, kv_cache_space_gib=4,
                         available_bytes=30 * GIB)
    assert plan.source == "flag"
    assert plan.cache_bytes == 4 * GIB
    assert plan.capacity_tokens == 32768 == plan.num_blocks * 16
    assert plan.max_concurrent_full_sequences == 4
    assert "--kv-cache-space 4 GiB" in plan.reason


def test_auto_takes_a_fraction_of_available_memory_after_weights():
    available, weights = 30 * GIB, 16 * GIB
    plan = plan_kv_cache(**LLAMA8B, max_model_len=8192, weight_bytes=weights, available_bytes=available)
    budget = (available - weights - RUNTIME_RESERVE_BYTES) * AUTO_KV_FRACTION
    assert plan.source == "auto"
    assert budget - 16 * plan.bytes_per_token < plan.cache_bytes <= budget
    assert plan.max_concurrent_full_sequences == plan.num_blocks // (8192 // 16)


def test_auto_depends_on_available_not_total_memory():
    """A machine busy with other work still starts, with a smaller cache."""
    roomy = plan_kv_cache(**LLAMA8B, max_model_len=4096, weight_bytes=GIB, available_bytes=20 * GIB)
    busy = plan_kv_cache(**LLAMA8B, max_model_len=4096, weight_bytes=GIB, available_bytes=3 * GIB)
    assert busy.num_blocks < roomy.num_blocks
    assert busy.max_concurrent_full_sequences >= 1


def test_auto_is_capped_by_max_num_seqs():
    plan = plan_kv_cache(**LLAMA8B, max_model_len=2048, weight_bytes=GIB, available_bytes=64 * GIB, max_num_seqs=3)
    assert plan.num_blocks == 3 * 2048 // 16
    assert plan.max_concurrent_full_sequences == 3
    assert "max_num_seqs=3" in plan.reason


def test_auto_without_room_for_one_sequence_says_what_to_change():
    with pytest.raises(ConfigError) as error:
        plan_kv_cache(**LLAMA8B, max_model_len=131072, weight_bytes=16 * GIB, available_bytes=20 * GIB)
    message = str(error.value)
    assert "--max-model-len 131072 sequence needs 16.0 GiB" in message
    assert "lower --max-model-len to at most" in message and "free memory" in message
    assert "\n" not in message


def test_flag_too_small_for_one_sequence_says_what_to_change():
    with pytest.raises(ConfigError, match=r"lower --max-model-len to at most 8192 or raise --kv-cache-space to at least 4 GiB"):
        plan_kv_cache(**LLAMA8B, max_model_len=32768, weight_bytes=0, kv_cache_space_gib=1, available_bytes=30 * GIB)


def test_flag_larger_than_available_memory_is_rejected():
    with pytest.raises(ConfigError, match=r"--kv-cache-space 20 GiB does not fit: 24.0 GiB is available, the weights take 16.0 GiB"):
        plan_kv_cache(**LLAMA8B, max_model_len=8192, weight_bytes=16 * GIB, kv_cache_space_gib=20,
                      available_bytes=24 * GIB)


def test_weights_larger_than_memory_leave_no_cache():
    with pytest.raises(ConfigError, match="no memory is left for the KV cache"):
        plan_kv_cache(**LLAMA8B, max_model_len=8192, weight_bytes=16 * GIB, available_bytes=12 * GIB)


@pytest.mark.parametrize(
    "overrides, message",
    [({"max_model_len": 0}, "--max-model-len 0"), ({"kv_cache_space_gib": -1}, "--kv-cache-space -1"),
     ({"max_num_seqs": 0}, "--max-num-seqs 0")],
)
def test_invalid_settings(overrides, message):
    settings = dict(LLAMA8B, max_model_len=4096, weight_bytes=0, available_bytes=8 * GIB) | overrides
    with pytest.raises(ConfigError, match=message):
        plan_kv_cache(**settings)
