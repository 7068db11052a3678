"""Runs .ci/arm-kernels.sh: the Arm kernel variants, cross-compiled and checked against the
scalar reference under qemu-user. It takes several minutes and CI calls the script directly
(scripts/test.sh), so this test runs only when SHRIKE_ARM_QEMU=1 and the toolchain is present."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "arm-kernels.sh"


@pytest.mark.skipif(os.environ.get("SHRIKE_ARM_QEMU") != "1", reason="set SHRIKE_ARM_QEMU=1 to run (several minutes)")
@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")),
                    reason="needs g++-aarch64-linux-gnu and qemu-user")
def test_arm_variants_match_reference_under_qemu():
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
