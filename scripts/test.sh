#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (Python tests on the real default model,
# and the Arm kernel variants cross-compiled and run under qemu-user).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-browser.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1
bash .ci/arm-kernels.sh
python -m pytest -q "$@"
