"""Core topology and binding, read from fixture sysfs/procfs trees.

cix_p1 follows the CIX P1's ACPI numbering: Cortex-A720 on cores 0,1,6-11 and Cortex-A520 on
2-5. Its cpu_capacity values are the kernel's: capacity-dmips-mhz from the SoC's device tree
(A720 1024, A520 403) times each core's maximum frequency, scaled so the fastest core is 1024.
"""

import os
import shutil
from pathlib import Path

import pytest

from shrike.errors import ConfigError
from shrike.platform.topology import format_cpu_list, parse_cpu_list, read_topology, resolve_binding

FIXTURES = Path(__file__).parent / "fixtures" / "topology"


def fixture_topology(name: str, **kwargs):
    return read_topology(FIXTURES / name / "sys", FIXTURES / name / "proc", **kwargs)


def copy_fixture(tmp_path: Path, name: str) -> Path:
    tree = tmp_path / name
    shutil.copytree(FIXTURES / name, tree)
    return tree


@pytest.fixture(scope="module")
def cix():
    return fixture_topology("cix_p1")


@pytest.mark.parametrize(
    "text, cores",
    [("0,1,6-11", [0, 1, 6, 7, 8, 9, 10, 11]), ("3", [3]), ("0-1\n", [0, 1]), (" 5 , 2-3 ", [2, 3, 5]), ("", []),
     ("1,1,0-1", [0, 1])],
)
def test_parse_cpu_list(text, cores):
    assert parse_cpu_list(text) == cores


@pytest.mark.parametrize("text", ["abc", "1-", "-3", "1,,2", "5-2", "0x3", "1.5", "2-3-4", "0-99999999", "²"])
def test_parse_cpu_list_rejects_garbage(text):
    with pytest.raises(ValueError, match="invalid CPU list"):
        parse_cpu_list(text)


@pytest.mark.parametrize(
    "cores, text",
    [([0, 1, 6, 7, 8, 9, 10, 11], "0,1,6-11"), ([4, 5], "4,5"), ([7, 5, 6], "5-7"), ([], ""), ([3, 0, 9, 1, 2], "0-3,9")],
)
def test_format_cpu_list(cores, text):
    assert format_cpu_list(cores) == text
    assert parse_cpu_list(text) == sorted(cores)


def test_cix_p1_reads_core_types_capacities_and_frequencies(cix):
    by_id = {core.id: core for core in cix.cores}
    assert len(by_id) == 12
    assert by_id[0].kind.name == "Cortex-A720" and by_id[0].kind.label == "Cortex-A720 (0xd81)"
    assert by_id[3].kind.name == "Cortex-A520" and by_id[3].kind.efficiency
    assert (by_id[0].capacity, by_id[0].max_freq_khz) == (1024, 2600000)
    assert (by_id[2].capacity, by_id[2].max_freq_khz) == (279, 1800000)
    assert cix.cpu_model == "8x Cortex-A720 + 4x Cortex-A520"


def test_cix_p1_defaults_to_the_a720_cores(cix):
    assert cix.speed_classes(cix.usable)[0] == "cpu_capacity"
    assert format_cpu_list(cix.default_cores) == "0,1,6-11"
    assert resolve_binding(None, None, cix) == [0, 1, 6, 7, 8, 9, 10, 11]


def test_cix_p1_fastest_first_orders_by_capacity(cix):
    assert cix.fastest_first(range(12)) == [0, 1, 6, 7, 8, 9, 10, 11, 2, 3, 4, 5]


def test_frequency_splits_classes_when_capacity_does_not(tmp_path):
    """Firmware that reports 1024 for every core still has big and little cores apart by frequency."""
    tree = copy_fixture(tmp_path, "cix_p1")
    for capacity in (tree / "sys/devices/system/cpu").glob("cpu*/cpu_capacity"):
        capacity.write_text("1024\n")
    topology = read_topology(tree / "sys", tree / "proc")
    assert topology.speed_classes(topology.usable)[0] == "max frequency"
    assert format_cpu_list(topology.default_cores) == "0,1,6-11"


def test_core_type_splits_classes_without_capacity_or_frequency(tmp_path):
    tree = copy_fixture(tmp_path, "cix_p1")
    for path in [*(tree / "sys/devices/system/cpu").glob("cpu*/cpu_capacity"),
                 *(tree / "sys/devices/system/cpu").glob("cpu*/cpufreq/cpuinfo_max_freq")]:
        path.unlink()
    topology = read_topology(tree / "sys", tree / "proc")
    assert topology.speed_classes(topology.usable)[0] == "core type"
    assert format_cpu_list(topology.default_cores) == "0,1,6-11"


def test_homogeneous_x86_uses_every_core_despite_favoured_turbo_cores():
    topology = fixture_topology("x86_homogeneous")
    assert topology.cpu_model == "11th Gen Intel(R) Core(TM) i7-11700K @ 3.60GHz"
    assert {core.max_freq_khz for core in topology.cores} == {4900000, 5000000}
    assert topology.speed_classes(topology.usable)[0] is None
    assert topology.default_cores == list(range(8))


