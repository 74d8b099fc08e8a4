// The microbenchmark that chose lstm_kernel's GEMM: one recurrence step's product (M, K) . (K, N), as the kernel
// runs it: a team of threads, each computing its own N / threads columns, meeting at a barrier after every product.
// Candidates: MKL's packed GEMM (cblas_sgemm_pack once, cblas_sgemm_compute per step) and plain sgemm, both from the
// MKL that torch links and exports, and OpenBLAS's sgemm from the library numpy ships (its path is an argument).
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mkl_exports.h"

namespace {

using namespace mkl_exports;  // the CBLAS enum values
using OpenBlasSgemm = void (*)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                               int64_t, float, float*, int64_t);  // cblas_sgemm with 64-bit integers
using OpenBlasThreads = void (*)(int);

}  // namespace

// GFLOP/s of the best of 5 runs of `reps` products by `backend` ("mkl_packed", "mkl_sgemm" or "openblas_sgemm"; the
// last needs `openblas`, the path of a library exporting scipy_cblas_sgemm64_) on `threads` threads; -1 where the
// backend is unknown or cannot be loaded.
extern "C" double gemm_choice_gflops(const char* backend, int m, int k, int n, int threads, int reps,
                                     const char* openblas) {
  OpenBlasSgemm openblas_sgemm = nullptr;
  if (!std::strcmp(backend, "openblas_sgemm")) {
    void* library = dlopen(openblas, RTLD_NOW | RTLD_LOCAL);
    openblas_sgemm = library ? reinterpret_cast<OpenBlasSgemm>(dlsym(library, "scipy_cblas_sgemm64_")) : nullptr;
    auto single = library ? reinterpret_cast<OpenBlasThreads>(dlsym(library, "scipy_openblas_set_num_threads64_"))
                          : nullptr;
    if (!openblas_sgemm || !single) return -1;
    single(1);  // one thread per caller: the team is the parallelism, as for MKL
  } else if (std::strcmp(backend, "mkl_packed") && std::strcmp(backend, "mkl_sgemm")) {
    return -1;
  }
  const bool packed = !std::strcmp(backend, "mkl_packed");
  const int columns = n / threads;
  std::vector<float> a(size_t(m) * k, 0.01f), b(size_t(k) * n, 0.02f), c(size_t(m) * n);
  std::vector<std::vector<float>> packs(threads);
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      MKL_Set_Num_Threads_Local(1);
      const int t = omp_get_thread_num();
      const float *bt = b.data() + t * columns, one = 1.0f, zero = 0.0f;
      float* ct = c.data() + t * columns;
      if (packed && packs[t].empty()) {
        packs[t].resize(cblas_sgemm_pack_get_size(kBMatrix, m, columns, k) / sizeof(float) + 1);
        cblas_sgemm_pack(kRowMajor, kBMatrix, kNoTrans, m, columns, k, 1.0f, bt, n, packs[t].data());
      }
#pragma omp barrier
      for (int i = 0; i < reps; ++i) {
        if (packed)
          cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, columns, k, a.data(), k, packs[t].data(), columns,
                              0.0f, ct, n);
        else if (openblas_sgemm)
          openblas_sgemm(kRowMajor, kNoTrans, kNoTrans, m, columns, k, 1.0f, a.data(), k, bt, n, 0.0f, ct, n);
        else  // column-major: C^T (columns, m) = B^T . A^T
          sgemm_("N", "N", &columns, &m, &k, &one, bt, &n, a.data(), &k, &zero, ct, &n);
#pragma omp barrier
      }
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * m * k * columns * threads * reps / best / 1e9;
}
