// One LSTM step's arithmetic for lstm_kernel.cc: the gate math (scalar, and on AVX-512 with SLEEF's exp and tanh)
// and the AVX-512 register tiles of the step's product, with the packing of the weights they read. Every
// function works on one thread's share of the units; lstm_kernel.cc deals the shares and runs the steps.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {
__m512 Sleef_expf16_u10(__m512 x);  // SLEEF, as libtorch_cpu exports it
__m512 Sleef_tanhf16_u35(__m512 x);
}

namespace lstm_step {

constexpr int kLanes = 16;  // float32 lanes of an AVX-512 register

// ------------------------------------------------------------------------------------------- the gate math
// Each function handles units [0, n) of one row; pointers are offset to the thread's first unit. The AVX-512 and
// scalar versions compute the same expressions in the same order (so they differ only by the functions' rounding).

inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// Where the forward's step writes one row: c in place and h (the carry, read again next step); the output y and,
// where kept for the backward (not null), the activated gates a (stride H) and a copy of c. Those three are not read
// again in the call, so on AVX-512 they bypass the cache.
struct StepOut {
  float *c, *h, *y, *a, *c_kept;
};

// Forward, one row: z = pre (the GEMM's four gate blocks, `stride` apart) + gx (stride H) -> StepOut.
void cell_scalar(int64_t n, int64_t stride, int64_t hidden, const float* pre, const float* gx, StepOut out) {
  for (int64_t j = 0; j < n; ++j) {
    const float i = sigmoid(pre[j] + gx[j]), f = sigmoid(pre[stride + j] + gx[hidden + j]);
    const float g = std::tanh(pre[2 * stride + j] + gx[2 * hidden + j]);
    const float o = sigmoid(pre[3 * stride + j] + gx[3 * hidden + j]);
    const float c_new = f * out.c[j] + i * g;
    if (out.a) out.a[j] = i, out.a[hidden + j] = f, out.a[2 * hidden + j] = g, out.a[3 * hidden + j] = o;
    if (out.c_kept) out.c_kept[j] = c_new;
    out.c[j] = c_new;
    out.h[j] = out.y[j] = o * std::tanh(c_new);
  }
}

// Compiled for AVX-512 (lambdas included), called only where the CPU has it.
#pragma GCC push_options
#pragma GCC target("avx512f")

inline __m512 sigmoid16(__m512 z) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_sub_ps(_mm512_setzero_ps(), z))));
}

// A store that bypasses the cache where it covers a whole aligned 64-byte line (the callers' sfence orders it).
inline void stream(float* p, __mmask16 m, __m512 v) {
  if (m == 0xFFFF && (reinterpret_cast<uintptr_t>(p) & 63) == 0) _mm512_stream_ps(p, v);
  else _mm512_mask_storeu_ps(p, m, v);
}

void cell_avx512(int64_t n, int64_t stride, int64_t hidden, const float* pre, const float* gx, StepOut out) {
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = n - j >= kLanes ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
    auto load = [m](const float* p) { return _mm512_maskz_loadu_ps(m, p); };
    const __m512 i = sigmoid16(_mm512_add_ps(load(pre + j), load(gx + j)));
    const __m512 f = sigmoid16(_mm512_add_ps(load(pre + stride + j), load(gx + hidden + j)));
    const __m512 g = Sleef_tanhf16_u35(_mm512_add_ps(load(pre + 2 * stride + j), load(gx + 2 * hidden + j)));
    const __m512 o = sigmoid16(_mm512_add_ps(load(pre + 3 * stride + j), load(gx + 3 * hidden + j)));
    const __m512 c_new = _mm512_add_ps(_mm512_mul_ps(f, load(out.c + j)), _mm512_mul_ps(i, g));
    const __m512 h = _mm512_mul_ps(o, Sleef_tanhf16_u35(c_new));
    if (out.a) {
      stream(out.a + j, m, i);
      stream(out.a + hidden + j, m, f);
      stream(out.a + 2 * hidden + j, m, g);
      stream(out.a + 3 * hidden + j, m, o);
    }
    if (out.c_kept) stream(out.c_kept + j, m, c_new);
    _mm512_mask_storeu_ps(out.c + j, m, c_new);
    _mm512_mask_storeu_ps(out.h + j, m, h);
    stream(out.y + j, m, h);
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
    const __m512 tanh_c = Sleef_tanhf16_u35(load(c + j));
    const __m512 dc_total = _mm512_add_ps(load(dc + j), mul(mul(d_h, o), one_minus(mul(tanh_c, tanh_c))));
    _mm512_mask_storeu_ps(dz + j, m, mul(mul(dc_total, g), mul(i, one_minus(i))));
    _mm512_mask_storeu_ps(dz + hidden + j, m, mul(mul(dc_total, load(c_prev + j)), mul(f, one_minus(f))));
    _mm512_mask_storeu_ps(dz + 2 * hidden + j, m, mul(mul(dc_total, i), one_minus(mul(g, g))));
    _mm512_mask_storeu_ps(dz + 3 * hidden + j, m, mul(mul(d_h, tanh_c), mul(o, one_minus(o))));
    _mm512_mask_storeu_ps(dc + j, m, mul(dc_total, f));
  }
}

