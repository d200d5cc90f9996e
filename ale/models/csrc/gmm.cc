// Grouped matmuls for XLA:CPU as XLA FFI custom calls (ale.models.gmm).
//
// The rows of `lhs [M, K]` are split into consecutive groups by `group_sizes [G]` (as in
// `jax.lax.ragged_dot`). Two kernels:
//
//   AleGmm:  out[rows of g] = lhs[rows of g] @ rhs[g]         rhs [G, K, N]
//            (transpose_rhs: rhs [G, N, K], used as rhs[g]^T)  out [M, N]
//            rows past sum(group_sizes) are zero.
//   AleTgmm: out[g] = lhs[rows of g]^T @ rhs[rows of g]        lhs [M, K], rhs [M, N]
//                                                              out [G, K, N]
//            an empty group's block is zero.
//
// Each group's product is one or more single-threaded OpenBLAS sgemm calls over exactly
// its rows (no padding, no weight copies); the calls are spread over XLA's intra-op
// thread pool, with the calling thread taking work too (so a busy pool cannot stall it).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "cblas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// OpenBLAS runs serial: the parallelism is over groups and row chunks, on XLA's pool.
const bool kSerialBlas = [] {
  scipy_openblas_set_num_threads(1);
  return true;
}();

struct Task {
  int64_t group, begin, end;  // gmm: rows [begin, end); tgmm: columns of lhs [begin, end)
};

struct Progress {
  explicit Progress(int64_t n) : n(n) {}
  const int64_t n;  // the task count (a late helper must not read `tasks` to learn it)
  std::atomic<int64_t> next{0};
  int64_t done = 0;
  std::mutex mu;
  std::condition_variable cv;
};

// Claims and runs tasks until none are left; counts what it ran.
template <typename F>
void Drain(Progress& p, const std::vector<Task>& tasks, const F& fn) {
  const int64_t n = p.n;
  int64_t ran = 0;
  for (int64_t i; (i = p.next.fetch_add(1)) < n; ++ran) fn(tasks[i]);
  if (ran == 0) return;
  std::lock_guard<std::mutex> lock(p.mu);
  p.done += ran;
  if (p.done == n) p.cv.notify_all();
}

// Runs fn(task) for every task on the pool and the calling thread; returns when all ran.
// A helper that starts after every task was claimed touches only the (shared) progress,
// so `tasks` and `fn` need only outlive this call.
//
// Below `kMinFlopsPerHelper` multiply-adds per extra thread the work stays on the calling
// thread: waking a pool thread costs more than a decode step's tiny products.
constexpr int64_t kMinFlopsPerHelper = 1 << 20;

template <typename F>
void ParallelFor(ffi::ThreadPool& pool, const std::vector<Task>& tasks, int64_t flops,
                 const F& fn) {
  const int64_t n = static_cast<int64_t>(tasks.size());
  if (n == 0) return;
  auto progress = std::make_shared<Progress>(n);
  const int64_t helpers =
      std::min({pool.num_threads(), n - 1, flops / kMinFlopsPerHelper});
  for (int64_t h = 0; h < helpers; ++h)
    pool.Schedule([progress, &tasks, &fn] { Drain(*progress, tasks, fn); });
  Drain(*progress, tasks, fn);
  std::unique_lock<std::mutex> lock(progress->mu);
  progress->cv.wait(lock, [&] { return progress->done == n; });
}

// Splits [0, size) into chunks of about `target` (at least 1 chunk when size > 0).
template <typename Emit>
void Chunks(int64_t size, int64_t target, Emit emit) {
  if (size <= 0) return;
  const int64_t parts = std::max<int64_t>(1, (size + target / 2) / target);
  const int64_t step = (size + parts - 1) / parts;
  for (int64_t b = 0; b < size; b += step) emit(b, std::min(size, b + step));
}

