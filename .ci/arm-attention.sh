#!/usr/bin/env bash
# Cross-compiles the attention test driver for aarch64 and runs it under qemu-user on a CPU
# model with every Arm extension (-cpu max) and on a plain dotprod core (-cpu cortex-a76).
# The kernel library comes from the standalone csrc/tests project; the driver links it.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  apt-get install -y --no-install-recommends g++-aarch64-linux-gnu qemu-user
fi

build=build/arm-attention
cmake -S csrc/tests -B "$build" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" >/dev/null
cmake --build "$build" --target shrike_kernels -j2 >/dev/null
aarch64-linux-gnu-g++ -std=c++17 -O2 -Icsrc csrc/tests/test_attention_driver.cpp "$build/libshrike_kernels.a" \
  -pthread -o "$build/test_attention_driver"

qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max "$build/test_attention_driver" --expect dotprod,i8mm,sve2
qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu cortex-a76 "$build/test_attention_driver" --expect dotprod
