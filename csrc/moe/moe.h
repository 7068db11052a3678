// Mixture-of-experts feed-forward block (Qwen3-MoE, Mixtral): route each token row to its top-k experts,
// group the step's rows by expert and run each active expert's gate_up and down linears once over only its
// rows, then combine. Expert linears are executor::Linear, so every weight format of the executor's format
// table (dense bf16/fp32, W4A8, W8A8, W4A16/W8A16) runs experts through its own kernels.
//
// Work: each active expert is one task of the thread pool (gather its rows, gate_up, silu * up, down, all
// on that thread), most rows first so the longest tasks start early; with fewer active experts than
// threads (Mixtral decode) the experts run one after another, each linear spread over the pool.
//
// Batch-invariant: the linear kernels give a row the same bits whatever rows share the call, and each
// row's outputs are summed in ascending expert order in float32, so a row's result does not depend on
// which other rows are in the step.
#pragma once
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "executor/linear_format.h"

namespace shrike::moe {

struct Experts {
  std::vector<executor::Linear> gate_up;  // per expert: (2 * intermediate, hidden), gate rows then up rows
  std::vector<executor::Linear> down;     // per expert: (hidden, intermediate)
  int64_t top_k = 0;
  bool normalize = false;  // renormalise the top-k probabilities to sum to 1 (Mixtral; Qwen3-MoE norm_topk_prob)
  // Qwen2-MoE: the last gate_up/down pair is a shared expert (of its own intermediate width) that every row
  // runs, weighted by the sigmoid of the router's last logit (its shared_expert_gate as one more router row).
  bool shared = false;
  int64_t hidden() const { return down.empty() ? 0 : down[0].n; }
  int64_t num_experts() const { return static_cast<int64_t>(down.size()) - (shared ? 1 : 0); }  // routed ones
};

// One row's routing: softmax over the router logits in float32 (max subtracted, exponentials summed in
// expert order), the top_k experts by probability, ties to the lower expert index, written best first;
// their probabilities (renormalised over the chosen ones when `normalize`).
void route_row(const float* logits, int64_t num_experts, int64_t top_k, bool normalize, int32_t* experts,
               float* weights);

// Scratch memory the block reuses between calls (grown on demand); each worker thread has its own for
// one expert's gathered rows and intermediates.
struct Workspace {
  std::vector<int32_t> chosen;      // (rows, top_k) expert ids
  std::vector<float> weights;       // (rows, top_k) routing weights
  std::vector<int32_t> expert_rows; // rows grouped by expert, ascending row order within an expert
  std::vector<int64_t> expert_start;  // (num_experts + 1,) offsets into expert_rows
  std::vector<int64_t> entry_of;    // (rows, top_k) where each chosen expert's output lands in y
  std::vector<int32_t> order;       // active experts, most rows first (the order they are handed out)
  std::vector<float> y;             // (rows * top_k, hidden) float32 expert outputs, grouped by expert
};

// out (rows, hidden) = sum over each row's top-k experts of weight * down(silu(gate) * up)(x row).
// (+ sigmoid(shared logit) * shared expert(x row) with a shared expert, summed last.)
// x: (rows, hidden) activations of dtype dt; router_logits: (rows, num_experts + shared) float32.
void forward(const Experts& experts, const void* x, const float* router_logits, int64_t rows, void* out, DType dt,
             Workspace& ws);

}  // namespace shrike::moe
