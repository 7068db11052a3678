// Mixture-of-experts block: routing, grouping rows by expert, the experts' linears, the combination.
#include "moe/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/bf16.h"
#include "fused/fused.h"
#include "runtime/threadpool.h"

namespace shrike::moe {
namespace {

size_t element_bytes(DType dt) { return dt == DType::f32 ? 4 : 2; }

template <typename T>
T* grown(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

void route_row(const float* logits, int64_t num_experts, int64_t top_k, bool normalize, int32_t* experts,
               float* weights) {
  float top = logits[0];
  for (int64_t e = 1; e < num_experts; ++e) top = std::max(top, logits[e]);
  float sum = 0.f;
  for (int64_t e = 0; e < num_experts; ++e) sum += std::exp(logits[e] - top);
  // Selection by repeated maximum: a strict comparison keeps the lower index among equal logits
  // (softmax is monotonic, so comparing logits picks the same experts as comparing probabilities).
  for (int64_t r = 0; r < top_k; ++r) {
    int32_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t q = 0; q < r; ++q) taken |= experts[q] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = static_cast<int32_t>(e);
    }
    experts[r] = best;
    weights[r] = std::exp(logits[best] - top) / sum;
  }
  if (normalize) {
    float chosen = 0.f;
    for (int64_t r = 0; r < top_k; ++r) chosen += weights[r];
    for (int64_t r = 0; r < top_k; ++r) weights[r] /= chosen;
  }
}

namespace {

// One expert's gathered rows and intermediates, per worker thread (an expert runs on one thread).
struct ExpertScratch {
  std::vector<uint8_t> x, gate_up, act;
};

ExpertScratch& scratch() {
  static thread_local ExpertScratch s;
  return s;
}

// y (n, hidden) float32 = down(silu(gate) * up)(x rows `members`) of one expert.
void run_expert(const Experts& experts, int64_t e, const uint8_t* in, const int32_t* members, int64_t n, DType dt,
                float* y) {
  const executor::Linear& gu = experts.gate_up[e];
  const executor::Linear& dn = experts.down[e];
  const int64_t hidden = experts.hidden(), inter = dn.k;
  const size_t eb = element_bytes(dt);
  ExpertScratch& s = scratch();
  uint8_t* xs = grown(s.x, n * hidden * eb);                // (n, hidden)
  uint8_t* gate_up = grown(s.gate_up, n * 2 * inter * eb);  // (n, 2 * inter)
  uint8_t* act = grown(s.act, n * inter * eb);              // (n, inter)
  for (int64_t i = 0; i < n; ++i) std::memcpy(xs + i * hidden * eb, in + members[i] * hidden * eb, hidden * eb);
  executor::format_of(gu.kind).run(gu, xs, dt, n, gate_up, dt);
  silu_mul(gate_up, act, n, inter, dt);
  executor::format_of(dn.kind).run(dn, act, dt, n, y, DType::f32);
}

}  // namespace

void forward(const Experts& experts, const void* x, const float* router_logits, int64_t rows, void* out, DType dt,
             Workspace& ws) {
  // Each row's k routed experts, then the shared expert (index E) when there is one: k entries per row in all.
  const int64_t routed = experts.num_experts(), E = static_cast<int64_t>(experts.down.size());
  const int64_t k = experts.top_k + (experts.shared ? 1 : 0), hidden = experts.hidden();
  int32_t* chosen = grown(ws.chosen, rows * k);  // (rows, k)
  float* weights = grown(ws.weights, rows * k);
  for (int64_t t = 0; t < rows; ++t) {
    const float* logits = router_logits + t * E;
    route_row(logits, routed, experts.top_k, experts.normalize, chosen + t * k, weights + t * k);
    if (experts.shared) {
      chosen[t * k + k - 1] = static_cast<int32_t>(routed);
      weights[t * k + k - 1] = 1.f / (1.f + std::exp(-logits[routed]));
    }
  }

  // Rows grouped by expert (counting sort: ascending rows within each expert); entry i of the grouping
  // is row expert_rows[i] through expert e for start[e] <= i < start[e + 1], its output y row i.
  int64_t* start = grown(ws.expert_start, E + 1);
  std::fill(start, start + E + 1, 0);
  for (int64_t i = 0; i < rows * k; ++i) ++start[chosen[i] + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  int32_t* expert_rows = grown(ws.expert_rows, rows * k);
  int64_t* entry_of = grown(ws.entry_of, rows * k);  // (rows, k)
  std::vector<int64_t> fill(start, start + E);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t r = 0; r < k; ++r) {
      const int64_t entry = fill[chosen[t * k + r]]++;
      expert_rows[entry] = static_cast<int32_t>(t);
      entry_of[t * k + r] = entry;
    }

  // Active experts, most rows first (an expert no row chose is not read at all).
  std::vector<int32_t>& order = ws.order;
  order.clear();
  for (int64_t e = 0; e < E; ++e)
    if (start[e + 1] > start[e]) order.push_back(static_cast<int32_t>(e));
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return start[a + 1] - start[a] > start[b + 1] - start[b]; });
  float* y = grown(ws.y, rows * k * hidden);  // (rows * k, hidden)
  const uint8_t* in = static_cast<const uint8_t*>(x);
  auto expert_task = [&](int64_t task) {
    const int64_t e = order[task];
    run_expert(experts, e, in, expert_rows + start[e], start[e + 1] - start[e], dt, y + start[e] * hidden);
  };
  const int64_t active = static_cast<int64_t>(order.size());
  if (active >= runtime::num_threads()) {
    runtime::parallel_for(active, [&](int64_t task) { expert_task(task); });  // its linears run on its thread alone
  } else {
    for (int64_t task = 0; task < active; ++task) expert_task(task);  // each linear spread over the pool
  }

  // Each row: its experts' outputs summed in ascending expert order from zero, the rounded product added
  // (no fused multiply-add), so the sum does not depend on the routing order or on other rows.
  constexpr int64_t kRowsPerTask = 4;
  runtime::parallel_for((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task) {
    std::vector<float> acc(hidden);
    std::vector<int64_t> slots(k);
    for (int64_t t = task * kRowsPerTask; t < std::min(rows, (task + 1) * kRowsPerTask); ++t) {
      for (int64_t r = 0; r < k; ++r) slots[r] = r;
      std::sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) { return chosen[t * k + a] < chosen[t * k + b]; });
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t r : slots) {
        const float w = weights[t * k + r];
        const float* yi = y + entry_of[t * k + r] * hidden;
        for (int64_t h = 0; h < hidden; ++h) acc[h] += w * yi[h];
      }
      if (dt == DType::f32) {
        std::memcpy(static_cast<float*>(out) + t * hidden, acc.data(), hidden * sizeof(float));
      } else {
        bf16* o = static_cast<bf16*>(out) + t * hidden;
        for (int64_t h = 0; h < hidden; ++h) o[h] = float_to_bf16(acc[h]);
      }
    }
  });
}

}  // namespace shrike::moe
