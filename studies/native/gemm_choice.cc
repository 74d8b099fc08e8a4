// The microbenchmark that chose lstm_kernel's GEMM: one recurrence step's product (M, K) . (K, N), as the kernel
// runs it: a team of threads, each computing its own N / threads columns, meeting at a barrier after every product.
// Candidates, each loaded from the library whose path is an argument (this library links none of them):
// OpenBLAS's sgemm from scipy-openblas32 (the kernel's BLAS), and, for comparison where torch is installed, MKL's
// packed GEMM (cblas_sgemm_pack once, cblas_sgemm_compute per step) and plain sgemm, from libtorch_cpu, which exports
// them. The kernel's own tiles are timed by lstm_kernel_tile_gflops.
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kPacked = 151, kBMatrix = 162;  // the CBLAS enum values

using OpenBlasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                               float*, int);  // cblas_sgemm, 32-bit integers
using Threads = void (*)(int);
using PackSize = size_t (*)(int, int, int, int);
using Pack = void (*)(int, int, int, int, int, int, float, const float*, int, float*);
using PackedCompute = void (*)(int, int, int, int, int, int, const float*, int, const float*, int, float, float*,
                               int);
using MklThreads = int (*)(int);
using FortranSgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                              const int*, const float*, const int*, const float*, float*, const int*);

template <typename F>
F symbol(void* library, const char* name) {
  return library ? reinterpret_cast<F>(dlsym(library, name)) : nullptr;
}

}  // namespace

// GFLOP/s of the best of 5 runs of `reps` products by `backend` ("openblas_sgemm" from `library`, a scipy-openblas32
// library; "mkl_packed" or "mkl_sgemm" from `library`, a libtorch_cpu) on `threads` threads; -1 where the backend is
// unknown or its library or symbols cannot be loaded.
extern "C" double gemm_choice_gflops(const char* backend, int m, int k, int n, int threads, int reps,
                                     const char* library) {
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  const bool openblas = !std::strcmp(backend, "openblas_sgemm"), packed = !std::strcmp(backend, "mkl_packed");
  if (!openblas && !packed && std::strcmp(backend, "mkl_sgemm")) return -1;
  auto sgemm = symbol<OpenBlasSgemm>(lib, "scipy_cblas_sgemm");
  auto fortran_sgemm = symbol<FortranSgemm>(lib, "sgemm_");
  auto single = symbol<Threads>(lib, "scipy_openblas_set_num_threads");
  auto mkl_single = symbol<MklThreads>(lib, "MKL_Set_Num_Threads_Local");
  auto pack_size = symbol<PackSize>(lib, "cblas_sgemm_pack_get_size");
  auto pack = symbol<Pack>(lib, "cblas_sgemm_pack");
  auto compute = symbol<PackedCompute>(lib, "cblas_sgemm_compute");
  if (openblas ? !sgemm || !single : !mkl_single || (packed ? !pack_size || !pack || !compute : !fortran_sgemm))
    return -1;
  if (openblas) single(1);  // one thread per caller: the team is the parallelism
  const int columns = n / threads;
  std::vector<float> a(size_t(m) * k, 0.01f), b(size_t(k) * n, 0.02f), c(size_t(m) * n);
  std::vector<std::vector<float>> packs(threads);
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      if (!openblas) mkl_single(1);
      const int t = omp_get_thread_num();
      const float *bt = b.data() + t * columns, one = 1.0f, zero = 0.0f;
      float* ct = c.data() + t * columns;
      if (packed && packs[t].empty()) {
        packs[t].resize(pack_size(kBMatrix, m, columns, k) / sizeof(float) + 1);
        pack(kRowMajor, kBMatrix, kNoTrans, m, columns, k, 1.0f, bt, n, packs[t].data());
      }
#pragma omp barrier
      for (int i = 0; i < reps; ++i) {
        if (packed)
          compute(kRowMajor, kNoTrans, kPacked, m, columns, k, a.data(), k, packs[t].data(), columns, 0.0f, ct, n);
        else if (openblas)
          sgemm(kRowMajor, kNoTrans, kNoTrans, m, columns, k, 1.0f, a.data(), k, bt, n, 0.0f, ct, n);
        else  // column-major: C^T (columns, m) = B^T . A^T
          fortran_sgemm("N", "N", &columns, &m, &k, &one, bt, &n, a.data(), &k, &zero, ct, &n);
#pragma omp barrier
      }
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * m * k * columns * threads * reps / best / 1e9;
}
