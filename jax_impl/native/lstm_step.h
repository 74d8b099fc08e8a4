// One LSTM step's arithmetic for lstm_kernel.cc: the gate math (scalar, and on AVX-512 with SLEEF's 1-ulp exp and
// tanh) and the AVX-512 register tiles of the step's product, with the packing of W_hh they read. Every function
// works on one thread's share of the units; lstm_kernel.cc deals the shares and runs the steps.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {
__m512 Sleef_expf16_u10(__m512 x);  // SLEEF, as libtorch_cpu exports it
__m512 Sleef_tanhf16_u10(__m512 x);
}

namespace lstm_step {

constexpr int kLanes = 16;  // float32 lanes of an AVX-512 register

// ------------------------------------------------------------------------------------------- the gate math
// Each function handles units [0, n) of one row; pointers are offset to the thread's first unit. The AVX-512 and
// scalar versions compute the same expressions in the same order (so they differ only by the functions' rounding).

inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// Forward, one row: z = pre (the GEMM's four gate blocks, `stride` apart) + gx (stride H) -> a (stride H), c in
// place, h.
void cell_scalar(int64_t n, int64_t stride, int64_t hidden, const float* pre, const float* gx, float* a, float* c,
                 float* h) {
  for (int64_t j = 0; j < n; ++j) {
    const float i = sigmoid(pre[j] + gx[j]), f = sigmoid(pre[stride + j] + gx[hidden + j]);
    const float g = std::tanh(pre[2 * stride + j] + gx[2 * hidden + j]);
    const float o = sigmoid(pre[3 * stride + j] + gx[3 * hidden + j]);
    const float c_new = f * c[j] + i * g;
    a[j] = i, a[hidden + j] = f, a[2 * hidden + j] = g, a[3 * hidden + j] = o;
    c[j] = c_new;
    h[j] = o * std::tanh(c_new);
  }
}

// Compiled for AVX-512 (lambdas included), called only where the CPU has it.
#pragma GCC push_options
#pragma GCC target("avx512f")

inline __m512 sigmoid16(__m512 z) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_sub_ps(_mm512_setzero_ps(), z))));
}

void cell_avx512(int64_t n, int64_t stride, int64_t hidden, const float* pre, const float* gx, float* a, float* c,
                 float* h) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = n - j >= kLanes ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    auto load = [m](const float* p) { return _mm512_maskz_loadu_ps(m, p); };
    const __m512 i = sigmoid16(_mm512_add_ps(load(pre + j), load(gx + j)));
    const __m512 f = sigmoid16(_mm512_add_ps(load(pre + stride + j), load(gx + hidden + j)));
    const __m512 g = Sleef_tanhf16_u10(_mm512_add_ps(load(pre + 2 * stride + j), load(gx + 2 * hidden + j)));
    const __m512 o = sigmoid16(_mm512_add_ps(load(pre + 3 * stride + j), load(gx + 3 * hidden + j)));
    const __m512 c_new = _mm512_add_ps(_mm512_mul_ps(f, load(c + j)), _mm512_mul_ps(i, g));
    _mm512_mask_storeu_ps(a + j, m, i);
    _mm512_mask_storeu_ps(a + hidden + j, m, f);
    _mm512_mask_storeu_ps(a + 2 * hidden + j, m, g);
    _mm512_mask_storeu_ps(a + 3 * hidden + j, m, o);
    _mm512_mask_storeu_ps(c + j, m, c_new);
    _mm512_mask_storeu_ps(h + j, m, _mm512_mul_ps(o, Sleef_tanhf16_u10(c_new)));
  }
}

// Backward, one row: the step's gates a (stride H), c before and after it, dh (the step's total) and dc in place
// (dc_t in, dc_{t-1} out) -> dz (stride H).
void cell_backward_scalar(int64_t n, int64_t hidden, const float* a, const float* c_prev, const float* c,
                          const float* dh, float* dc, float* dz) {
  for (int64_t j = 0; j < n; ++j) {
    const float i = a[j], f = a[hidden + j], g = a[2 * hidden + j], o = a[3 * hidden + j];
    const float tanh_c = std::tanh(c[j]);
    const float dc_total = dc[j] + dh[j] * o * (1 - tanh_c * tanh_c);
    dz[j] = dc_total * g * (i * (1 - i));
    dz[hidden + j] = dc_total * c_prev[j] * (f * (1 - f));
    dz[2 * hidden + j] = dc_total * i * (1 - g * g);
    dz[3 * hidden + j] = dh[j] * tanh_c * (o * (1 - o));
    dc[j] = dc_total * f;
  }
}

