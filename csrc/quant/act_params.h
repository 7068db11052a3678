// Per-row quantization parameters, computed in one plain (non-ISA) translation unit so every
// variant gets bit-identical values: compiled with FMA, `qmin + min * inv` could be contracted.
#pragma once
#include <cstdint>

namespace shrike {

struct AsymParams {
  float inv;     // multiply x by this before rounding
  float scale;   // x ~ (q - zero) * scale
  int32_t zero;  // in [-128, 127]
};

AsymParams asym_params(float row_min, float row_max);

struct SymParams {
  float inv;
  float scale;  // x ~ q * scale
};

SymParams sym_params(float row_absmax);

}  // namespace shrike
