// MKL's CBLAS packed GEMM, its Fortran sgemm and its thread count, as libtorch_cpu exports them (no MKL headers ship
// with torch), and the CBLAS enum values they take. Shared by lstm_kernel.cc and gemm_choice.cc.
#pragma once

#include <cstddef>

extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
int MKL_Set_Num_Threads_Local(int threads);
}

namespace mkl_exports {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;

}  // namespace mkl_exports