void cell_backward_avx512(int64_t n, int64_t hidden, const float* a, const float* c_prev, const float* c,
                          const float* dh, float* dc, float* dz) {
  const __m512 one = _mm512_set1_ps(1.0f);
  auto mul = [](__m512 x, __m512 y) { return _mm512_mul_ps(x, y); };
  auto one_minus = [one](__m512 x) { return _mm512_sub_ps(one, x); };
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = n - j >= kLanes ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    auto load = [m](const float* p) { return _mm512_maskz_loadu_ps(m, p); };
    const __m512 i = load(a + j), f = load(a + hidden + j), g = load(a + 2 * hidden + j),
                 o = load(a + 3 * hidden + j), d_h = load(dh + j);
    const __m512 tanh_c = Sleef_tanhf16_u10(load(c + j));
    const __m512 dc_total = _mm512_add_ps(load(dc + j), mul(mul(d_h, o), one_minus(mul(tanh_c, tanh_c))));
    _mm512_mask_storeu_ps(dz + j, m, mul(mul(dc_total, g), mul(i, one_minus(i))));
    _mm512_mask_storeu_ps(dz + hidden + j, m, mul(mul(dc_total, load(c_prev + j)), mul(f, one_minus(f))));
    _mm512_mask_storeu_ps(dz + 2 * hidden + j, m, mul(mul(dc_total, i), one_minus(mul(g, g))));
    _mm512_mask_storeu_ps(dz + 3 * hidden + j, m, mul(mul(d_h, tanh_c), mul(o, one_minus(o))));
    _mm512_mask_storeu_ps(dc + j, m, mul(dc_total, f));
  }
}

// Each step's GEMM on AVX-512: C (R, 64) = A (R, K; rows `lda` apart) . P (K, 64), P one panel of W_hh packed row
// after row: in the forward (pack_panels) the four gate columns of 16 units, in the backward (pack_columns) 64 units
// of dh. R rows times 4 registers of accumulators stay in registers over the whole K loop, so the product runs near
// the FMA units' peak and lands where the gate math reads it.
template <int R>
void tile(const float* a, int64_t lda, int64_t k, const float* p, float* c) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const float* row = p + i * 64;
    const __m512 b0 = _mm512_load_ps(row), b1 = _mm512_load_ps(row + 16), b2 = _mm512_load_ps(row + 32),
                 b3 = _mm512_load_ps(row + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + i]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(x, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(x, b3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < 4; ++q) _mm512_store_ps(c + r * 64 + q * 16, acc[r][q]);
}

constexpr int kTileRows = 6;  // 6 rows x 4 accumulators + 4 panel registers + 1 broadcast: 29 of 32 registers

void tile_rows(int rows, const float* a, int64_t lda, int64_t k, const float* p, float* c) {
  switch (rows) {
    case 6: return tile<6>(a, lda, k, p, c);
    case 5: return tile<5>(a, lda, k, p, c);
    case 4: return tile<4>(a, lda, k, p, c);
    case 3: return tile<3>(a, lda, k, p, c);
    case 2: return tile<2>(a, lda, k, p, c);
    default: return tile<1>(a, lda, k, p, c);
  }
}

#pragma GCC pop_options

// W_hh's rows of units [begin, begin + n), transposed into panels of 16 units: panel q holds, for each of the H
// inputs k, the 64 floats W_hh[g H + begin + 16 q + j][k] for g = i, f, g, o and j < 16 (0 past the range).
void pack_panels(const float* w, int64_t hidden, int64_t begin, int64_t n, float* panels) {
  const int64_t count = (n + 15) / 16;
  std::memset(panels, 0, sizeof(float) * count * hidden * 64);
  for (int64_t q = 0; q < count; ++q)
    for (int g = 0; g < 4; ++g)
      for (int64_t j = 0; j < 16 && 16 * q + j < n; ++j) {
        const float* from = w + (g * hidden + begin + 16 * q + j) * hidden;
        float* to = panels + q * hidden * 64 + g * 16 + j;
        for (int64_t k = 0; k < hidden; ++k) to[k * 64] = from[k];
      }
}

// W_hh's columns of units [begin, begin + n) in panels of 64 units: panel q holds, for each of the 4H gates k, the 64
// floats W_hh[k][begin + 64 q + j] for j < 64 (0 past the range).
void pack_columns(const float* w, int64_t hidden, int64_t begin, int64_t n, float* panels) {
  const int64_t count = (n + 63) / 64;
  std::memset(panels, 0, sizeof(float) * count * 4 * hidden * 64);
  for (int64_t q = 0; q < count; ++q)
    for (int64_t k = 0; k < 4 * hidden; ++k)
      std::memcpy(panels + (q * 4 * hidden + k) * 64, w + k * hidden + begin + 64 * q,
                  sizeof(float) * std::min<int64_t>(64, n - 64 * q));
}

}  // namespace lstm_step
