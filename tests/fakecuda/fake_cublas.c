/* A fake cuBLAS 13 (libcublas.so.13) for tests without a GPU: see README.md.
 *
 * cublasGemmEx and cublasGemmStridedBatchedEx check their arguments as cuBLAS
 * documents them (sizes, leading dimensions, types) and, through the fake driver,
 * that every operand's extent (leading dimension x columns x element size, plus
 * stride x (batch - 1)) lies inside one live allocation; then they compute the
 * product on the host, on the handle's stream, in order. BF16 or FP32 operands,
 * FP32 accumulation. A product of more than 2^28 multiply-adds is refused: the
 * fake is for small test models. It measures nothing. At exit it prints one report
 * line: GEMMs run, argument errors, handles not destroyed. */
#define _GNU_SOURCE
#include <pthread.h>
#include "fake_common.h"

SEXTANT_FAKE("libcublas.so.13")

#define WHO "sextant fake libcublas.so.13"

enum {
    S_OK = 0, S_NOT_INITIALIZED = 1, S_ALLOC_FAILED = 3, S_INVALID_VALUE = 7,
    S_EXECUTION_FAILED = 13, S_NOT_SUPPORTED = 15
};
enum { OP_N = 0, OP_T = 1, OP_C = 2 };
enum { R_32F = 0, R_16BF = 14 };
/* cublasComputeType_t values taken as FP32 accumulation. */
static int compute_ok(int c) { return c == 68 || c == 69 || c == 74 || c == 75 || c == 77; }

#define MAX_MACS (1ull << 28)
#define FLOPS_PER_S 1e14 /* the fake clock's arbitrary GEMM rate */

typedef struct handle {
    uint32_t magic;
    void *stream;
    /* The user's workspace (cublasSetWorkspace), 0 for the library's own. */
    unsigned long long workspace, workspace_bytes;
    struct handle *next;
} handle_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static handle_t *handles;
static unsigned long live_handles, gemms, argument_errors, used;

static void violation(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, WHO ": argument error: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    pthread_mutex_lock(&mu);
    argument_errors++;
    pthread_mutex_unlock(&mu);
}

static handle_t *live(void *h) {
    handle_t *x;
    pthread_mutex_lock(&mu);
    for (x = handles; x && x != h; x = x->next) {}
    pthread_mutex_unlock(&mu);
    return x;
}

int cublasCreate_v2(void **out) {
    if (!out) return S_INVALID_VALUE;
    const fake_driver *d = fake_driver_get("libcublas.so.13");
    if (!d || !d->context_current()) return S_NOT_INITIALIZED;
    handle_t *h = calloc(1, sizeof *h);
    if (!h) return S_ALLOC_FAILED;
    h->magic = 0xB1A5B1A5u;
    pthread_mutex_lock(&mu);
    h->next = handles;
    handles = h;
    live_handles++;
    used = 1;
    pthread_mutex_unlock(&mu);
    *out = h;
    return S_OK;
}
int cublasDestroy_v2(void *h) {
    pthread_mutex_lock(&mu);
    handle_t **x;
    for (x = &handles; *x && *x != h; x = &(*x)->next) {}
    int found = *x != NULL;
    if (found) { *x = ((handle_t *)h)->next; live_handles--; }
    pthread_mutex_unlock(&mu);
    if (!found) return S_NOT_INITIALIZED;
    free(h);
    return S_OK;
}
int cublasSetStream_v2(void *h, void *stream) {
    handle_t *x = live(h);
    if (!x) return S_NOT_INITIALIZED;
    const fake_driver *d = fake_driver_get("libcublas.so.13");
    if (!d || !d->stream_ok(stream)) {
        violation("cublasSetStream_v2: %p is not a live stream", stream);
        return S_INVALID_VALUE;
    }
    x->stream = stream;
    /* As cuBLAS documents: setting the stream puts the default workspace back. */
    x->workspace = 0;
    x->workspace_bytes = 0;
    return S_OK;
}
/* cuBLAS requires a workspace aligned to 256 bytes; it must be device memory the
 * handle may use until it is destroyed or given another (re-checked at each GEMM). */