// One operand of a step's GEMM: rows of A (R, k; rows `lda` apart) and P (k, 64), one panel of a weight packed row
// after row (pack_panels, pack_columns). k may be 0: the operand adds nothing.
struct Operand {
  const float* a;
  int64_t lda, k;
  const float* p;
};

// Each step's GEMM on AVX-512: C (R, 64) = A1 P1 + A2 P2 over the two operands (in the forward x_t W_ih^T and
// h_{t-1} W_hh^T for the four gate columns of 16 units, in the backward dz_t W_hh and dz_t W_ih for 64 columns).
// R rows times 4 registers of accumulators stay in registers over both k loops, so the product runs near the FMA
// units' peak and lands where the gate math reads it.
template <int R>
__attribute__((always_inline)) inline void accumulate(__m512 (&acc)[R][4], const Operand& m) {
  for (int64_t i = 0; i < m.k; ++i) {
    const float* row = m.p + i * 64;
    const __m512 b0 = _mm512_load_ps(row), b1 = _mm512_load_ps(row + 16), b2 = _mm512_load_ps(row + 32),
                 b3 = _mm512_load_ps(row + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(m.a[r * m.lda + i]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(x, b2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(x, b3, acc[r][3]);
    }
  }
}

template <int R>
void tile(Operand first, Operand second, float* c) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
  accumulate<R>(acc, first);
  accumulate<R>(acc, second);
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < 4; ++q) _mm512_store_ps(c + r * 64 + q * 16, acc[r][q]);
}

constexpr int kTileRows = 6;  // 6 rows x 4 accumulators + 4 panel registers + 1 broadcast: 29 of 32 registers

void tile_rows(int rows, Operand first, Operand second, float* c) {
  switch (rows) {
    case 6: return tile<6>(first, second, c);
    case 5: return tile<5>(first, second, c);
    case 4: return tile<4>(first, second, c);
    case 3: return tile<3>(first, second, c);
    case 2: return tile<2>(first, second, c);
    default: return tile<1>(first, second, c);
  }
}

#pragma GCC pop_options

// The rows of units [begin, begin + n) of a gate weight w (4H, k), W_hh or W_ih, transposed into panels of 16 units:
// panel q holds, for each of the k inputs, the 64 floats w[g H + begin + 16 q + j][input] for g = i, f, g, o and
// j < 16 (0 past the range).
void pack_panels(const float* w, int64_t hidden, int64_t k, int64_t begin, int64_t n, float* panels) {
  const int64_t count = (n + 15) / 16;
  std::memset(panels, 0, sizeof(float) * count * k * 64);
  for (int64_t q = 0; q < count; ++q)
    for (int g = 0; g < 4; ++g)
      for (int64_t j = 0; j < 16 && 16 * q + j < n; ++j) {
        const float* from = w + (g * hidden + begin + 16 * q + j) * k;
        float* to = panels + q * k * 64 + g * 16 + j;
        for (int64_t i = 0; i < k; ++i) to[i * 64] = from[i];
      }
}

// The columns [begin, begin + n) of a (rows, width) matrix w (W_hh's of units, W_ih's of inputs) in panels of 64
// columns: panel q holds, for each row k, the 64 floats w[k][begin + 64 q + j] for j < 64 (0 past the range).
void pack_columns(const float* w, int64_t rows, int64_t width, int64_t begin, int64_t n, float* panels) {
  const int64_t count = (n + 63) / 64;
  std::memset(panels, 0, sizeof(float) * count * rows * 64);
  for (int64_t q = 0; q < count; ++q)
    for (int64_t k = 0; k < rows; ++k)
      std::memcpy(panels + (q * rows + k) * 64, w + k * width + begin + 64 * q,
                  sizeof(float) * std::min<int64_t>(64, n - 64 * q));
}

}  // namespace lstm_step
