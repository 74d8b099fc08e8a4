// Our own LSTM recurrence as XLA FFI handlers: one layer's recurrence per call, float32, PyTorch's gate order
// (i, f, g, o) and layout. The call projects the layer's input itself, inside each step's product, and for layer 0
// folds the embedding too (the table rows the tokens use, projected once); XLA computes everything else.
//
//   forward:  source (N, 4H) and rows (T, B) int32; x (T, B, D) and w_ih (4H, D); table (V, E) and w_table (4H, E):
//             step t of row b takes the input gates x[t, b] W_ih^T + source[rows[t, b]]: the source is b_ih + b_hh
//             as one row (the layer's input projected here), the projected embedding table's rows of the tokens (the
//             embedding fold, gathered here; D = 0), or the rows of gates_x (T B, 4H) in order (D = 0). Where E > 0
//             the call folds the embedding itself: rows are the tokens, the source the one bias row, and the gates
//             table[rows[t, b]] w_table^T + source[0] (D = 0). w_hh (4H, H), h0 and c0 (B, H), lengths (B,) int32
//             -> y (T, B, H), h_T and c_T (B, H); in training also, for the backward, the activated gates
//             [sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)] (T, B, 4H) and c after each step (T, B, H)
//   backward: rows, w_hh, h0, y, those gates, c after each step, c0, lengths, dy (T, B, H), dh_T and dc_T (B, H),
//             x, w_ih, table, w_table -> d source (N, 4H) (the gradient of the gates' pre-activations, added up per
//             source row where the rows were gathered), dw_hh (4H, H), dh0 and dc0 (B, H), dx (T, B, D), dw_ih
//             (4H, D), d table (V, E), dw_table (4H, E)
// From step lengths[b] on, row b's carry stops changing and its output is 0 (pack_padded_sequence's semantics).
//
// How it runs: one team of threads per call, for the whole sequence. Thread k owns a contiguous range of hidden
// units, so the gate math of a unit needs no other thread's results: each step it computes its units' four gate
// columns by a GEMM of [x_t, h_{t-1}] against [W_ih; W_hh] packed once per call, then their gate math, vectorised.
// With AVX-512 or AVX2 that GEMM is our own register tile (6 rows by the 4 gates of 16 units, or 3 rows by the 4 gates
// of 8), each tile's gate math right after it (lstm_step.h, one source for both widths; the widest set the CPU has,
// chosen when the library loads, or the one lstm_kernel_set_isa asks for); elsewhere it is OpenBLAS's sgemm. The
// threads meet at one barrier per step, where the next step's GEMM needs every unit of h (forward) or every gate of
// dz (backward). The GEMMs over all steps (the weight gradients) are OpenBLAS's, from the
// scipy-openblas32 package the project installs; the activations glibc's vector expf and tanhf (libmvec), or the C
// library's scalar ones on the portable path: accurate float32 functions, no fast approximations. Nothing here comes
// from PyTorch's binaries.
#include <immintrin.h>
#include <omp.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cblas.h"  // OpenBLAS, scipy-openblas32's copy: its symbols prefixed scipy_
#include "lstm_isa.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using lstm_isa::Operand;
using lstm_isa::StepOps;

// Units are dealt to threads in blocks of 16: a whole number of registers at every vector width.
constexpr int64_t kBlock = 16;

struct Dims {
  int64_t t, b, h;
};

// The units [begin, end) of thread k of n: blocks of kBlock units dealt as evenly as they go.
struct Units {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};

Units units_of(int k, int n, int64_t hidden) {
  const int64_t blocks = (hidden + kBlock - 1) / kBlock;
  return {std::min(hidden, blocks * k / n * kBlock), std::min(hidden, blocks * (k + 1) / n * kBlock)};
}

// The team: as many threads as OpenMP offers (OMP_NUM_THREADS, else the cores), but no more than the unit blocks.
int team_size(int64_t hidden) {
  const int64_t blocks = (hidden + kBlock - 1) / kBlock;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), blocks)));
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Floats = std::unique_ptr<float[], AlignedFree>;

Floats floats(size_t count) {
  const size_t bytes = ((std::max<size_t>(count, 1) * sizeof(float) + 63) / 64) * 64;
  return Floats(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

bool supported(int64_t isa) {
  switch (isa) {
    case lstm_isa::kAvx512: return __builtin_cpu_supports("avx512f");
    case lstm_isa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case lstm_isa::kPortable: return true;
    default: return false;
  }
}

const StepOps* ops_of(int64_t isa) {
  switch (isa) {
    case lstm_isa::kAvx512: return &lstm_isa::avx512_ops();
    case lstm_isa::kAvx2: return &lstm_isa::avx2_ops();
    default: return &lstm_isa::portable_ops();
  }
}

// The step's arithmetic every call runs: the widest instruction set the CPU has, unless lstm_kernel_set_isa chose
// another (the Python side does, where LSTM_KERNEL_ISA asks).
std::atomic<const StepOps*> current_ops{
    ops_of(supported(lstm_isa::kAvx512) ? lstm_isa::kAvx512 : supported(lstm_isa::kAvx2) ? lstm_isa::kAvx2
                                                                                        : lstm_isa::kPortable)};

// OpenBLAS computes on the caller's thread only: its own worker threads, once woken, spin for a while after each
// call, and on a 2-core machine that spinning takes the team's cores (docs/performance.md's log). The GEMMs over all
// steps are split over the team instead (team_gemm). The library is the project's own copy (scipy-openblas32), which
// nothing else in the process calls, so its process-wide setting is ours to make.
const bool openblas_single_threaded = (scipy_openblas_set_num_threads(1), true);

// C (m, n) = op(A) op(B) (+ C where `accumulate`), column-major, in OpenBLAS's terms, on the calling thread.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  scipy_cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                    static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b,
                    static_cast<int>(ldb), accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
}

// gemm over a team of `threads` threads, each computing its share of C's n columns (blocks of 16): every element
// of C is one thread's dot product in OpenBLAS's order, whatever the split, so the result does not depend on it.
void team_gemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const unsigned csr = _mm_getcsr();
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, (n + kBlock - 1) / kBlock)));
#pragma omp parallel num_threads(threads)
  {
    _mm_setcsr(csr);
    const Units cols = units_of(omp_get_thread_num(), omp_get_num_threads(), n);
    gemm(trans_a, trans_b, m, cols.size(), k, a, lda, b + cols.begin * (trans_b ? 1 : ldb), ldb, accumulate,
         c + cols.begin * ldc, ldc);
  }
}

