// The scalar gate math, for CPUs without AVX2 (or where LSTM_KERNEL_ISA=portable asks for it): the C library's exp and
// tanh, no register tiles (lstm_kernel.cc then runs each step's product as OpenBLAS's sgemm).
#include <cmath>
#include <cstdint>

#include "lstm_isa.h"

namespace {

using lstm_isa::StepOut;

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

void cell(int64_t n, int64_t stride, int64_t hidden, const float* pre, const float* gx, StepOut out) {
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

void cell_backward(int64_t n, int64_t hidden, const float* a, const float* c_prev, const float* c, const float* dh,
                   float* dc, float* dz) {
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

void exp_all(const float* in, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = std::exp(in[j]);
}

void tanh_all(const float* in, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = std::tanh(in[j]);
}

}  // namespace

const lstm_isa::StepOps& lstm_isa::portable_ops() {
  // 16 lanes: the blocks the units are dealt to threads in, as on AVX-512 (no register holds them here).
  static const StepOps ops = {kPortable, "portable", 16, 0, "the C library's expf and tanhf, scalar", cell,
                              cell_backward, nullptr, nullptr, nullptr, exp_all, tanh_all};
  return ops;
}
