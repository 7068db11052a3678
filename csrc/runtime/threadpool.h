// One persistent worker pool for all kernels. Work is handed out as many small tasks
// from an atomic counter, so fast cores take more tasks than slow ones (big.LITTLE SoCs).
#pragma once
#include <cstdint>
#include <vector>

namespace shrike::runtime {

// Sets the number of threads that run kernels (the calling thread counts as one) and,
// when `cpus` is not empty, pins pool worker i (1 <= i < n) to cpus[i % cpus.size()].
// The calling thread's own affinity is left alone: threads PyTorch creates later inherit it.
void set_threads(int n, const std::vector<int>& cpus);
int num_threads();
// CPUs this process may run on (sched_getaffinity).
std::vector<int> usable_cpus();

// While one exists, pool workers spin between parallel_for calls instead of going to sleep after
// a short while: a compiled forward step issues its ops back to back, and a worker woken through
// the condition variable for each op would cost tens of microseconds. Workers sleep again
// shortly after the last one is gone, so an idle engine uses no CPU.
class WorkerSpin {
 public:
  WorkerSpin();
  ~WorkerSpin();
  WorkerSpin(const WorkerSpin&) = delete;
  WorkerSpin& operator=(const WorkerSpin&) = delete;
};

using TaskFn = void (*)(void* ctx, int64_t task);
// Runs fn(ctx, t) for every t in [0, n_tasks) on the pool and the calling thread; returns
// when all are done. Nested or concurrent calls run on the calling thread alone.
void parallel_for(int64_t n_tasks, TaskFn fn, void* ctx);

template <typename F>
void parallel_for(int64_t n_tasks, F&& f) {
  parallel_for(n_tasks, [](void* ctx, int64_t t) { (*static_cast<F*>(ctx))(t); }, &f);
}

}  // namespace shrike::runtime