int cublasSetWorkspace_v2(void *h, void *workspace, size_t bytes) {
    handle_t *x = live(h);
    if (!x) return S_NOT_INITIALIZED;
    const fake_driver *d = fake_driver_get("libcublas.so.13");
    if (!d) return S_NOT_INITIALIZED;
    unsigned long long p = (unsigned long long)(uintptr_t)workspace;
    if (bytes > 0 && (p % 256 != 0)) {
        violation("cublasSetWorkspace_v2: workspace %p is not aligned to 256 bytes", workspace);
        return S_INVALID_VALUE;
    }
    if (bytes > 0 && d->extent(p, bytes, "cublasSetWorkspace_v2", "workspace")) return S_INVALID_VALUE;
    x->workspace = bytes > 0 ? p : 0;
    x->workspace_bytes = bytes;
    return S_OK;
}
int cublasGetStream_v2(void *h, void **stream) {
    handle_t *x = live(h);
    if (!x) return S_NOT_INITIALIZED;
    if (!stream) return S_INVALID_VALUE;
    *stream = x->stream;
    return S_OK;
}
int cublasGetVersion_v2(void *h, int *v) {
    if (!live(h)) return S_NOT_INITIALIZED;
    if (!v) return S_INVALID_VALUE;
    *v = 130000;
    return S_OK;
}

/* One (possibly batched) product, column-major as cuBLAS: C = alpha op(A) op(B) + beta C. */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, batch, at, bt, ct;
    long long sa, sb, sc;
    const char *a, *b;
    char *c;
    float alpha, beta;
} gemm_t;

static float load(const char *p, int type, long long i) {
    if (type == R_16BF) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return fake_bf16_to_f32(h);
    }
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}
static void store(char *p, int type, long long i, float v) {
    if (type == R_16BF) {
        uint16_t h = fake_f32_to_bf16(v);
        memcpy(p + 2 * i, &h, 2);
    } else {
        memcpy(p + 4 * i, &v, 4);
    }
}
static int esize(int type) { return type == R_16BF ? 2 : 4; }

/* Computes on the stream's worker: each product's operands are widened to FP32
 * once (row i of op(A), column j of op(B)), then summed in FP32. */
static void run_gemm(void *p) {
    gemm_t *g = p;
    float *x = malloc(sizeof(float) * (size_t)g->m * (size_t)(g->k ? g->k : 1));
    float *y = malloc(sizeof(float) * (size_t)g->n * (size_t)(g->k ? g->k : 1));
    if (!x || !y) {
        fprintf(stderr, WHO ": out of host memory for a %dx%dx%d product; its C is left as it was\n", g->m, g->n, g->k);
        free(x); free(y); free(g);
        return;
    }
    for (int q = 0; q < g->batch; q++) {
        const char *a = g->a + g->sa * q * esize(g->at);
        const char *b = g->b + g->sb * q * esize(g->bt);
        char *c = g->c + g->sc * q * esize(g->ct);
        for (int i = 0; i < g->m; i++)
            for (int l = 0; l < g->k; l++)
                x[(size_t)i * g->k + l] = load(a, g->at, g->ta == OP_N ? i + (long long)l * g->lda : l + (long long)i * g->lda);
        for (int j = 0; j < g->n; j++)
            for (int l = 0; l < g->k; l++)
                y[(size_t)j * g->k + l] = load(b, g->bt, g->tb == OP_N ? l + (long long)j * g->ldb : j + (long long)l * g->ldb);
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->m; i++) {
                const float *xr = x + (size_t)i * g->k, *yc = y + (size_t)j * g->k;
                float acc = 0.0f;
                for (int l = 0; l < g->k; l++) acc += xr[l] * yc[l];
                long long ci = i + (long long)j * g->ldc;
                float out = g->alpha * acc;
                if (g->beta != 0.0f) out += g->beta * load(c, g->ct, ci);
                store(c, g->ct, ci, out);
            }
    }
    free(x);
    free(y);
    free(g);
}

/* Bytes an operand of `rows` x `cols` (column-major, leading dimension ld) spans,
 * over `batch` matrices `stride` elements apart. */
static unsigned long long span(int rows, int cols, int ld, long long stride, int batch, int type) {
    unsigned long long one = (unsigned long long)(cols - 1) * (unsigned long long)ld + (unsigned long long)rows;
    return ((unsigned long long)(batch - 1) * (unsigned long long)stride + one) * (unsigned long long)esize(type);
}

