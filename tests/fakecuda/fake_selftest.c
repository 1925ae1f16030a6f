/* Misuses the fakes on purpose (see README.md): each misuse must be refused with the
 * status the real library gives, a correct GEMM must compute its product, and the
 * reports at exit must count what was left behind (one allocation, one open group).
 * Prints "selftest: N checks passed" and exits 0, or names the first check that failed
 * and exits 1. Linked against the three fakes by tests/it/cuda_libs.rs. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "fake_common.h"

typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, void *);
int cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, void *);
int cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, void *);
int cuStreamSynchronize(void *);
int cublasCreate_v2(void **);
int cublasDestroy_v2(void *);
int cublasGemmEx(void *, int, int, int, int, int, const void *, const void *, int, int,
                 const void *, int, int, const void *, void *, int, int, int, int);
int ncclGetUniqueId(void *);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclSend(const void *, size_t, int, int, void *, void *);

static int passed;
#define CHECK(what, cond) do { \
    if (!(cond)) { printf("selftest: FAILED: %s\n", what); return 1; } \
    passed++; } while (0)

int main(void) {
    void *ctx = NULL, *blas = NULL;
    CUdeviceptr a, b, c, left;
    CHECK("cuInit", cuInit(0) == 0);
    CHECK("an allocation needs a current context", cuMemAlloc_v2(&a, 64) == 201);
    CHECK("context", cuDevicePrimaryCtxRetain(&ctx, 0) == 0 && cuCtxSetCurrent(ctx) == 0);
    CHECK("allocations", cuMemAlloc_v2(&a, 2 * 2 * 3) == 0 && cuMemAlloc_v2(&b, 2 * 3 * 2) == 0 &&
                         cuMemAlloc_v2(&c, 2 * 2 * 2) == 0 && cuMemAlloc_v2(&left, 16) == 0);
    CHECK("a copy past its allocation", cuMemcpyDtoDAsync_v2(a, b, 13, NULL) == 1);
    CHECK("a copy from nowhere", cuMemcpyDtoDAsync_v2(a, 8, 4, NULL) == 1);
    /* Column-major A 2x3 and B 3x2 in BF16: A = [1 2 3; 4 5 6], B = [1 0; 0 1; 1 1]. */
    float av[6] = { 1, 4, 2, 5, 3, 6 }, bv[6] = { 1, 0, 1, 0, 1, 1 };
    uint16_t ah[6], bh[6], ch[4];
    for (int i = 0; i < 6; i++) { ah[i] = fake_f32_to_bf16(av[i]); bh[i] = fake_f32_to_bf16(bv[i]); }
    CHECK("filling A and B", cuMemcpyHtoDAsync_v2(a, ah, sizeof ah, NULL) == 0 &&
                             cuMemcpyHtoDAsync_v2(b, bh, sizeof bh, NULL) == 0);
    CHECK("cuBLAS handle", cublasCreate_v2(&blas) == 0);
    float one = 1.0f, zero = 0.0f;
    enum { BF16 = 14, F32 = 68 };
    CHECK("lda below A's rows", cublasGemmEx(blas, 0, 0, 2, 2, 3, &one, (void *)a, BF16, 1, (void *)b, BF16, 3, &zero, (void *)c, BF16, 2, F32, 0) == 7);
    CHECK("B's extent past its allocation", cublasGemmEx(blas, 0, 0, 2, 2, 3, &one, (void *)a, BF16, 2, (void *)b, BF16, 4, &zero, (void *)c, BF16, 2, F32, 0) == 7);
    CHECK("FP16 is not what the backend calls", cublasGemmEx(blas, 0, 0, 2, 2, 3, &one, (void *)a, 2, 2, (void *)b, 2, 3, &zero, (void *)c, 2, 2, F32, 0) == 15);
    CHECK("a correct GEMM", cublasGemmEx(blas, 0, 0, 2, 2, 3, &one, (void *)a, BF16, 2, (void *)b, BF16, 3, &zero, (void *)c, BF16, 2, F32, 0) == 0);
    CHECK("reading C", cuMemcpyDtoHAsync_v2(ch, c, sizeof ch, NULL) == 0);
    /* C = A B = [4 5; 10 11], column-major. */
    float want[4] = { 4, 10, 5, 11 };
    for (int i = 0; i < 4; i++) CHECK("C's value", fake_bf16_to_f32(ch[i]) == want[i]);
    CHECK("destroying the handle", cublasDestroy_v2(blas) == 0);
    CHECK("ncclGroupEnd without a start", ncclGroupEnd() == 5);
    char id[128];
    CHECK("unique id", ncclGetUniqueId(id) == 0);
    CHECK("a send to a communicator that is none", ncclSend((void *)a, 1, 9, 0, (void *)&passed, NULL) == 4);
    CHECK("frees", cuMemFree_v2(a) == 0 && cuMemFree_v2(b) == 0 && cuMemFree_v2(c) == 0);
    CHECK("a second free", cuMemFree_v2(a) == 1);
    CHECK("synchronising", cuStreamSynchronize(NULL) == 0);
    /* Left behind on purpose: `left` and an open group. */
    CHECK("a group left open", ncclGroupStart() == 0);
    printf("selftest: %d checks passed\n", passed);
    return 0;
}