// Asks for the floats [begin, begin + n) of `blocks` blocks `stride` floats apart to be brought into the cache:
// issued before a step's GEMM, the loads of its gate math then hit the cache instead of waiting for the input gates
// from memory.
void prefetch(const float* begin, int64_t n, int64_t blocks, int64_t stride) {
  for (int64_t g = 0; g < blocks; ++g)
    for (int64_t j = 0; j < n; j += 64 / sizeof(float))
      _mm_prefetch(reinterpret_cast<const char*>(begin + g * stride + j), _MM_HINT_T1);
}

// The rest of the input gates of step t, row b (x_t W_ih^T aside): row rows[t B + b] of source (N, 4H): the one row
// b_ih + b_hh, the rows of gates_x (T B, 4H) in order, or the projected embedding table's rows of the tokens (the
// embedding fold), which the kernel then gathers itself.
struct GateRows {
  const float* source;
  const int32_t* rows;  // (T, B)
  int64_t width;  // 4H
  const float* at(int64_t step_row) const { return source + rows[step_row] * width; }
};

// A buffer of floats borrowed from a pool kept for the process: its pages are touched once, not on every call (a
// fresh allocation of this size comes from mmap, and faulting in its pages costs about as much as filling it).
class Scratch {
 public:
  explicit Scratch(size_t count) : count_(count) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pool_.end();  // the smallest pooled buffer that is large enough
    for (auto p = pool_.begin(); p != pool_.end(); ++p)
      if (p->first >= count && (it == pool_.end() || p->first < it->first)) it = p;
    if (it == pool_.end()) {
      data_ = floats(count);
    } else {
      count_ = it->first, data_ = std::move(it->second);
      pool_.erase(it);
    }
  }
  ~Scratch() {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.emplace_back(count_, std::move(data_));
  }
  float* get() const { return data_.get(); }

 private:
  size_t count_;
  Floats data_;
  static inline std::mutex mutex_;
  static inline std::vector<std::pair<size_t, Floats>> pool_;
};

// Layer 0's input where the call is handed the embedding table (V, E) and W_ih (4H, E): the embedding fold done here,
// over the rows the batch's tokens use only (the seed's batches use 640-970 of 4398), where XLA's fold projects the
// whole table. `used` the distinct rows, ascending (U); `slot` (T B) each token's index into them.
struct TableRows {
  std::vector<int32_t> used, slot;
};

TableRows table_rows(const int32_t* tokens, int64_t count, int64_t vocab) {
  TableRows out;
  std::vector<int32_t> at(vocab, -1);
  for (int64_t i = 0; i < count; ++i) at[tokens[i]] = 0;
  for (int64_t v = 0; v < vocab; ++v)
    if (at[v] == 0) at[v] = static_cast<int32_t>(out.used.size()), out.used.push_back(static_cast<int32_t>(v));
  out.slot.resize(count);
  for (int64_t i = 0; i < count; ++i) out.slot[i] = at[tokens[i]];
  return out;
}

// The used rows of table (V, e), gathered into `rows` (U, e).
void gather_rows(const float* table, int64_t e, const std::vector<int32_t>& used, float* rows) {
  for (size_t u = 0; u < used.size(); ++u) std::memcpy(rows + u * e, table + used[u] * e, sizeof(float) * e);
}

// From the used rows' gradients d_used (U, 4H) and those rows (U, E): d table (V, E), zero but for its used rows,
// = d_used W_ih, and d W_ih (4H, E) = d_used^T rows. OpenBLAS's GEMMs, split over the team (column-major: d rows^T
// (E, U) = W_ih^T (E, 4H) d_used^T (4H, U), d W_ih^T (E, 4H) = rows^T d_used).
void table_gradients(const float* d_used, const TableRows& fold, const float* rows, int64_t e, const float* w,
                     int64_t width, int64_t vocab, float* d_table, float* d_w) {
  const int64_t used = static_cast<int64_t>(fold.used.size());
  std::memset(d_table, 0, sizeof(float) * vocab * e);
  if (used == 0) {
    std::memset(d_w, 0, sizeof(float) * width * e);
    return;
  }
  Scratch d_rows(used * e);
  const int threads = team_size(width / 4);
  team_gemm(threads, false, false, e, used, width, w, e, d_used, width, false, d_rows.get(), e);
  team_gemm(threads, false, true, e, width, used, rows, e, d_used, width, false, d_w, e);
  for (int64_t u = 0; u < used; ++u)
    std::memcpy(d_table + fold.used[u] * e, d_rows.get() + u * e, sizeof(float) * e);
}