static int gemm(const char *name, void *h, int ta, int tb, int m, int n, int k, const void *alpha,
                const void *A, int at, int lda, long long sa, const void *B, int bt, int ldb, long long sb,
                const void *beta, void *C, int ct, int ldc, long long sc, int batch, int compute) {
    handle_t *x = live(h);
    if (!x) return S_NOT_INITIALIZED;
    const fake_driver *d = fake_driver_get("libcublas.so.13");
    if (!d) return S_NOT_INITIALIZED;
    if (x->workspace_bytes && d->extent(x->workspace, x->workspace_bytes, name, "the handle's workspace (freed before the handle?)"))
        return S_INVALID_VALUE;
    int rows_a = ta == OP_N ? m : k, cols_a = ta == OP_N ? k : m;
    int rows_b = tb == OP_N ? k : n, cols_b = tb == OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || ta < OP_N || ta > OP_C || tb < OP_N || tb > OP_C ||
        lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1) ||
        sa < 0 || sb < 0 || sc < 0 || !alpha || !beta) {
        violation("%s: m %d n %d k %d, lda %d ldb %d ldc %d, strides %lld %lld %lld, batch %d are not valid "
                  "(ld must be at least the rows of its operand: %d, %d, %d)",
                  name, m, n, k, lda, ldb, ldc, sa, sb, sc, batch, rows_a, rows_b, m);
        return S_INVALID_VALUE;
    }
    if (!((at == R_16BF || at == R_32F) && bt == at && (ct == at || ct == R_32F) && compute_ok(compute))) {
        violation("%s: types A %d B %d C %d with compute type %d are not a BF16/FP32 GEMM with FP32 accumulation", name, at, bt, ct, compute);
        return S_NOT_SUPPORTED;
    }
    if (m == 0 || n == 0 || batch == 0) return S_OK;
    if (batch > 1 && sc < (long long)(n - 1) * ldc + m) {
        violation("%s: C's %d matrices overlap (stride %lld < %lld)", name, batch, sc, (long long)(n - 1) * ldc + m);
        return S_INVALID_VALUE;
    }
    if (k > 0) {
        if (d->extent((unsigned long long)(uintptr_t)A, span(rows_a, cols_a, lda, sa, batch, at), name, "A")) return S_INVALID_VALUE;
        if (d->extent((unsigned long long)(uintptr_t)B, span(rows_b, cols_b, ldb, sb, batch, bt), name, "B")) return S_INVALID_VALUE;
    }
    if (d->extent((unsigned long long)(uintptr_t)C, span(m, n, ldc, sc, batch, ct), name, "C")) return S_INVALID_VALUE;
    unsigned long long macs = (unsigned long long)m * n * (k ? k : 1) * batch;
    if (macs > MAX_MACS) {
        fprintf(stderr, WHO ": %s: %llu multiply-adds is more than the fake computes (%llu): it is for small test models\n", name, macs, MAX_MACS);
        return S_NOT_SUPPORTED;
    }
    gemm_t *g = malloc(sizeof *g);
    if (!g) return S_ALLOC_FAILED;
    *g = (gemm_t){ ta, tb, m, n, k, lda, ldb, ldc, batch, at, bt, ct, sa, sb, sc, A, B, C, 0.0f, 0.0f };
    /* Pointer mode host: alpha and beta are read now. */
    memcpy(&g->alpha, alpha, 4);
    memcpy(&g->beta, beta, 4);
    int r = d->launch(x->stream, run_gemm, g, 2.0 * (double)macs / FLOPS_PER_S);
    if (r) {
        free(g);
        return S_EXECUTION_FAILED;
    }
    pthread_mutex_lock(&mu);
    gemms++;
    pthread_mutex_unlock(&mu);
    return S_OK;
}

int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at,
                 int lda, const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc,
                 int compute, int algo) {
    (void)algo;
    return gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, compute);
}
int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha,
                               const void *A, int at, int lda, long long sa, const void *B, int bt,
                               int ldb, long long sb, const void *beta, void *C, int ct, int ldc,
                               long long sc, int batch, int compute, int algo) {
    (void)algo;
    return gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute);
}

__attribute__((destructor)) static void at_exit_report(void) {
    if (!used) return;
    fprintf(stderr, WHO " report at exit: %lu GEMM call(s) checked and computed; %lu argument error(s); %lu handle(s) not destroyed\n",
            gemms, argument_errors, live_handles);
}
