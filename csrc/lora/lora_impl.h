// The LoRA update (lora.h), written once as plain float32 loops the compiler vectorizes at each
// level's width. The order of every sum is fixed by the source (16 lanes, then pairwise), and the
// files that include this are compiled with -ffp-contract=off, so all levels give the same bits.
//
// Included by lora_ref.cpp, lora_avx2.cpp and lora_avx512vnni.cpp inside their own namespace, after the
// headers it uses (<algorithm>, <utility>, <vector>, common/bf16.h, runtime/threadpool.h).

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

// One adapter's rows of a step: their activations in float32 and their shrunk u = x A^T.
struct Group {
  int64_t slot;
  int rank;
  std::vector<int64_t> rows;
  std::vector<float> xs;  // (rows, k)
  std::vector<float> u;   // (rows, parts * max_rank)
};

void gather_rows(Group& g, const void* x, shrike::DType x_dtype, int64_t k) {
  const int64_t m = static_cast<int64_t>(g.rows.size());
  g.xs.resize(m * k);
  for (int64_t i = 0; i < m; ++i) {
    float* dst = g.xs.data() + i * k;
    if (x_dtype == shrike::DType::f32) {
      const float* src = static_cast<const float*>(x) + g.rows[i] * k;
      std::copy(src, src + k, dst);
    } else {
      const shrike::bf16* src = static_cast<const shrike::bf16*>(x) + g.rows[i] * k;
      for (int64_t c = 0; c < k; ++c) dst[c] = shrike::bf16_to_float(src[c]);
    }
  }
}

// Task t of the shrink pass of group g: A row `a_row` against each of g's rows.
void shrink_task(const shrike::lora::Slots& w, Group& g, int64_t t) {
  const int64_t k = w.k, R = w.max_rank, P = w.parts, m = static_cast<int64_t>(g.rows.size());
  const int64_t a_row = t / g.rank * R + t % g.rank;
  const float* shrink = w.shrink + g.slot * P * R * k;
  for (int64_t i = 0; i < m; ++i) g.u[i * P * R + a_row] = dot(shrink + a_row * k, g.xs.data() + i * k, k);
}

// Columns [chunk * kColumnsPerTask, ...) of the expand pass of group g, added into out.
void expand_task(const shrike::lora::Slots& w, const Group& g, int64_t chunk, void* out, shrike::DType out_dtype) {
  const int64_t n = w.n, R = w.max_rank, P = w.parts, m = static_cast<int64_t>(g.rows.size());
  const float* expand = w.expand + g.slot * R * n;
  float delta[kColumnsPerTask];
  const int64_t c0 = chunk * kColumnsPerTask, c1 = std::min(n, c0 + kColumnsPerTask);
  for (int64_t i = 0; i < m; ++i) {
    std::fill(delta, delta + (c1 - c0), 0.f);
    int64_t begin = 0;
    for (int64_t p = 0; p < P; ++p) {  // the columns of part p within [c0, c1)
      const int64_t end = w.part_end[p], lo = std::max(begin, c0), hi = std::min<int64_t>(end, c1);
      const float* up = g.u.data() + i * P * R + p * R;
      for (int j = 0; j < g.rank; ++j) {
        const float uj = up[j];
        const float* b = expand + j * n;
        for (int64_t c = lo; c < hi; ++c) delta[c - c0] += uj * b[c];
      }
      begin = end;
    }
    if (out_dtype == shrike::DType::f32) {
      float* o = static_cast<float*>(out) + g.rows[i] * n;
      for (int64_t c = c0; c < c1; ++c) o[c] += delta[c - c0];
    } else {
      shrike::bf16* o = static_cast<shrike::bf16*>(out) + g.rows[i] * n;
      for (int64_t c = c0; c < c1; ++c) o[c] = shrike::float_to_bf16(shrike::bf16_to_float(o[c]) + delta[c - c0]);
    }
  }
}

}  // namespace

void apply(const Slots& w, const void* x, DType x_dtype, const int32_t* row_slots, int64_t rows, void* out,
           DType out_dtype) {
  // Every adapter of the step in one shrink pass and one expand pass (a pass per adapter was a pool
  // wake-up and barrier per adapter per linear: four adapters over 8 streams ran at 0.4x the base model).
  if (std::all_of(row_slots, row_slots + rows, [](int32_t s) { return s < 0; })) return;
  std::vector<Group> groups;
  std::vector<int64_t> group_of_slot(w.max_loras, -1);
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t s = row_slots[t];
    if (s < 0 || w.ranks[s] <= 0) continue;
    if (group_of_slot[s] < 0) {
      group_of_slot[s] = static_cast<int64_t>(groups.size());
      groups.push_back(Group{s, w.ranks[s], {}, {}, {}});
    }
    groups[group_of_slot[s]].rows.push_back(t);
  }
  if (groups.empty()) return;
  const int64_t R = w.max_rank, P = w.parts, chunks = (w.n + kColumnsPerTask - 1) / kColumnsPerTask;
  std::vector<std::pair<int64_t, int64_t>> shrink_tasks, expand_tasks;  // (group, task within it)
  int64_t shrink_work = 0, expand_work = 0;
  for (int64_t gi = 0; gi < static_cast<int64_t>(groups.size()); ++gi) {
    Group& g = groups[gi];
    const int64_t m = static_cast<int64_t>(g.rows.size());
    gather_rows(g, x, x_dtype, w.k);
    g.u.assign(m * P * R, 0.f);
    for (int64_t t = 0; t < P * g.rank; ++t) shrink_tasks.emplace_back(gi, t);
    for (int64_t c = 0; c < chunks; ++c) expand_tasks.emplace_back(gi, c);
    shrink_work += m * P * g.rank * w.k;
    expand_work += m * g.rank * w.n;
  }
  maybe_parallel(static_cast<int64_t>(shrink_tasks.size()), shrink_work, [&](int64_t t) {
    shrink_task(w, groups[shrink_tasks[t].first], shrink_tasks[t].second);
  });
  maybe_parallel(static_cast<int64_t>(expand_tasks.size()), expand_work, [&](int64_t t) {
    expand_task(w, groups[expand_tasks[t].first], expand_tasks[t].second, out, out_dtype);
  });
}
