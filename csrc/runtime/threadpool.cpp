#include "runtime/threadpool.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace shrike::runtime {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Workers spin this long after a job before sleeping: decode issues ~200 kernel calls per
// token with short gaps, and a wake-up through the condition variable costs tens of us.
constexpr auto kSpin = std::chrono::microseconds(100);
// Busy-waits pause this many times, then yield the core between checks. On a machine with more
// runnable threads than cores the thread being waited for is often descheduled; a waiter that
// keeps spinning burns the time slice that thread needs (measured: a 30-minute soak next to
// builds made 0.3 engine steps/s). sched_yield returns at once when nothing else wants the core.
constexpr int kPausesBeforeYield = 1024;

inline void wait_step(int& spins) {
  if (spins < kPausesBeforeYield) {
    ++spins;
    cpu_relax();
  } else {
    sched_yield();
  }
}

std::atomic<int> g_spin_holders{0};  // live WorkerSpin objects

class Pool {
 public:
  explicit Pool(int n, const std::vector<int>& cpus) : n_threads_(n < 1 ? 1 : n) {
    for (int i = 1; i < n_threads_; ++i) {
      workers_.emplace_back([this] { work(0); });
      if (!cpus.empty()) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[i % cpus.size()], &set);
        pthread_setaffinity_np(workers_.back().native_handle(), sizeof(set), &set);
      }
    }
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    generation_.fetch_add(1);
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int n_threads() const { return n_threads_; }

  void run(int64_t n_tasks, TaskFn fn, void* ctx) {
    static thread_local bool inside = false;
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (workers_.empty() || n_tasks <= 1 || inside || !busy.owns_lock()) {
      for (int64_t t = 0; t < n_tasks; ++t) fn(ctx, t);
      return;
    }
    inside = true;
    fn_ = fn;
    ctx_ = ctx;
    n_tasks_ = n_tasks;
    next_.store(0);
    pending_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1);
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      cv_.notify_all();
    }
    take_tasks();
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0;) wait_step(spins);
    inside = false;
  }

 private:
  void take_tasks() {
    for (int64_t t; (t = next_.fetch_add(1, std::memory_order_relaxed)) < n_tasks_;) fn_(ctx_, t);
  }

  // `seen` starts at the constructor's generation (0): reading it in the new thread could
  // already see the first job's generation and miss that job.
  void work(uint64_t seen) {
    for (;;) {
      auto until = std::chrono::steady_clock::now() + kSpin;
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        cpu_relax();
        if (++spins % 256 == 0 && std::chrono::steady_clock::now() > until) {
          if (g_spin_holders.load(std::memory_order_relaxed) > 0) {
            sched_yield();  // inside a step: keep polling, but give the core away when others want it
            continue;
          }
          std::unique_lock<std::mutex> lock(mutex_);
          sleepers_.fetch_add(1);
          cv_.wait(lock, [&] { return generation_.load() != seen; });
          sleepers_.fetch_sub(1);
          break;
        }
      }
      seen = generation_.load();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) return;
      }
      take_tasks();
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_, mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0}, pending_{0};
  std::atomic<int64_t> next_{0};
  int64_t n_tasks_ = 0;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

std::mutex g_pool_mutex;
Pool* g_pool = nullptr;

Pool& pool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = new Pool(static_cast<int>(usable_cpus().size()), {});
  return *g_pool;
}

}  // namespace

std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

void set_threads(int n, const std::vector<int>& cpus) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  delete g_pool;
  g_pool = new Pool(n, cpus);
}

int num_threads() { return pool().n_threads(); }

WorkerSpin::WorkerSpin() { g_spin_holders.fetch_add(1); }
WorkerSpin::~WorkerSpin() { g_spin_holders.fetch_sub(1); }

void parallel_for(int64_t n_tasks, TaskFn fn, void* ctx) { pool().run(n_tasks, fn, ctx); }

}  // namespace shrike::runtime