// The rows of thread `u`'s units of a gate weight w (4H, k), W_hh or W_ih, for the forward's per-step product with
// a (batch, k) matrix: in panels of L units for the tiles (ops.pack_panels), else gate by gate, (4n, k), for
// OpenBLAS.
Floats packed_rows(const StepOps& ops, const float* w, int64_t hidden, int64_t k, Units u) {
  const int64_t n = u.size();
  if (n == 0 || k == 0) return floats(0);
  if (ops.tile) {
    Floats panels = floats((n + ops.lanes - 1) / ops.lanes * k * 4 * ops.lanes);
    ops.pack_panels(w, hidden, k, u.begin, n, panels.get());
    return panels;
  }
  Floats w_rows = floats(4 * n * k);
  for (int g = 0; g < 4; ++g)
    std::memcpy(w_rows.get() + g * n * k, w + (g * hidden + u.begin) * k, sizeof(float) * n * k);
  return w_rows;
}

// The sum over a call's steps of one thread's columns of dz (4 gate blocks of n units), step by step: each step's B
// rows added in order, the steps' sums pairwise (a binary counter of partial sums), so that the rounding error grows
// with B + log T, not with T B as a sum row after row (layer 1's bias gradient over the seed's 10000 rows, against
// PyTorch's in the parity suite: 1.36e-5 relative summed row after row, 5.6e-6 so).
class StepSums {
 public:
  explicit StepSums(int64_t n) : n_(n), step_(4 * n, 0.0f) {}

  void add_row(const float* dz_row, int64_t stride) {  // gate g's block `stride` floats after gate g-1's
    for (int g = 0; g < 4; ++g)
      for (int64_t j = 0; j < n_; ++j) step_[g * n_ + j] += dz_row[g * stride + j];
  }

  void end_step() {  // the step's sum joins the partial sums, each of 2^k steps, as a binary counter counts
    std::vector<float> carry(4 * n_, 0.0f);
    carry.swap(step_);
    for (size_t k = 0;; ++k) {
      if (k == levels_.size()) levels_.emplace_back();
      if (levels_[k].empty()) {
        levels_[k] = std::move(carry);
        return;
      }
      for (size_t i = 0; i < carry.size(); ++i) carry[i] = levels_[k][i] + carry[i];
      levels_[k].clear();
    }
  }

  void total(float* out, int64_t stride) const {  // into out's 4 gate blocks, `stride` floats apart
    std::vector<float> sum(4 * n_, 0.0f);
    for (const auto& level : levels_)
      for (size_t i = 0; i < level.size(); ++i) sum[i] += level[i];
    for (int g = 0; g < 4; ++g) std::memcpy(out + g * stride, sum.data() + g * n_, sizeof(float) * n_);
  }

 private:
  int64_t n_;
  std::vector<float> step_;
  std::vector<std::vector<float>> levels_;  // levels_[k]: the sum of 2^k steps, or empty
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it, and the pages fault in one by one as before
#endif

// Faults in the whole pages of share k of n of [p, p + bytes), in one call per thread. XLA allocates the large
// outputs afresh on every execution, and faulting their pages in one by one, as the steps first write them, cost
// more than computing the steps in a VM (each fault traps, and the two threads' faults contend for the same locks;
// docs/performance.md's log). The contents are unchanged: it only maps the pages.
void prefault(void* p, size_t bytes, int k, int n) {
  const uintptr_t page = 4096, begin = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (end <= begin) return;
  const uintptr_t pages = (end - begin) / page, first = begin + pages * k / n * page;
  const uintptr_t last = begin + pages * (k + 1) / n * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
}

// ------------------------------------------------------------------------------------------- the team

// Where a team's threads meet after each step. libgomp's own barrier spins only about 1000 times before it sleeps in
// the kernel whenever it counts more threads than cores (XLA's pool threads count), and waking a sleeper costs more
// than a step's imbalance between the threads (docs/performance.md's log). This one spins for up to kSpin before it
// sleeps on a futex, which a step never needs.
class StepBarrier {
 public:
  explicit StepBarrier(int threads) : threads_(threads) {}

  void wait() {
    const int phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1) == threads_ - 1) {  // the last to arrive releases the others
      arrived_.store(0, std::memory_order_relaxed);
      phase_.store(phase + 1);
      if (sleepers_.load() > 0) futex(FUTEX_WAKE_PRIVATE, INT32_MAX);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1; phase_.load(std::memory_order_acquire) == phase; ++i) {
      _mm_pause();
      if (i % 64 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
        sleepers_.fetch_add(1);  // seq_cst with the release above: either the releaser sees us, or we see it
        while (phase_.load() == phase) futex(FUTEX_WAIT_PRIVATE, phase);
        sleepers_.fetch_sub(1);
        return;
      }
    }
  }

 private:
  static constexpr auto kSpin = std::chrono::microseconds(200);  // a step of the seed's layer takes 170-300 us
  void futex(int op, int value) {
    syscall(SYS_futex, reinterpret_cast<int*>(&phase_), op, value, nullptr, nullptr, 0);
  }
  const int threads_;
  std::atomic<int> arrived_{0}, phase_{0}, sleepers_{0};
  static_assert(sizeof(std::atomic<int>) == sizeof(int), "the futex waits on the atomic's int");
};

// Runs body(the units of thread k, the team's step barrier) for each thread k of a team that computes under the
// caller's float rules (XLA's threads flush denormals; OpenMP's workers must do the same for the result not to depend
// on which thread computed it).
template <typename Body>
void on_team(int64_t hidden, Body body) {
  const unsigned csr = _mm_getcsr();
  const int n = team_size(hidden);
  StepBarrier barrier(n);
#pragma omp parallel num_threads(n)
  {
    _mm_setcsr(csr);
    body(units_of(omp_get_thread_num(), omp_get_num_threads(), hidden), barrier);
  }
}

