// One LSTM step's arithmetic for any vector width, as lstm_isa.h describes it: the gate math and the register tiles of
// the step's product, with the packing of the weights they read. Written once over a vector type V, which gives the
// register type R, its lanes L, the tile's rows, the arithmetic, masked loads and stores, and vector exp and tanh;
// lstm_step_avx512.cc and lstm_step_avx2.cc each define a V and compile this file for their instruction set (the
// whole translation unit under that target, everything here with internal linkage, so the two copies never meet).
//
// Every function works on one thread's share of the units; lstm_kernel.cc deals the shares and runs the steps. The
// gate math computes the scalar path's expressions in the same order, and each output of a tile is accumulated over
// its inputs in the same order at every width, so the two vector paths' products are the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "lstm_isa.h"

namespace {

using lstm_isa::Operand;
using lstm_isa::StepOut;

template <class V>
struct Step {
  using R = typename V::R;
  static constexpr int L = V::kLanes, kWidth = 4 * L;  // a panel's row: the four gates of L units

  static R sigmoid(R z) {
    const R one = V::set1(1.0f);
    return V::div(one, V::add(one, V::exp(V::sub(V::zero(), z))));
  }

  static void cell(int64_t n, int64_t stride, int64_t hidden, const float* pre, const float* gx, StepOut out) {
    for (int64_t j = 0; j < n; j += L) {
      const int m = static_cast<int>(std::min<int64_t>(L, n - j));
      auto load = [m](const float* p) { return V::load(p, m); };
      const R i = sigmoid(V::add(load(pre + j), load(gx + j)));
      const R f = sigmoid(V::add(load(pre + stride + j), load(gx + hidden + j)));
      const R g = V::tanh(V::add(load(pre + 2 * stride + j), load(gx + 2 * hidden + j)));
      const R o = sigmoid(V::add(load(pre + 3 * stride + j), load(gx + 3 * hidden + j)));
      const R c_new = V::add(V::mul(f, load(out.c + j)), V::mul(i, g));
      const R h = V::mul(o, V::tanh(c_new));
      if (out.a) {
        V::stream(out.a + j, m, i);
        V::stream(out.a + hidden + j, m, f);
        V::stream(out.a + 2 * hidden + j, m, g);
        V::stream(out.a + 3 * hidden + j, m, o);
      }
      if (out.c_kept) V::stream(out.c_kept + j, m, c_new);
      V::store(out.c + j, m, c_new);
      V::store(out.h + j, m, h);
      V::stream(out.y + j, m, h);
    }
  }

  static void cell_backward(int64_t n, int64_t hidden, const float* a, const float* c_prev, const float* c,
                            const float* dh, float* dc, float* dz) {
    const R one = V::set1(1.0f);
    auto one_minus = [one](R x) { return V::sub(one, x); };
    for (int64_t j = 0; j < n; j += L) {
      const int m = static_cast<int>(std::min<int64_t>(L, n - j));
      auto load = [m](const float* p) { return V::load(p, m); };
      const R i = load(a + j), f = load(a + hidden + j), g = load(a + 2 * hidden + j), o = load(a + 3 * hidden + j);
      const R d_h = load(dh + j), tanh_c = V::tanh(load(c + j));
      const R dc_total = V::add(load(dc + j), V::mul(V::mul(d_h, o), one_minus(V::mul(tanh_c, tanh_c))));
      V::store(dz + j, m, V::mul(V::mul(dc_total, g), V::mul(i, one_minus(i))));
      V::store(dz + hidden + j, m, V::mul(V::mul(dc_total, load(c_prev + j)), V::mul(f, one_minus(f))));
      V::store(dz + 2 * hidden + j, m, V::mul(V::mul(dc_total, i), one_minus(V::mul(g, g))));
      V::store(dz + 3 * hidden + j, m, V::mul(V::mul(d_h, tanh_c), V::mul(o, one_minus(o))));
      V::store(dc + j, m, V::mul(dc_total, f));
    }
  }

