// lstm_step.h compiled for AVX-512 (16 lanes, 32 registers: tiles of 6 rows), with glibc's vector exp and tanh
// (libmvec). lstm_kernel.cc calls it only where the CPU has AVX-512.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC target("avx512f,fma")

extern "C" {
__m512 _ZGVeN16v_expf(__m512 x);  // glibc's libmvec: expf and tanhf on 16 lanes
__m512 _ZGVeN16v_tanhf(__m512 x);
}

#include "lstm_step.h"

namespace {

struct Avx512 {
  using R = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kTileRows = 6;  // 6 rows x 4 accumulators + 4 panel registers + 1 broadcast: 29 of 32

  static __mmask16 mask(int n) { return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static R load_aligned(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, int n, R v) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static void store_aligned(float* p, R v) { _mm512_store_ps(p, v); }
  // A store that bypasses the cache where it covers a whole aligned 64-byte line (the callers' sfence orders it).
  static void stream(float* p, int n, R v) {
    if (n == 16 && (reinterpret_cast<uintptr_t>(p) & 63) == 0) _mm512_stream_ps(p, v);
    else store(p, n, v);
  }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R exp(R x) { return _ZGVeN16v_expf(x); }
  static R tanh(R x) { return _ZGVeN16v_tanhf(x); }
};

}  // namespace

const lstm_isa::StepOps& lstm_isa::avx512_ops() {
  static const StepOps ops = Step<Avx512>::ops(kAvx512, "avx512", "glibc libmvec's expf and tanhf, 16 lanes");
  return ops;
}