// The used rows' input gates (U, 4H) = table[used] W_ih^T + bias, rows the used rows gathered (U, E), each row's
// gates computed alone (the kernel's tiles, or one OpenBLAS product per row on the portable path), so that they do
// not depend on which other rows a batch uses: tokens past a text's end change nothing. (OpenBLAS's GEMM over all
// the used rows at once did not give a row's gates bit for bit at another position in the list.)
void project_used(const StepOps& ops, const float* rows, int64_t used, int64_t e, const float* w, int64_t hidden,
                  const float* bias, float* gates) {
  const int64_t width = 4 * hidden;
  on_team(hidden, [&](Units u, StepBarrier&) {
    const int64_t n = u.size();
    if (n == 0) return;
    if (!ops.tile) {
      for (int64_t r = 0; r < used; ++r)
        for (int g = 0; g < 4; ++g) {  // gates[r, g H + units] = W_ih[g H + units] rows[r] + bias
          float* out = gates + r * width + g * hidden + u.begin;
          std::memcpy(out, bias + g * hidden + u.begin, sizeof(float) * n);
          scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(e), 1.0f,
                            w + (g * hidden + u.begin) * e, static_cast<int>(e), rows + r * e, 1, 1.0f, out, 1);
        }
      return;
    }
    const int64_t lanes = ops.lanes, panel = 4 * lanes;
    Floats packed = packed_rows(ops, w, hidden, e, u), out = floats(ops.tile_rows * panel);
    for (int64_t q = 0; q < (n + lanes - 1) / lanes; ++q)
      for (int64_t r0 = 0; r0 < used; r0 += ops.tile_rows) {
        const int count = static_cast<int>(std::min<int64_t>(ops.tile_rows, used - r0));
        ops.tile(count, {rows + r0 * e, e, e, packed.get() + q * e * panel}, {nullptr, 0, 0, nullptr}, out.get());
        const int64_t j0 = u.begin + lanes * q, m = std::min<int64_t>(lanes, n - lanes * q);
        for (int r = 0; r < count; ++r)
          for (int g = 0; g < 4; ++g) {
            float* to = gates + (r0 + r) * width + g * hidden + j0;
            for (int64_t j = 0; j < m; ++j) to[j] = out[r * panel + g * lanes + j] + bias[g * hidden + j0 + j];
          }
      }
  });
}

