// lstm_step.h compiled for AVX2 with FMA (8 lanes, 16 registers: tiles of 3 rows), with glibc's vector exp and tanh
// (libmvec). lstm_kernel.cc calls it only where the CPU has AVX2 and FMA.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC target("avx2,fma")

extern "C" {
__m256 _ZGVdN8v_expf(__m256 x);  // glibc's libmvec: expf and tanhf on 8 lanes
__m256 _ZGVdN8v_tanhf(__m256 x);
}

#include "lstm_step.h"

namespace {

struct Avx2 {
  using R = __m256;
  static constexpr int kLanes = 8;
  // 3 rows x 4 accumulators + 4 panel registers + 1 broadcast: one more than the 16 registers, so one FMA reads its
  // operand from the cache; 2 and 4 rows run slower (lstm_kernel_tile_gflops; docs/performance.md's log).
  static constexpr int kTileRows = 3;

  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p, int n) { return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask(n)); }
  static R load_aligned(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, int n, R v) {
    if (n >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, mask(n), v);
  }
  static void store_aligned(float* p, R v) { _mm256_store_ps(p, v); }
  // A store that bypasses the cache where it covers a whole aligned 32-byte half line (the callers' sfence orders it).
  static void stream(float* p, int n, R v) {
    if (n == 8 && (reinterpret_cast<uintptr_t>(p) & 31) == 0) _mm256_stream_ps(p, v);
    else store(p, n, v);
  }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R exp(R x) { return _ZGVdN8v_expf(x); }
  static R tanh(R x) { return _ZGVdN8v_tanhf(x); }
};

}  // namespace

const lstm_isa::StepOps& lstm_isa::avx2_ops() {
  static const StepOps ops = Step<Avx2>::ops(kAvx2, "avx2", "glibc libmvec's expf and tanhf, 8 lanes");
  return ops;
}
