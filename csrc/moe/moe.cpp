// Mixture-of-experts block: routing, grouping rows by expert, the experts' linears, the combination.
#include "moe/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/bf16.h"
#include "fused/fused.h"

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

void forward(const Experts& experts, const void* x, const float* router_logits, int64_t rows, void* out, DType dt,
             Workspace& ws) {
  const int64_t E = experts.num_experts(), k = experts.top_k, hidden = experts.hidden();
  const int64_t inter = experts.intermediate();
  const size_t eb = element_bytes(dt);
  int32_t* chosen = grown(ws.chosen, rows * k);  // (rows, k)
  float* weights = grown(ws.weights, rows * k);
  for (int64_t t = 0; t < rows; ++t) route_row(router_logits + t * E, E, k, experts.normalize, chosen + t * k, weights + t * k);

  // Rows grouped by expert (counting sort: ascending rows within each expert).
  int64_t* start = grown(ws.expert_start, E + 1);
  std::fill(start, start + E + 1, 0);
  for (int64_t i = 0; i < rows * k; ++i) ++start[chosen[i] + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  int32_t* expert_rows = grown(ws.expert_rows, rows * k);
  float* row_weight = grown(ws.row_weight, rows * k);
  std::vector<int64_t> fill(start, start + E);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t r = 0; r < k; ++r) {
      const int64_t slot = fill[chosen[t * k + r]]++;
      expert_rows[slot] = static_cast<int32_t>(t);
      row_weight[slot] = weights[t * k + r];
    }

  int64_t most = 0;
  for (int64_t e = 0; e < E; ++e) most = std::max(most, start[e + 1] - start[e]);
  uint8_t* xs = grown(ws.x, most * hidden * eb);           // (n_e, hidden)
  uint8_t* gate_up = grown(ws.gate_up, most * 2 * inter * eb);  // (n_e, 2 * inter)
  uint8_t* act = grown(ws.act, most * inter * eb);          // (n_e, inter)
  float* y = grown(ws.y, most * hidden);                    // (n_e, hidden) float32
  float* acc = grown(ws.acc, rows * hidden);                // (rows, hidden) float32
  std::fill(acc, acc + rows * hidden, 0.f);
  const uint8_t* in = static_cast<const uint8_t*>(x);
  // Experts in ascending order, so each row adds its experts' outputs in ascending expert order.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = start[e + 1] - start[e];
    if (n == 0) continue;  // an expert no row chose: its weights are not read
    const int32_t* members = expert_rows + start[e];
    for (int64_t i = 0; i < n; ++i) std::memcpy(xs + i * hidden * eb, in + members[i] * hidden * eb, hidden * eb);
    const executor::Linear& gu = experts.gate_up[e];
    const executor::Linear& dn = experts.down[e];
    executor::format_of(gu.kind).run(gu, xs, dt, n, gate_up, dt);
    silu_mul(gate_up, act, n, inter, dt);
    executor::format_of(dn.kind).run(dn, act, dt, n, y, DType::f32);
    for (int64_t i = 0; i < n; ++i) {
      const float w = row_weight[start[e] + i];
      float* a = acc + members[i] * hidden;
      const float* yi = y + i * hidden;
      for (int64_t h = 0; h < hidden; ++h) a[h] += w * yi[h];  // rounded product, then sum (no fused multiply-add)
    }
  }
  if (dt == DType::f32) {
    std::memcpy(out, acc, rows * hidden * sizeof(float));
  } else {
    bf16* o = static_cast<bf16*>(out);
    for (int64_t i = 0; i < rows * hidden; ++i) o[i] = float_to_bf16(acc[i]);
  }
}

}  // namespace shrike::moe
