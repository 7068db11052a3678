#pragma once

namespace shrike {
// Element types that activations and outputs may have; i8 only for a KV cache, in the row
// layout of attention/kv_int8.h (values plus a scale per token and KV head).
enum class DType : int { f32 = 0, bf16 = 1, i8 = 2 };
}  // namespace shrike