ffi::Error check_shapes(const Dims& d, int64_t n, int64_t width, ffi::BufferR2<ffi::S32> rows,
                        ffi::Span<const int64_t> w_hh, int64_t lengths, ffi::Span<const int64_t> x,
                        ffi::Span<const int64_t> w_ih, ffi::Span<const int64_t> table,
                        ffi::Span<const int64_t> w_table) {
  if (width != 4 * d.h || w_hh[0] != 4 * d.h || w_hh[1] != d.h || lengths != d.b)
    return ffi::Error::InvalidArgument("lstm_kernel: w_hh must be (4H, H) and lengths (B,) for a source (N, 4H)");
  if (x[0] != d.t || x[1] != d.b || w_ih[0] != 4 * d.h || w_ih[1] != x[2])
    return ffi::Error::InvalidArgument("lstm_kernel: x must be (T, B, D) and w_ih (4H, D)");
  if (w_table[0] != 4 * d.h || w_table[1] != table[1] || (table[1] > 0 && n != 1))
    return ffi::Error::InvalidArgument("lstm_kernel: w_table must be (4H, E) for a table (V, E), the source one row");
  if (table[1] > 0) n = table[0];  // the rows are the tokens, rows of the table
  const int32_t* r = rows.typed_data();
  if (std::any_of(r, r + rows.element_count(), [n](int32_t i) { return i < 0 || i >= n; }))
    return ffi::Error::InvalidArgument("lstm_kernel: a row index outside the source");
  if (d.h * 4 > INT32_MAX / 2 || x[2] > INT32_MAX / 2 || d.t * d.b > INT32_MAX / 2 || table[1] > INT32_MAX / 2)
    return ffi::Error::InvalidArgument("lstm_kernel: sizes beyond OpenBLAS's 32-bit dimensions");
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::BufferR2<ffi::F32> source, ffi::BufferR2<ffi::S32> rows, ffi::BufferR2<ffi::F32> w_hh,
                   ffi::BufferR2<ffi::F32> h0, ffi::BufferR2<ffi::F32> c0, ffi::BufferR1<ffi::S32> lengths,
                   ffi::BufferR3<ffi::F32> x, ffi::BufferR2<ffi::F32> w_ih, ffi::BufferR2<ffi::F32> table,
                   ffi::BufferR2<ffi::F32> w_table, ffi::ResultBufferR3<ffi::F32> y,
                   ffi::ResultBufferR2<ffi::F32> h_t, ffi::ResultBufferR2<ffi::F32> c_t,
                   ffi::ResultBufferR3<ffi::F32> gates, ffi::ResultBufferR3<ffi::F32> c_after, bool train) {
  const Dims d{rows.dimensions()[0], rows.dimensions()[1], source.dimensions()[1] / 4};
  if (auto err = check_shapes(d, source.dimensions()[0], source.dimensions()[1], rows, w_hh.dimensions(),
                              lengths.element_count(), x.dimensions(), w_ih.dimensions(), table.dimensions(),
                              w_table.dimensions());
      err.failure())
    return err;
  GateRows gx{source.typed_data(), rows.typed_data(), 4 * d.h};
  const int64_t embed = table.dimensions()[1];  // E: 0 unless the call folds the embedding itself
  TableRows fold;
  std::unique_ptr<Scratch> used_gates;
  if (embed > 0) {  // the used rows projected once; each step then gathers its tokens' rows from them
    fold = table_rows(rows.typed_data(), d.t * d.b, table.dimensions()[0]);
    const int64_t used = static_cast<int64_t>(fold.used.size());
    Scratch used_rows(used * embed);
    gather_rows(table.typed_data(), embed, fold.used, used_rows.get());
    used_gates = std::make_unique<Scratch>(used * 4 * d.h);
    project_used(*current_ops.load(), used_rows.get(), used, embed, w_table.typed_data(), d.h, source.typed_data(),
                 used_gates->get());
    gx = {used_gates->get(), fold.slot.data(), 4 * d.h};
  }
  const int64_t inputs = x.dimensions()[2];  // D: 0 where the source holds the whole input gates
  const float *w = w_hh.typed_data(), *xs = x.typed_data(), *wx = w_ih.typed_data();
  const int32_t* len = lengths.typed_data();
  float *ys = y->typed_data(), *a = gates->typed_data(), *cs = c_after->typed_data();
  float* c = c_t->typed_data();
  // The outputs stay on XLA's 4 KiB pages. Transparent huge pages (madvise) halved a step's page faults back to back,
  // but made steps that start seconds apart, as the bench's do, slower: where the VM hands freed 2 MiB blocks back to
  // its host (free page reporting), each fresh huge page is faulted in on the host too (docs/performance.md).
  std::memcpy(c, c0.typed_data(), sizeof(float) * d.b * d.h);
  // h ping-pongs between two buffers: step t's GEMM reads one while the threads write the other.
  Floats h_buffers = floats(2 * d.b * d.h);
  std::memcpy(h_buffers.get(), h0.typed_data(), sizeof(float) * d.b * d.h);
  const StepOps& ops = *current_ops.load();
  const int64_t lanes = ops.lanes, panel = 4 * lanes;
  on_team(d.h, [&](Units u, StepBarrier& barrier) {
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    prefault(ys, y->size_bytes(), me, team), prefault(a, gates->size_bytes(), me, team);
    prefault(cs, c_after->size_bytes(), me, team);
    const int64_t n = u.size(), panels = (n + lanes - 1) / lanes;
    // AVX-512 or AVX2: our tile GEMM on the weights packed in panels of L units, each tile's gate math right after
    // it; else OpenBLAS's GEMM for all of the thread's units at once, then their gate math.
    Floats packed = packed_rows(ops, w, d.h, d.h, u), packed_x = packed_rows(ops, wx, d.h, inputs, u);
    Floats pre = floats(ops.tile ? ops.tile_rows * panel : d.b * 4 * n);
    for (int64_t t = 0; t < d.t; ++t) {
      const float* h_prev = h_buffers.get() + (t % 2) * d.b * d.h;
      float* h_next = h_buffers.get() + ((t + 1) % 2) * d.b * d.h;
      // Row b's units [u.begin + j0, + m) of this step, from their four gates' products (`stride` apart).
      auto finish = [&](int64_t b, int64_t j0, int64_t m, const float* products, int64_t stride) {
        const int64_t row = b * d.h + u.begin + j0, step_row = t * d.b * d.h + row;
        float* a_row = train ? a + (t * d.b + b) * 4 * d.h + u.begin + j0 : nullptr;
        if (t < len[b]) {
          ops.cell(m, stride, d.h, products, gx.at(t * d.b + b) + u.begin + j0,
                   {c + row, h_next + row, ys + step_row, a_row, train ? cs + step_row : nullptr});
        } else {  // past the row's last token: the carry stays, the output is 0, the gates are never read
          std::memcpy(h_next + row, h_prev + row, sizeof(float) * m);
          std::memset(ys + step_row, 0, sizeof(float) * m);
          if (train) {
            for (int g = 0; g < 4; ++g) std::memset(a_row + g * d.h, 0, sizeof(float) * m);
            std::memcpy(cs + step_row, c + row, sizeof(float) * m);
          }
        }
      };
      if (n > 0) {
        for (int64_t b = 0; b < d.b; ++b) prefetch(gx.at(t * d.b + b) + u.begin, n, 4, d.h);
        if (ops.tile) {
          for (int64_t q = 0; q < panels; ++q)
            for (int64_t b0 = 0; b0 < d.b; b0 += ops.tile_rows) {
              const int rows = static_cast<int>(std::min<int64_t>(ops.tile_rows, d.b - b0));
              ops.tile(rows, {xs + (t * d.b + b0) * inputs, inputs, inputs, packed_x.get() + q * inputs * panel},
                       {h_prev + b0 * d.h, d.h, d.h, packed.get() + q * d.h * panel}, pre.get());
              for (int r = 0; r < rows; ++r) finish(b0 + r, lanes * q, std::min<int64_t>(lanes, n - lanes * q),
                                                    pre.get() + r * panel, lanes);
            }
        } else {  // pre (B, 4n) = x_t W_ih[units]^T + h_{t-1} W_hh[units]^T, in column-major terms pre^T = W x_t^T
          if (inputs > 0) gemm(true, false, 4 * n, d.b, inputs, packed_x.get(), inputs, xs + t * d.b * inputs, inputs,
                               false, pre.get(), 4 * n);
          gemm(true, false, 4 * n, d.b, d.h, packed.get(), d.h, h_prev, d.h, inputs > 0, pre.get(), 4 * n);
          for (int64_t b = 0; b < d.b; ++b) finish(b, 0, n, pre.get() + b * 4 * n, n);
        }
      }
      barrier.wait();
    }
    _mm_sfence();  // the streamed outputs (ops.cell) land before the call returns
  });
  std::memcpy(h_t->typed_data(), h_buffers.get() + (d.t % 2) * d.b * d.h, sizeof(float) * d.b * d.h);
  return ffi::Error::Success();
}