  // Each step's GEMM: C (Rows, 4 L) = A1 P1 + A2 P2 over the two operands (in the forward x_t W_ih^T and
  // h_{t-1} W_hh^T for the four gate columns of L units, in the backward dz_t W_hh and dz_t W_ih for 4 L columns).
  // Rows times 4 registers of accumulators stay in registers over both k loops, so the product runs near the FMA
  // units' peak and lands where the gate math reads it.
  template <int Rows>
  __attribute__((always_inline)) static void accumulate(R (&acc)[Rows][4], const Operand& m) {
    for (int64_t i = 0; i < m.k; ++i) {
      const float* row = m.p + i * kWidth;
      const R b0 = V::load_aligned(row), b1 = V::load_aligned(row + L), b2 = V::load_aligned(row + 2 * L),
              b3 = V::load_aligned(row + 3 * L);
      for (int r = 0; r < Rows; ++r) {
        const R x = V::set1(m.a[r * m.lda + i]);
        acc[r][0] = V::fma(x, b0, acc[r][0]);
        acc[r][1] = V::fma(x, b1, acc[r][1]);
        acc[r][2] = V::fma(x, b2, acc[r][2]);
        acc[r][3] = V::fma(x, b3, acc[r][3]);
      }
    }
  }

  template <int Rows>
  static void tile(Operand first, Operand second, float* c) {
    R acc[Rows][4];
    for (int r = 0; r < Rows; ++r)
      for (int q = 0; q < 4; ++q) acc[r][q] = V::zero();
    accumulate<Rows>(acc, first);
    accumulate<Rows>(acc, second);
    for (int r = 0; r < Rows; ++r)
      for (int q = 0; q < 4; ++q) V::store_aligned(c + r * kWidth + q * L, acc[r][q]);
  }

  template <int Rows = V::kTileRows>
  static void tile_rows(int rows, Operand first, Operand second, float* c) {
    if constexpr (Rows == 1) {
      tile<1>(first, second, c);
    } else {
      if (rows >= Rows) return tile<Rows>(first, second, c);
      tile_rows<Rows - 1>(rows, first, second, c);
    }
  }

  static void pack_panels(const float* w, int64_t hidden, int64_t k, int64_t begin, int64_t n, float* panels) {
    const int64_t count = (n + L - 1) / L;
    std::memset(panels, 0, sizeof(float) * count * k * kWidth);
    for (int64_t q = 0; q < count; ++q)
      for (int g = 0; g < 4; ++g)
        for (int64_t j = 0; j < L && L * q + j < n; ++j) {
          const float* from = w + (g * hidden + begin + L * q + j) * k;
          float* to = panels + q * k * kWidth + g * L + j;
          for (int64_t i = 0; i < k; ++i) to[i * kWidth] = from[i];
        }
  }

  static void pack_columns(const float* w, int64_t rows, int64_t width, int64_t begin, int64_t n, float* panels) {
    const int64_t count = (n + kWidth - 1) / kWidth;
    std::memset(panels, 0, sizeof(float) * count * rows * kWidth);
    for (int64_t q = 0; q < count; ++q)
      for (int64_t k = 0; k < rows; ++k)
        std::memcpy(panels + (q * rows + k) * kWidth, w + k * width + begin + kWidth * q,
                    sizeof(float) * std::min<int64_t>(kWidth, n - kWidth * q));
  }

  template <R (*F)(R)>
  static void apply(const float* in, float* out, int64_t n) {
    for (int64_t j = 0; j < n; j += L) {
      const int m = static_cast<int>(std::min<int64_t>(L, n - j));
      V::store(out + j, m, F(V::load(in + j, m)));
    }
  }

  static lstm_isa::StepOps ops(lstm_isa::Isa isa, const char* name, const char* exp_tanh) {
    return {isa, name, L, V::kTileRows, exp_tanh, cell, cell_backward, tile_rows<>, pack_panels, pack_columns,
            apply<V::exp>, apply<V::tanh>};
  }
};

}  // namespace