ffi::Error Offsets(ffi::Buffer<ffi::S32>& group_sizes, int64_t rows, std::vector<int64_t>* out) {
  const int64_t g = static_cast<int64_t>(group_sizes.element_count());
  const int32_t* gs = group_sizes.typed_data();
  out->assign(g + 1, 0);
  for (int64_t i = 0; i < g; ++i) {
    if (gs[i] < 0) return ffi::Error::InvalidArgument("group_sizes must be non-negative");
    (*out)[i + 1] = (*out)[i] + gs[i];
  }
  if ((*out)[g] > rows)
    return ffi::Error::InvalidArgument("sum(group_sizes) exceeds the rows of lhs");
  return ffi::Error::Success();
}

ffi::Error GmmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> lhs, ffi::Buffer<ffi::F32> rhs,
                   ffi::Buffer<ffi::S32> group_sizes, ffi::ResultBuffer<ffi::F32> out,
                   bool transpose_rhs) {
  const auto ld = lhs.dimensions(), rd = rhs.dimensions();
  if (ld.size() != 2 || rd.size() != 3)
    return ffi::Error::InvalidArgument("gmm expects lhs [M, K] and rhs [G, K, N]");
  const int64_t m = ld[0], k = ld[1], g = rd[0];
  const int64_t n = transpose_rhs ? rd[1] : rd[2];
  if ((transpose_rhs ? rd[2] : rd[1]) != k || static_cast<int64_t>(group_sizes.element_count()) != g)
    return ffi::Error::InvalidArgument("gmm: lhs, rhs and group_sizes shapes disagree");
  std::vector<int64_t> off;
  if (auto err = Offsets(group_sizes, m, &off); err.failure()) return err;
  const float* a = lhs.typed_data();
  const float* b = rhs.typed_data();
  float* c = out->typed_data();
  std::vector<Task> tasks;
  for (int64_t i = 0; i < g; ++i)
    Chunks(off[i + 1] - off[i], 128, [&](int64_t r0, int64_t r1) {
      tasks.push_back({i, off[i] + r0, off[i] + r1});
    });
  if (off[g] < m) std::memset(c + off[g] * n, 0, sizeof(float) * (m - off[g]) * n);
  ParallelFor(pool, tasks, off[g] * k * n, [&](const Task& t) {
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_rhs ? CblasTrans : CblasNoTrans,
                      t.end - t.begin, n, k, 1.0f, a + t.begin * k, k, b + t.group * k * n,
                      transpose_rhs ? k : n, 0.0f, c + t.begin * n, n);
  });
  return ffi::Error::Success();
}

ffi::Error TgmmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> lhs, ffi::Buffer<ffi::F32> rhs,
                    ffi::Buffer<ffi::S32> group_sizes, ffi::ResultBuffer<ffi::F32> out) {
  const auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  if (ld.size() != 2 || rd.size() != 2 || od.size() != 3 || ld[0] != rd[0])
    return ffi::Error::InvalidArgument("tgmm expects lhs [M, K], rhs [M, N], out [G, K, N]");
  const int64_t m = ld[0], k = ld[1], n = rd[1], g = od[0];
  if (od[1] != k || od[2] != n || static_cast<int64_t>(group_sizes.element_count()) != g)
    return ffi::Error::InvalidArgument("tgmm: lhs, rhs, group_sizes and out shapes disagree");
  std::vector<int64_t> off;
  if (auto err = Offsets(group_sizes, m, &off); err.failure()) return err;
  const float* a = lhs.typed_data();
  const float* b = rhs.typed_data();
  float* c = out->typed_data();
  std::vector<Task> tasks;
  for (int64_t i = 0; i < g; ++i) {
    if (off[i + 1] == off[i]) {
      std::memset(c + i * k * n, 0, sizeof(float) * k * n);
      continue;
    }
    // Split the K output rows so a big group spreads over threads (about 128 rows each).
    Chunks(k, 128, [&](int64_t k0, int64_t k1) { tasks.push_back({i, k0, k1}); });
  }
  ParallelFor(pool, tasks, off[g] * k * n, [&](const Task& t) {
    const int64_t rows = off[t.group + 1] - off[t.group];
    scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t.end - t.begin, n, rows, 1.0f,
                      a + off[t.group] * k + t.begin, k, b + off[t.group] * n, n, 0.0f,
                      c + t.group * k * n + t.begin * n, n);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AleGmm, GmmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("transpose_rhs"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AleTgmm, TgmmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
