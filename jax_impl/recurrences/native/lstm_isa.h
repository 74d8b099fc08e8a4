// What lstm_kernel.cc needs from one vector instruction set: one LSTM step's gate math and the register tiles of
// the step's product, with the packing of the weights they read (lstm_step.h writes them once for any vector width;
// lstm_step_avx512.cc and lstm_step_avx2.cc compile them for AVX-512 and for AVX2 with FMA), or the scalar gate math
// (lstm_step_portable.cc, no tiles: the per-step product is then OpenBLAS's). The library picks one set when it loads
// (lstm_kernel_set_isa may change it), the widest the CPU runs.
#pragma once

#include <cstdint>

namespace lstm_isa {

enum Isa : int64_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// Where the forward's step writes one row: c in place and h (the carry, read again next step); the output y and,
// where kept for the backward (not null), the activated gates a (stride H) and a copy of c. Those three are not read
// again in the call, so the vector paths stream them past the cache.
struct StepOut {
  float *c, *h, *y, *a, *c_kept;
};

// One operand of a step's GEMM: rows of A (R, k; rows `lda` apart) and P (k, 4 L), one panel of a weight packed row
// after row (pack_panels, pack_columns). k may be 0: the operand adds nothing.
struct Operand {
  const float* a;
  int64_t lda, k;
  const float* p;
};

struct StepOps {
  Isa isa;
  const char* name;  // "avx512", "avx2", "portable"
  int lanes;  // float32 lanes of a register: units are dealt to threads in blocks of this many, a panel holds 4 L
  int tile_rows;  // rows of A per register tile; 0: no tiles (the portable path)
  const char* exp_tanh;  // whose exp and tanh the gate math calls, with their accuracy

  // Forward, one row: z = pre (the product's four gate blocks, `stride` apart) + gx (stride H) -> out, units [0, n).
  void (*cell)(int64_t n, int64_t stride, int64_t hidden, const float* pre, const float* gx, StepOut out);
  // Backward, one row: the step's gates a (stride H), c before and after it, dh (the step's total) and dc in place
  // (dc_t in, dc_{t-1} out) -> dz (stride H).
  void (*cell_backward)(int64_t n, int64_t hidden, const float* a, const float* c_prev, const float* c,
                        const float* dh, float* dc, float* dz);
  // C (rows, 4 L) = A1 P1 + A2 P2, rows <= tile_rows (null on the portable path).
  void (*tile)(int rows, Operand first, Operand second, float* c);
  // The rows of units [begin, begin + n) of a gate weight w (4H, k) in panels of L units: panel q holds, for each of
  // the k inputs, the 4 L floats w[g H + begin + L q + j][input] for g = i, f, g, o and j < L (0 past the range).
  void (*pack_panels)(const float* w, int64_t hidden, int64_t k, int64_t begin, int64_t n, float* panels);
  // The columns [begin, begin + n) of a (rows, width) matrix in panels of 4 L columns: panel q holds, for each row,
  // the 4 L floats w[row][begin + 4 L q + j] (0 past the range).
  void (*pack_columns)(const float* w, int64_t rows, int64_t width, int64_t begin, int64_t n, float* panels);
  // out[i] = exp(in[i]) or tanh(in[i]), i < n, by the functions the gate math calls (for the accuracy test).
  void (*exp)(const float* in, float* out, int64_t n);
  void (*tanh)(const float* in, float* out, int64_t n);
};

const StepOps& avx512_ops();
const StepOps& avx2_ops();
const StepOps& portable_ops();

}  // namespace lstm_isa