// dW_hh (4H, H) = sum over t of dz_t^T h_{t-1}, as two GEMMs on all steps at once (OpenBLAS, split over the team):
// h_{t-1} is y_{t-1}, or h0 at t = 0, wherever step t is real; elsewhere dz_t is 0, so what stands there adds 0.
// In column-major terms dW_hh^T (H, 4H) = h_before^T (H, T B) dz (T B, 4H).
void recurrent_weight_gradient(const Dims& d, const float* dz, const float* h0, const float* y, float* dw) {
  const int64_t g = 4 * d.h, rest = (d.t - 1) * d.b;
  team_gemm(team_size(d.h), false, true, d.h, g, d.b, h0, d.h, dz, g, false, dw, d.h);
  if (rest > 0) team_gemm(team_size(d.h), false, true, d.h, g, rest, y, d.h, dz + d.b * g, g, true, dw, d.h);
}

// dW_ih (4H, D) = sum over t of dz_t^T x_t, one GEMM on all steps (dz_t is 0 where step t is not real); in
// column-major terms dW_ih^T (D, 4H) = x^T (D, T B) dz (T B, 4H).
void input_weight_gradient(const Dims& d, int64_t inputs, const float* dz, const float* x, float* dw) {
  if (inputs == 0) return;
  team_gemm(team_size(d.h), false, true, inputs, 4 * d.h, d.t * d.b, x, inputs, dz, 4 * d.h, false, dw, inputs);
}

// The columns `cols` of a (4H, width) weight (W_hh, W_ih) for the backward's per-step product with dz_t (B, 4H): in
// panels of 4 L columns for the tiles (ops.pack_columns), else copied out whole, (4H, n), for OpenBLAS.
Floats packed_columns(const StepOps& ops, const float* w, int64_t gates, int64_t width, Units cols) {
  const int64_t n = cols.size(), panel = 4 * ops.lanes;
  if (n == 0) return floats(0);
  if (ops.tile) {
    Floats packed = floats((n + panel - 1) / panel * gates * panel);
    ops.pack_columns(w, gates, width, cols.begin, n, packed.get());
    return packed;
  }
  Floats packed = floats(gates * n);
  for (int64_t k = 0; k < gates; ++k) std::memcpy(packed.get() + k * n, w + k * width + cols.begin, sizeof(float) * n);
  return packed;
}

// out[:, cols] (B, n; rows `ldo` apart) = dz_t (B, 4H) . the packed columns (packed_columns).
void times_columns(const StepOps& ops, const float* dz_t, int64_t batch, int64_t gates, const float* packed,
                   Units cols, float* out, int64_t ldo, float* tile_out) {
  const int64_t n = cols.size(), panel = 4 * ops.lanes;
  if (n == 0) return;
  if (!ops.tile) {  // column-major: out^T (n, B) = packed^T (n, 4H) dz_t^T (4H, B)
    gemm(false, false, n, batch, gates, packed, n, dz_t, gates, false, out + cols.begin, ldo);
    return;
  }
  for (int64_t q = 0; q < (n + panel - 1) / panel; ++q)
    for (int64_t b0 = 0; b0 < batch; b0 += ops.tile_rows) {
      const int rows = static_cast<int>(std::min<int64_t>(ops.tile_rows, batch - b0));
      ops.tile(rows, {dz_t + b0 * gates, gates, gates, packed + q * gates * panel}, {nullptr, 0, 0, nullptr},
               tile_out);
      for (int r = 0; r < rows; ++r)
        std::memcpy(out + (b0 + r) * ldo + cols.begin + panel * q, tile_out + r * panel,
                    sizeof(float) * std::min<int64_t>(panel, n - panel * q));
    }
}

