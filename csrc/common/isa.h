// Instruction-set variants the kernels are compiled for, and which one runs.
#pragma once
#include <string>

namespace shrike {

enum class Isa : int { scalar = 0, avx2 = 1, dotprod = 2, i8mm = 3, sve2 = 4 };
constexpr int kNumIsas = 5;

struct CpuFeatures {
  // x86
  bool avx2 = false, fma = false, f16c = false, avx_vnni = false, avx512_vnni = false;
  // aarch64
  bool asimddp = false, i8mm = false, sve = false, sve2 = false, bf16 = false;
};

const CpuFeatures& cpu_features();
const char* isa_name(Isa isa);
// Compiled into this build and runnable on this CPU.
bool isa_available(Isa isa);
// The variant kernels use: the best available, or SHRIKE_ISA / set_active_isa when given.
Isa active_isa();
// Throws std::invalid_argument naming the available variants when `name` is not one.
void set_active_isa(const std::string& name);

}  // namespace shrike