def test_container_cpuset_and_quota_restrict_the_default():
    topology = fixture_topology("container_restricted")
    assert topology.cgroup.cpu_quota_cores == 2.5
    assert topology.cgroup.cpuset == tuple(range(4, 12))
    assert topology.usable == list(range(4, 12))
    assert topology.default_cores == [4, 5]  # 2.5 cores of quota: two threads run unthrottled


def test_affinity_can_be_injected():
    topology = fixture_topology("container_restricted", affinity=[2, 3, 9, 10, 11])
    assert topology.usable == [9, 10, 11]  # the cgroup cpuset still applies
    assert topology.default_cores == [9, 10]


def test_affinity_to_little_cores_only_uses_them():
    topology = fixture_topology("cix_p1", affinity=[2, 3, 4])
    assert topology.default_cores == [2, 3, 4]


def test_cgroup_v1_container_without_namespace():
    topology = fixture_topology("cgroup_v1_container")
    assert topology.cgroup.cpu_quota_cores == 1.5
    assert topology.cgroup.cpuset == (0, 1, 2, 3)
    assert topology.default_cores == [0]


def test_offline_cores_are_not_used(tmp_path):
    tree = copy_fixture(tmp_path, "cix_p1")
    (tree / "sys/devices/system/cpu/online").write_text("0-5,8-11\n")
    topology = read_topology(tree / "sys", tree / "proc")
    assert topology.default_cores == [0, 1, 8, 9, 10, 11]
    with pytest.raises(ConfigError, match="cores 6,7 are offline"):
        resolve_binding(None, "0,6,7", topology)


def test_cpu_threads_picks_the_fastest_cores(cix):
    assert resolve_binding(2, None, cix) == [0, 1]
    assert resolve_binding(4, None, cix) == [0, 1, 6, 7]
    assert resolve_binding(10, None, cix) == [0, 1, 2, 3, 6, 7, 8, 9, 10, 11]


def test_cpu_bind_uses_exactly_the_list(cix):
    assert resolve_binding(None, "2-5", cix) == [2, 3, 4, 5]
    assert resolve_binding(None, "11,0", cix) == [0, 11]


def test_cpu_threads_with_cpu_bind_picks_fastest_within_the_list(cix):
    assert resolve_binding(2, "2,3,10,11", cix) == [10, 11]
    with pytest.raises(ConfigError, match="--cpu-threads 5 is more than the 4 cores --cpu-bind 2,3,10,11 lists"):
        resolve_binding(5, "2,3,10,11", cix)


@pytest.mark.parametrize(
    "threads, bind, message",
    [
        (None, "0,banana", "--cpu-bind: invalid CPU list"),
        (None, "0-15", "cores 12-15 do not exist"),
        (None, "", "--cpu-bind is empty"),
        (0, None, "--cpu-threads 0: give at least 1"),
        (13, None, "--cpu-threads 13 is more than the 12 cores this process may use"),
    ],
)
def test_invalid_overrides(cix, threads, bind, message):
    with pytest.raises(ConfigError, match=message):
        resolve_binding(threads, bind, cix)


def test_cpu_bind_outside_affinity_is_rejected():
    topology = fixture_topology("container_restricted")
    with pytest.raises(ConfigError, match=r"cores 0-3 are outside the cores this process may use \(4-11"):
        resolve_binding(None, "0-5", topology)


def test_no_usable_cores_is_a_clear_error():
    topology = fixture_topology("container_restricted", affinity=[0, 1])
    with pytest.raises(ConfigError, match="no usable CPU cores"):
        resolve_binding(None, None, topology)


def test_this_machine_has_a_binding():
    topology = read_topology()
    binding = resolve_binding(None, None, topology)
    assert binding and set(binding) <= set(topology.usable)


@pytest.mark.parametrize("torch_first", [False, True])
def test_torch_openmp_workers_sleep_or_torch_gets_one_thread(torch_first):
    """Spinning OpenMP workers take the cores the kernel core's pool needs: Shrike imported first makes them sleep
    (OMP_WAIT_POLICY=PASSIVE before torch loads libgomp); a torch imported earlier gets one thread instead."""
    import subprocess
    import sys
    code = ("import torch\n" if torch_first else "") + (
        "import os, shrike, torch\n"
        "from shrike.platform.binding import bind_compute_threads\n"
        "cores = bind_compute_threads()\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), torch.get_num_threads(), len(cores))\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    policy, torch_threads, cores = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                                  text=True).stdout.split()
    assert policy == ("None" if torch_first else "PASSIVE")
    assert int(torch_threads) == (1 if torch_first else int(cores))


def test_programs_started_from_shrike_see_the_users_openmp_policy(monkeypatch):
    import shrike.platform.openmp as openmp
    monkeypatch.setattr(openmp, "USER_OMP_WAIT_POLICY", None)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert "OMP_WAIT_POLICY" not in openmp.peer_environment()
    monkeypatch.setattr(openmp, "USER_OMP_WAIT_POLICY", "ACTIVE")
    assert openmp.peer_environment()["OMP_WAIT_POLICY"] == "ACTIVE"
