// The LoRA update (lora.h), written once as plain float32 loops the compiler vectorizes at each
// level's width. The order of every sum is fixed by the source (16 lanes, then pairwise), and the
// files that include this are compiled with -ffp-contract=off, so all levels give the same bits.
//
// Included by lora_ref.cpp, lora_avx2.cpp and lora_avx512vnni.cpp inside their own namespace, after the
// headers it uses (<algorithm>, <vector>, common/bf16.h, runtime/threadpool.h).

namespace {

constexpr int kLanes = 16;
constexpr int64_t kColumnsPerTask = 256;
constexpr int64_t kSerialWork = 1 << 16;  // multiply-adds below which a pass runs on the calling thread

float dot(const float* a, const float* b, int64_t k) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < k; ++l) lanes[l] += a[i + l] * b[i + l];
  for (int half = kLanes / 2; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}

template <typename F>
void maybe_parallel(int64_t tasks, int64_t work, F&& f) {
  if (work < kSerialWork || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) f(t);
  } else {
    shrike::runtime::parallel_for(tasks, [&f](int64_t t) { f(t); });
  }
}

// One adapter's rows: shrink u = x A^T, then expand into out.
void apply_group(const shrike::lora::Slots& w, int64_t slot, int rank, const std::vector<int64_t>& rows,
                 const void* x, shrike::DType x_dtype, void* out, shrike::DType out_dtype) {
  using shrike::DType;
  const int64_t m = static_cast<int64_t>(rows.size()), k = w.k, n = w.n, R = w.max_rank, P = w.parts;
  std::vector<float> xs(m * k);  // (m, k) the group's rows in float32
  for (int64_t i = 0; i < m; ++i) {
    float* dst = xs.data() + i * k;
    if (x_dtype == DType::f32) {
      const float* src = static_cast<const float*>(x) + rows[i] * k;
      std::copy(src, src + k, dst);
    } else {
      const shrike::bf16* src = static_cast<const shrike::bf16*>(x) + rows[i] * k;
      for (int64_t c = 0; c < k; ++c) dst[c] = shrike::bf16_to_float(src[c]);
    }
  }
  std::vector<float> u(m * P * R, 0.f);  // (m, parts * max_rank)
  const float* shrink = w.shrink + slot * P * R * k;
  maybe_parallel(P * rank, m * P * rank * k, [&](int64_t task) {
    const int64_t a_row = task / rank * R + task % rank;
    for (int64_t i = 0; i < m; ++i) u[i * P * R + a_row] = dot(shrink + a_row * k, xs.data() + i * k, k);
  });
  const float* expand = w.expand + slot * R * n;
  const int64_t chunks = (n + kColumnsPerTask - 1) / kColumnsPerTask;
  maybe_parallel(chunks, m * rank * n, [&](int64_t chunk) {
    float delta[kColumnsPerTask];
    const int64_t c0 = chunk * kColumnsPerTask, c1 = std::min(n, c0 + kColumnsPerTask);
    for (int64_t i = 0; i < m; ++i) {
      std::fill(delta, delta + (c1 - c0), 0.f);
      int64_t begin = 0;
      for (int64_t p = 0; p < P; ++p) {  // the columns of part p within [c0, c1)
        const int64_t end = w.part_end[p], lo = std::max(begin, c0), hi = std::min<int64_t>(end, c1);
        const float* up = u.data() + i * P * R + p * R;
        for (int j = 0; j < rank; ++j) {
          const float uj = up[j];
          const float* b = expand + j * n;
          for (int64_t c = lo; c < hi; ++c) delta[c - c0] += uj * b[c];
        }
        begin = end;
      }
      if (out_dtype == DType::f32) {
        float* o = static_cast<float*>(out) + rows[i] * n;
        for (int64_t c = c0; c < c1; ++c) o[c] += delta[c - c0];
      } else {
        shrike::bf16* o = static_cast<shrike::bf16*>(out) + rows[i] * n;
        for (int64_t c = c0; c < c1; ++c) o[c] = shrike::float_to_bf16(shrike::bf16_to_float(o[c]) + delta[c - c0]);
      }
    }
  });
}

}  // namespace

void apply(const Slots& w, const void* x, DType x_dtype, const int32_t* row_slots, int64_t rows, void* out,
           DType out_dtype) {
  std::vector<std::vector<int64_t>> groups(w.max_loras);  // rows of each slot, in order
  for (int64_t t = 0; t < rows; ++t)
    if (row_slots[t] >= 0) groups[row_slots[t]].push_back(t);
  for (int64_t s = 0; s < w.max_loras; ++s)
    if (!groups[s].empty() && w.ranks[s] > 0) apply_group(w, s, w.ranks[s], groups[s], x, x_dtype, out, out_dtype);
}
