#pragma once

namespace shrike {
// Element types that activations and outputs may have.
enum class DType : int { f32 = 0, bf16 = 1 };
}  // namespace shrike