ffi::Error Backward(ffi::BufferR2<ffi::S32> rows, ffi::BufferR2<ffi::F32> w_hh, ffi::BufferR2<ffi::F32> h0,
                    ffi::BufferR3<ffi::F32> y, ffi::BufferR3<ffi::F32> gates, ffi::BufferR3<ffi::F32> c_after,
                    ffi::BufferR2<ffi::F32> c0, ffi::BufferR1<ffi::S32> lengths, ffi::BufferR3<ffi::F32> dy,
                    ffi::BufferR2<ffi::F32> dh_t, ffi::BufferR2<ffi::F32> dc_t, ffi::BufferR3<ffi::F32> x,
                    ffi::BufferR2<ffi::F32> w_ih, ffi::BufferR2<ffi::F32> table, ffi::BufferR2<ffi::F32> w_table,
                    ffi::ResultBufferR2<ffi::F32> d_source,
                    ffi::ResultBufferR2<ffi::F32> dw_hh, ffi::ResultBufferR2<ffi::F32> dh0,
                    ffi::ResultBufferR2<ffi::F32> dc0, ffi::ResultBufferR3<ffi::F32> dx,
                    ffi::ResultBufferR2<ffi::F32> dw_ih, ffi::ResultBufferR2<ffi::F32> d_table,
                    ffi::ResultBufferR2<ffi::F32> dw_table, bool gathered) {
  const Dims d{rows.dimensions()[0], rows.dimensions()[1], w_hh.dimensions()[1]};
  const int64_t sources = d_source->dimensions()[0];
  if (auto err = check_shapes(d, sources, d_source->dimensions()[1], rows, w_hh.dimensions(), lengths.element_count(),
                              x.dimensions(), w_ih.dimensions(), table.dimensions(), w_table.dimensions());
      err.failure())
    return err;
  const int64_t inputs = x.dimensions()[2], embed = table.dimensions()[1];
  const float *wx = w_ih.typed_data(), *xs = x.typed_data();
  float* dxs = dx->typed_data();
  if ((!gathered || embed > 0) && sources != (embed > 0 ? 1 : d.t * d.b))
    return ffi::Error::InvalidArgument("lstm_kernel: ungathered gates must have T B rows, a folded table one");
  const float *w = w_hh.typed_data(), *a = gates.typed_data(), *cs = c_after.typed_data();
  const float *c_init = c0.typed_data(), *dys = dy.typed_data();
  const int32_t *len = lengths.typed_data(), *index = rows.typed_data();
  float *dh = dh0->typed_data(), *dc = dc0->typed_data(), *ds = d_source->typed_data();
  // dz (T, B, 4H): d_source itself where the gates were not gathered, else a scratch that each step is added from
  // into its source row (the embedding fold's gradient, a scatter-add): a row of d_source, or where the call folds
  // the table itself, the row of the token's used table row (the used rows' gradients, U of them).
  std::unique_ptr<Scratch> scratch = gathered ? std::make_unique<Scratch>(d.t * d.b * 4 * d.h) : nullptr;
  float* dzs = gathered ? scratch->get() : ds;
  TableRows fold;
  std::unique_ptr<Scratch> d_used;
  int64_t sums = sources;  // the rows the steps add into
  if (embed > 0) {
    fold = table_rows(index, d.t * d.b, table.dimensions()[0]);
    index = fold.slot.data(), sums = static_cast<int64_t>(fold.used.size());
    d_used = std::make_unique<Scratch>(sums * 4 * d.h);
  }
  float* sum_rows = embed > 0 ? d_used->get() : ds;
  // Where each step's dz rows are added: into the rows of d_source they were gathered from (the embedding fold's table
  // gradient) or of the used table rows (the call folds the table); the gradient of one source row, a layer's bias,
  // is their sum over all the steps (StepSums).
  const bool one_row = gathered && (embed > 0 || sources == 1), scatter = gathered && (embed > 0 || sources > 1);
  std::memcpy(dh, dh_t.typed_data(), sizeof(float) * d.b * d.h);
  std::memcpy(dc, dc_t.typed_data(), sizeof(float) * d.b * d.h);
  Floats dh_step = floats(d.b * d.h);  // dh_t + dy_t: the step's total gradient of h
  const StepOps& ops = *current_ops.load();
  on_team(d.h, [&](Units u, StepBarrier& barrier) {
    // Each thread computes dh_{t-1} for its units and dx_t for its share of the inputs (dealt as the units are).
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    const Units cols = units_of(me, team, inputs);
    prefault(dxs, dx->size_bytes(), me, team), prefault(d_table->typed_data(), d_table->size_bytes(), me, team);
    if (!gathered) prefault(ds, d_source->size_bytes(), me, team);  // dz itself
    const int64_t n = u.size(), width = 4 * d.h;
    Floats packed = packed_columns(ops, w, width, d.h, u), packed_x = packed_columns(ops, wx, width, inputs, cols);
    Floats tile_out = floats(std::max(ops.tile_rows, 1) * 4 * ops.lanes);
    StepSums bias(one_row ? n : 0);
    if (scatter)  // this thread's columns of the rows added into, zeroed
      for (int64_t r = 0; r < sums; ++r)
        for (int g = 0; g < 4; ++g) std::memset(sum_rows + r * width + g * d.h + u.begin, 0, sizeof(float) * n);
    for (int64_t t = d.t - 1; t >= 0; --t) {
      for (int64_t b = 0; b < d.b && n > 0; ++b) {
        const int64_t row = b * d.h + u.begin, step_row = t * d.b * d.h + row;
        float* dz_row = dzs + (t * d.b + b) * 4 * d.h + u.begin;
        float* total = dh_step.get() + row;
        if (t < len[b]) {
          for (int64_t j = 0; j < n; ++j) total[j] = dh[row + j] + dys[step_row + j];
          const float* c_prev = t > 0 ? cs + step_row - d.b * d.h : c_init + row;
          ops.cell_backward(n, d.h, a + (t * d.b + b) * 4 * d.h + u.begin, c_prev, cs + step_row, total, dc + row,
                            dz_row);
        } else {  // no step: no gradient of its gates, dh and dc pass through
          std::memcpy(total, dh + row, sizeof(float) * n);
          for (int g = 0; g < 4; ++g) std::memset(dz_row + g * d.h, 0, sizeof(float) * n);
        }
        if (scatter) {
          float* to = sum_rows + index[t * d.b + b] * width + u.begin;
          for (int g = 0; g < 4; ++g)
            for (int64_t j = 0; j < n; ++j) to[g * d.h + j] += dz_row[g * d.h + j];
        }
        if (one_row) bias.add_row(dz_row, d.h);
      }
      if (one_row) bias.end_step();
      barrier.wait();
      const float* dz_t = dzs + t * d.b * width;
      // dh_{t-1} of this thread's units = dz_t (B, 4H) . W_hh[:, units]; dx_t of its inputs = dz_t . W_ih[:, cols]
      times_columns(ops, dz_t, d.b, width, packed.get(), u, dh, d.h, tile_out.get());
      times_columns(ops, dz_t, d.b, width, packed_x.get(), cols, dxs + t * d.b * inputs, inputs, tile_out.get());
      if (n > 0) {
        for (int64_t b = 0; b < d.b; ++b)
          if (t >= len[b]) std::memcpy(dh + b * d.h + u.begin, dh_step.get() + b * d.h + u.begin, sizeof(float) * n);
      }
    }
    if (one_row) bias.total(ds + u.begin, d.h);
  });
  if (d.t > 0 && d.b > 0) {
    recurrent_weight_gradient(d, dzs, h0.typed_data(), y.typed_data(), dw_hh->typed_data());
    input_weight_gradient(d, inputs, dzs, xs, dw_ih->typed_data());
  } else {
    std::memset(dw_hh->typed_data(), 0, dw_hh->size_bytes());
    std::memset(dw_ih->typed_data(), 0, dw_ih->size_bytes());
  }
  if (embed > 0) {  // d table and d W_ih from the used rows' gradients
    Scratch used_rows(sums * embed);
    gather_rows(table.typed_data(), embed, fold.used, used_rows.get());
    table_gradients(d_used->get(), fold, used_rows.get(), embed, w_table.typed_data(), 4 * d.h, table.dimensions()[0],
                    d_table->typed_data(), dw_table->typed_data());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(lstm_kernel_forward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // source
                                  .Arg<ffi::BufferR2<ffi::S32>>()  // rows
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // w_hh
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // h0
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // c0
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // lengths
                                  .Arg<ffi::BufferR3<ffi::F32>>()  // x (T, B, D), D = 0 without
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // w_ih (4H, D)
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // table (V, E), E = 0 without
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // w_table (4H, E)
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // y
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // h_T
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // c_T
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // gates (training; else (0, 0, 0))
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // c after each step (training; else empty)
                                  .Attr<bool>("train"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(lstm_kernel_backward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::BufferR2<ffi::S32>>()  // rows
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // w_hh
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // h0
                                  .Arg<ffi::BufferR3<ffi::F32>>()  // y
                                  .Arg<ffi::BufferR3<ffi::F32>>()  // gates
                                  .Arg<ffi::BufferR3<ffi::F32>>()  // c after each step
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // c0
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // lengths
                                  .Arg<ffi::BufferR3<ffi::F32>>()  // dy
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // dh_T
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // dc_T
                                  .Arg<ffi::BufferR3<ffi::F32>>()  // x
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // w_ih
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // table
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // w_table
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // d_source
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // dw_hh
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // dh0
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // dc0
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // dx
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // dw_ih
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // d table
                                  .Ret<ffi::BufferR2<ffi::F32>>()  // dw_table
                                  .Attr<bool>("gathered"));

// GFLOP/s of the forward's step product as the kernel runs it on instruction set `isa` (lstm_isa::Isa), for
// studies.gemm_choice: (b, h) . (h, 4h) by the team's register tiles over W_hh packed in panels, a barrier after
// each product; best of 5 runs of `reps`. -1 where the CPU cannot run that set or it has no tiles (portable).
extern "C" double lstm_kernel_tile_gflops(int64_t isa, int64_t b, int64_t h, int64_t reps) {
  if (!supported(isa) || !ops_of(isa)->tile) return -1;
  const StepOps& ops = *ops_of(isa);
  const int64_t panel = 4 * ops.lanes;
  std::vector<float> w(4 * h * h, 0.01f), x(b * h, 0.02f);
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    on_team(h, [&](Units u, StepBarrier& barrier) {
      const int64_t panels = (u.size() + ops.lanes - 1) / ops.lanes;
      Floats packed = floats(panels * h * panel), out = floats(ops.tile_rows * panel);
      ops.pack_panels(w.data(), h, h, u.begin, u.size(), packed.get());
      barrier.wait();
      for (int64_t i = 0; i < reps; ++i) {
        for (int64_t q = 0; q < panels; ++q)
          for (int64_t b0 = 0; b0 < b; b0 += ops.tile_rows)
            ops.tile(static_cast<int>(std::min<int64_t>(ops.tile_rows, b - b0)), {nullptr, 0, 0, nullptr},
                     {x.data() + b0 * h, h, h, packed.get() + q * h * panel}, out.get());
        barrier.wait();
      }
    });
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * b * h * 4 * h * reps / best / 1e9;
}

// The team's size for a layer of `hidden` units (for the bench's provenance).
extern "C" int64_t lstm_kernel_threads(int64_t hidden) { return team_size(hidden); }

// The instruction set every call runs now (lstm_isa::Isa: 0 portable, 1 AVX2, 2 AVX-512).
extern "C" int64_t lstm_kernel_isa() { return current_ops.load()->isa; }

// Whether this CPU can run instruction set `isa`.
extern "C" int64_t lstm_kernel_supported(int64_t isa) { return supported(isa); }

// Runs instruction set `isa` from now on and returns the previous one; -1 (nothing changed) where the CPU cannot.
extern "C" int64_t lstm_kernel_set_isa(int64_t isa) {
  if (!supported(isa)) return -1;
  return current_ops.exchange(ops_of(isa))->isa;
}

// Whose exp and tanh instruction set `isa`'s gate math calls, and their accuracy (for the run record).
extern "C" const char* lstm_kernel_exp_tanh(int64_t isa) { return ops_of(isa)->exp_tanh; }

#ifdef LSTM_KERNEL_PROBES  // the test build's probes (CMake option LSTM_TWINS_TEST_PROBES)
// The fraction of a team's threads that flush a denormal product to zero when the caller does (FTZ and DAZ set
// here, as XLA sets them on its threads) and the team's threads were first started by the caller without them.
extern "C" double lstm_kernel_team_flush_fraction(int64_t hidden) {
  const unsigned before = _mm_getcsr();
#pragma omp parallel num_threads(team_size(hidden))
  { volatile int started = omp_get_thread_num(); (void)started; }
  _mm_setcsr(before | _MM_FLUSH_ZERO_ON | 0x0040 /* DAZ */);
  std::atomic<int> flushed{0}, threads{0};
  on_team(hidden, [&](Units, StepBarrier&) {
    volatile float tiny = 1e-20f;
    flushed += (tiny * tiny == 0.0f);
    ++threads;
  });
  _mm_setcsr(before);
  return static_cast<double>(flushed) / threads;
}

// out[i] = exp(in[i]) (which 0) or tanh(in[i]) (which 1), i < n, as instruction set `isa`'s gate math computes them;
// 0, or -1 where the CPU cannot run that set.
extern "C" int64_t lstm_kernel_activation(int64_t isa, int64_t which, const float* in, float* out, int64_t n) {
  if (!supported(isa)) return -1;
  (which == 0 ? ops_of(isa)->exp : ops_of(isa)->tanh)(in, out, n);
  return 0;
}
#endif  // LSTM_KERNEL_PROBES
