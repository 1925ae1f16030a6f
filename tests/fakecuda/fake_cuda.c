/* A fake CUDA driver (libcuda.so.1) over host memory, for tests on machines
 * without a GPU: see README.md. It checks the arguments the backend passes and
 * keeps CUDA's ordering rules; it runs nothing on a GPU and measures nothing.
 *
 * - One device, CUDA 13.0, SEXTANT_FAKE_DEVICE_BYTES of memory (default 1 GiB).
 * - Allocations are host memory in a range table: every copy and every operand the
 *   fake cuBLAS and NCCL touch must lie inside one live allocation. New memory is
 *   filled with NaN bytes (0xff), so reading what nobody wrote shows.
 * - Streams are queues run in order by one worker thread each; events, host
 *   functions, copies, frees and the other fakes' work are items in them.
 * - The clock is a model, not a measurement: each item takes an arbitrary fixed
 *   cost (below) on its stream's own timeline, starting no earlier than the host
 *   queued it, so an idle stream waiting for the host shows the host's gap. Queuing
 *   work costs the host 4 us (a busy wait), more than a small item's 2 us on the
 *   device, as with real launches: a stream fed one launch at a time shows gaps.
 * - The default memory pool keeps freed memory until a synchronisation finds more
 *   reserved than its release threshold (0 by default, as CUDA's); it counts how
 *   often it had to grow.
 * - Faults: SEXTANT_FAKE_OOM_AT=n makes the n-th allocation fail with
 *   CUDA_ERROR_OUT_OF_MEMORY.
 * - At exit (or when the context is released) it prints one report line: memory
 *   never freed, streams and events never destroyed, argument errors. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <time.h>
#include "fake_common.h"

SEXTANT_FAKE("libcuda.so.1")

#define WHO "sextant fake libcuda.so.1"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_READY = 600, NOT_SUPPORTED = 801
};

/* The fake clock's costs (arbitrary, for plausible positive times only). */
#define LAUNCH_NS 2000.0      /* every queued operation */
#define HOST_LAUNCH_NS 4000.0 /* what queuing work costs the host (a busy wait) */
#define HBM_BYTES_PER_S 2e12  /* device-to-device copies and memsets */
#define PCIE_BYTES_PER_S 2.5e10
/* The driver's launch queue: the host blocks when a stream holds this many items. */
#define QUEUE_DEPTH 1024
/* Memory the context itself takes, as a real one does. */
#define CONTEXT_BYTES (64ull << 20)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

static int initialised;
static unsigned long long device_bytes;
static int ctx_refs;
static struct { uint32_t magic; } the_ctx = { 0xC0C0C0C0u };
static __thread void *current_ctx;

/* Counters for the report (one line per context lifetime, and at exit if the
 * context is still held then). */
static unsigned long argument_errors, injected_faults, allocations, pool_grows, queue_stalls;
static int reported;

static void report_locked(const char *when);

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void violation(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, WHO ": argument error: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    argument_errors++;
}

/* ---- allocations --------------------------------------------------------- */

typedef struct {
    char *base;
    size_t size;
    unsigned long nth; /* 1-based allocation number */
    int pooled;        /* from the memory pool (cuMemAllocAsync) */
    int freeing;       /* a stream-ordered free is queued */
} alloc_t;

static alloc_t *allocs;
static size_t nallocs, cap_allocs;
static unsigned long long sync_used; /* cuMemAlloc bytes */

static struct {
    uint32_t magic;
    unsigned long long threshold, reserved, reserved_high, used, used_high;
} pool = { 0xB001B001u, 0, 0, 0, 0, 0 };

static unsigned long long free_bytes_locked(void) {
    unsigned long long taken = (ctx_refs ? CONTEXT_BYTES : 0) + sync_used + pool.reserved;
    return taken >= device_bytes ? 0 : device_bytes - taken;
}

static alloc_t *find_alloc(CUdeviceptr p) {
    for (size_t i = 0; i < nallocs; i++) {
        CUdeviceptr b = (CUdeviceptr)(uintptr_t)allocs[i].base;
        if (p >= b && p < b + allocs[i].size) return &allocs[i];
    }
    return NULL;
}

/* Whether [p, p + bytes) lies in one live allocation; says why not. */
static int extent_locked(CUdeviceptr p, unsigned long long bytes, const char *who, const char *operand) {
    if (bytes == 0) return 0;
    alloc_t *a = find_alloc(p);
    if (!a) {
        violation("%s: %s: %llu bytes at 0x%llx are in no live allocation", who, operand, bytes, p);
        return -1;
    }
    CUdeviceptr b = (CUdeviceptr)(uintptr_t)a->base;
    if (a->freeing) {
        violation("%s: %s: 0x%llx is in allocation #%lu, whose free is already queued", who, operand, p, a->nth);
        return -1;
    }
    if (bytes > a->size - (p - b)) {
        violation("%s: %s: %llu bytes at offset %llu run past allocation #%lu of %zu bytes by %llu",
                  who, operand, bytes, p - b, a->nth, a->size, bytes - (a->size - (p - b)));
        return -1;
    }
    return 0;
}

int sextant_fake_extent(unsigned long long p, unsigned long long bytes, const char *who, const char *operand) {
    pthread_mutex_lock(&mu);
    int r = extent_locked(p, bytes, who, operand);
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult new_alloc_locked(CUdeviceptr *out, size_t bytes, int pooled) {
    if (!out || bytes == 0) return INVALID_VALUE;
    unsigned long nth = ++allocations;
    unsigned long oom_at = fake_env_count("SEXTANT_FAKE_OOM_AT");
    if (oom_at && nth == oom_at) {
        injected_faults++;
        return OUT_OF_MEMORY;
    }
    unsigned long long grow = 0;
    if (pooled && pool.used + bytes > pool.reserved) grow = pool.used + bytes - pool.reserved;
    if ((pooled ? grow : bytes) > free_bytes_locked()) return OUT_OF_MEMORY;
    /* 256-byte aligned, as cuMemAlloc's allocations are (cuBLAS checks its
     * workspace's alignment). */
    void *mem = NULL;
    if (posix_memalign(&mem, 256, bytes) != 0) return OUT_OF_MEMORY;
    char *m = mem;
    memset(m, 0xff, bytes);
    if (nallocs == cap_allocs) {
        size_t c = cap_allocs ? 2 * cap_allocs : 64;
        alloc_t *n = realloc(allocs, c * sizeof *n);
        if (!n) { free(m); return OUT_OF_MEMORY; }
        allocs = n;
        cap_allocs = c;
    }
    allocs[nallocs++] = (alloc_t){ m, bytes, nth, pooled, 0 };
    if (pooled) {
        if (grow) { pool.reserved += grow; pool_grows++; }
        pool.used += bytes;
        if (pool.used > pool.used_high) pool.used_high = pool.used;
        if (pool.reserved > pool.reserved_high) pool.reserved_high = pool.reserved;
    } else {
        sync_used += bytes;
    }
    *out = (CUdeviceptr)(uintptr_t)m;
    return OK;
}

static void drop_alloc_locked(alloc_t *a) {
    if (!a->pooled) sync_used -= a->size;
    else if (!a->freeing) pool.used -= a->size;
    free(a->base);
    *a = allocs[--nallocs];
}

/* A synchronisation: the pool gives back what it holds beyond its threshold. */
static void trim_locked(void) {
    unsigned long long keep = pool.used > pool.threshold ? pool.used : pool.threshold;
    if (pool.reserved > keep) pool.reserved = keep;
}

/* ---- streams and events --------------------------------------------------- */

enum { ITEM_WORK, ITEM_HOST, ITEM_RECORD, ITEM_WAIT, ITEM_FREE };

typedef struct event event_t;
typedef struct item {
    int kind;
    void (*fn)(void *);
    void *arg;
    event_t *ev;
    unsigned long gen;
    CUdeviceptr ptr;
    double arrival_ns, cost_ns;
    struct item *next;
} item_t;

typedef struct stream {
    uint32_t magic;
    item_t *head, *tail;
    unsigned long issued, done;
    double clock_ns; /* when its last item ended, on the fake clock */
    int quit, in_host_fn, started;
    pthread_t thread;
    struct stream *next;
} stream_t;

struct event {
    uint32_t magic;
    unsigned flags;
    unsigned long recorded, completed; /* generations */
    unsigned long refs;                /* queued items that name it */
    int destroyed;
    double at_ns;
    event_t *next;
};

#define STREAM_MAGIC 0x57AEA111u
#define EVENT_MAGIC 0xE7E7E7E7u
#define EVENT_DISABLE_TIMING 2u

static stream_t *streams; /* live ones */
static stream_t default_stream = { .magic = STREAM_MAGIC };
static event_t *events;   /* live ones */
static unsigned long live_streams, live_events;

static void release_event_locked(event_t *e) {
    if (e->destroyed && e->refs == 0) {
        e->magic = 0;
        free(e);
    }
}

static void *worker(void *p) {
    stream_t *s = p;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!s->head && !s->quit) pthread_cond_wait(&changed, &mu);
        if (!s->head) break;
        item_t *it = s->head;
        double start = s->clock_ns > it->arrival_ns ? s->clock_ns : it->arrival_ns;
        double end = start;
        switch (it->kind) {
        case ITEM_WAIT:
            while (it->ev->completed < it->gen) pthread_cond_wait(&changed, &mu);
            if (it->ev->at_ns > start) start = it->ev->at_ns;
            end = start;
            it->ev->refs--;
            release_event_locked(it->ev);
            break;
        case ITEM_RECORD:
            it->ev->at_ns = start;
            if (it->ev->completed < it->gen) it->ev->completed = it->gen;
            it->ev->refs--;
            release_event_locked(it->ev);
            break;
        case ITEM_FREE: {
            alloc_t *a = find_alloc(it->ptr);
            if (a) drop_alloc_locked(a);
            end = start + LAUNCH_NS;
            break;
        }
        case ITEM_WORK:
        case ITEM_HOST:
            s->in_host_fn = it->kind == ITEM_HOST;
            pthread_mutex_unlock(&mu);
            it->fn(it->arg);
            pthread_mutex_lock(&mu);
            s->in_host_fn = 0;
            end = start + it->cost_ns;
            if (it->kind == ITEM_HOST) {
                double t = now_ns();
                if (t > end) end = t;
            }
            break;
        }
        s->clock_ns = end;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->done++;
        free(it);
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static int stream_live_locked(stream_t *s) {
    if (!s) return 1;
    for (stream_t *x = streams; x; x = x->next)
        if (x == s) return 1;
    return 0;
}

static stream_t *resolve_locked(void *h) {
    stream_t *s = h ? (stream_t *)h : &default_stream;
    if (!s->started) {
        if (pthread_create(&s->thread, NULL, worker, s) != 0) return NULL;
        s->started = 1;
    }
    return s;
}

int sextant_fake_stream_ok(void *h) {
    pthread_mutex_lock(&mu);
    int ok = stream_live_locked(h);
    pthread_mutex_unlock(&mu);
    return ok;
}

int sextant_fake_context_current(void) {
    pthread_mutex_lock(&mu);
    int ok = current_ctx == &the_ctx && ctx_refs > 0;
    pthread_mutex_unlock(&mu);
    return ok;
}

/* The calling thread must have the context current, as CUDA requires. */
static CUresult need_ctx_locked(void) {
    if (!initialised) return NOT_INITIALIZED;
    return (current_ctx == &the_ctx && ctx_refs > 0) ? OK : INVALID_CONTEXT;
}

/* Queues an item; the host blocks while the stream's queue is full, as with a real
 * driver (and that behind a running host function is counted: it is a gate held
 * too long). Returns the item's sequence number on its stream. */
static CUresult enqueue_locked(void *h, item_t proto, unsigned long *seq) {
    if (proto.kind == ITEM_WORK) {
        /* A launch costs the host time, as a real driver's does. */
        pthread_mutex_unlock(&mu);
        double until = now_ns() + HOST_LAUNCH_NS;
        while (now_ns() < until) {}
        pthread_mutex_lock(&mu);
    }
    CUresult r = need_ctx_locked();
    if (r) return r;
    if (!stream_live_locked(h)) return INVALID_HANDLE;
    stream_t *s = resolve_locked(h);
    if (!s) return NOT_SUPPORTED;
    if (s->issued - s->done >= QUEUE_DEPTH) {
        if (s->in_host_fn) queue_stalls++;
        while (s->issued - s->done >= QUEUE_DEPTH) pthread_cond_wait(&changed, &mu);
    }
    item_t *it = malloc(sizeof *it);
    if (!it) return OUT_OF_MEMORY;
    *it = proto;
    it->arrival_ns = now_ns();
    it->next = NULL;
    if (it->ev) it->ev->refs++;
    if (s->tail) s->tail->next = it; else s->head = it;
    s->tail = it;
    s->issued++;
    if (seq) *seq = s->issued;
    pthread_cond_broadcast(&changed);
    return OK;
}

int sextant_fake_launch(void *h, void (*fn)(void *), void *arg, double secs) {
    pthread_mutex_lock(&mu);
    item_t it = { ITEM_WORK, fn, arg, NULL, 0, 0, 0, LAUNCH_NS + secs * 1e9, NULL };
    CUresult r = enqueue_locked(h, it, NULL);
    pthread_mutex_unlock(&mu);
    return r;
}

/* Waits until item `seq` of stream `h` has run. */
static void wait_seq_locked(void *h, unsigned long seq) {
    stream_t *s = h ? (stream_t *)h : &default_stream;
    while (s->done < seq) pthread_cond_wait(&changed, &mu);
}

static void drain_locked(stream_t *s) {
    unsigned long target = s->issued;
    while (s->done < target) pthread_cond_wait(&changed, &mu);
}

/* ---- initialisation, device, context --------------------------------------- */

CUresult cuInit(unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (!initialised) {
        unsigned long long b = fake_env_count("SEXTANT_FAKE_DEVICE_BYTES");
        device_bytes = b ? b : (1ull << 30);
        initialised = 1;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}
CUresult cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!n) return INVALID_VALUE; if (!initialised) return NOT_INITIALIZED; *n = 1; return OK; }
CUresult cuDeviceGet(int *dev, int ordinal) {
    if (!dev) return INVALID_VALUE;
    if (!initialised) return NOT_INITIALIZED;
    if (ordinal != 0) return INVALID_DEVICE;
    *dev = 0;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
    const char *n = "sextant fake GPU (tests only)";
    if (!name || len <= (int)strlen(n)) return INVALID_VALUE;
    if (dev != 0) return INVALID_DEVICE;
    strcpy(name, n);
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev) {
    if (!bytes) return INVALID_VALUE;
    if (!initialised) return NOT_INITIALIZED;
    if (dev != 0) return INVALID_DEVICE;
    *bytes = (size_t)device_bytes;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    if (!v) return INVALID_VALUE;
    if (dev != 0) return INVALID_DEVICE;
    switch (attr) {
    case 16: *v = 4; break;   /* MULTIPROCESSOR_COUNT */
    case 75: *v = 9; break;   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = 0; break;   /* COMPUTE_CAPABILITY_MINOR */
    case 115: *v = 1; break;  /* MEMORY_POOLS_SUPPORTED */
    default: *v = 0;
    }
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (!ctx) return INVALID_VALUE;
    if (!initialised) return NOT_INITIALIZED;
    if (dev != 0) return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (ctx_refs++ == 0) reported = 0; /* a new context lifetime, with its own report */
    pthread_mutex_unlock(&mu);
    *ctx = &the_ctx;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
    if (dev != 0) return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (ctx_refs == 0) { pthread_mutex_unlock(&mu); return INVALID_CONTEXT; }
    if (--ctx_refs == 0) {
        /* The context goes, and with it everything it held: say what was left. */
        drain_locked(&default_stream);
        for (stream_t *s = streams; s; s = s->next) drain_locked(s);
        report_locked("when the context was released");
        while (nallocs) drop_alloc_locked(&allocs[nallocs - 1]);
        pool.reserved = 0;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}
CUresult cuCtxGetCurrent(void **ctx) {
    if (!ctx) return INVALID_VALUE;
    if (!initialised) return NOT_INITIALIZED;
    *ctx = current_ctx;
    return OK;
}
CUresult cuCtxSetCurrent(void *ctx) {
    if (!initialised) return NOT_INITIALIZED;
    if (ctx && (ctx != &the_ctx || ctx_refs == 0)) return INVALID_CONTEXT;
    current_ctx = ctx;
    return OK;
}
CUresult cuCtxSynchronize(void) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r) {
        drain_locked(&default_stream);
        for (stream_t *s = streams; s; s = s->next) drain_locked(s);
        trim_locked();
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- memory ---------------------------------------------------------------- */

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    if (!free_b || !total) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r) {
        *free_b = (size_t)free_bytes_locked();
        *total = (size_t)device_bytes;
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r) r = new_alloc_locked(p, bytes, 0);
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r) {
        alloc_t *a = find_alloc(p);
        if (!a || (CUdeviceptr)(uintptr_t)a->base != p || a->pooled || a->freeing) {
            violation("cuMemFree_v2: 0x%llx is not the start of a live cuMemAlloc allocation", p);
            r = INVALID_VALUE;
        } else {
            /* Synchronous: waits for all queued work, as CUDA's does. */
            drain_locked(&default_stream);
            for (stream_t *s = streams; s; s = s->next) drain_locked(s);
            drop_alloc_locked(find_alloc(p));
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t bytes, void *stream) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r && !stream_live_locked(stream)) r = INVALID_HANDLE;
    if (!r) r = new_alloc_locked(p, bytes, 1);
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemFreeAsync(CUdeviceptr p, void *stream) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    alloc_t *a = r ? NULL : find_alloc(p);
    if (!r && (!a || (CUdeviceptr)(uintptr_t)a->base != p || a->freeing)) {
        violation("cuMemFreeAsync: 0x%llx is not the start of a live allocation", p);
        r = INVALID_VALUE;
    }
    if (!r) {
        item_t it = { ITEM_FREE, NULL, NULL, NULL, 0, p, 0, 0, NULL };
        r = enqueue_locked(stream, it, NULL);
        if (!r) {
            a->freeing = 1;
            /* Stream-ordered reuse: later allocations on the stream may take it now. */
            if (a->pooled) pool.used -= a->size;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

CUresult cuDeviceGetDefaultMemPool(void **p, int dev) {
    if (!p) return INVALID_VALUE;
    if (dev != 0) return INVALID_DEVICE;
    *p = &pool;
    return OK;
}
CUresult cuDeviceGetMemPool(void **p, int dev) { return cuDeviceGetDefaultMemPool(p, dev); }
CUresult cuMemPoolSetAttribute(void *p, int attr, void *value) {
    if (p != &pool || !value) return p != &pool ? INVALID_HANDLE : INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = OK;
    unsigned long long v;
    switch (attr) {
    case 1: case 2: case 3: break; /* reuse policies: taken as given */
    case 4: memcpy(&v, value, sizeof v); pool.threshold = v; break;
    case 6: case 8:
        memcpy(&v, value, sizeof v);
        if (v != 0) { r = INVALID_VALUE; break; } /* only a reset to 0 is allowed */
        if (attr == 6) pool.reserved_high = pool.reserved; else pool.used_high = pool.used;
        break;
    default: r = INVALID_VALUE;
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemPoolGetAttribute(void *p, int attr, void *value) {
    if (p != &pool || !value) return p != &pool ? INVALID_HANDLE : INVALID_VALUE;
    pthread_mutex_lock(&mu);
    unsigned long long v = 0;
    int one = 1;
    CUresult r = OK;
    switch (attr) {
    case 1: case 2: case 3: memcpy(value, &one, sizeof one); break;
    case 4: v = pool.threshold; break;
    case 5: v = pool.reserved; break;
    case 6: v = pool.reserved_high; break;
    case 7: v = pool.used; break;
    case 8: v = pool.used_high; break;
    default: r = INVALID_VALUE;
    }
    if (!r && attr >= 4) memcpy(value, &v, sizeof v);
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemPoolTrimTo(void *p, size_t keep) {
    if (p != &pool) return INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    unsigned long long k = keep > pool.used ? keep : pool.used;
    if (pool.reserved > k) pool.reserved = k;
    pthread_mutex_unlock(&mu);
    return OK;
}

/* ---- copies ---------------------------------------------------------------- */

typedef struct { void *dst; const void *src; size_t n; int value; int is_set; void *owned; } copy_t;

static void run_copy(void *p) {
    copy_t *c = p;
    if (c->is_set) memset(c->dst, c->value, c->n);
    else memmove(c->dst, c->src, c->n);
    free(c->owned);
    free(c);
}

/* Queues a copy (or memset); `owned` is freed after it ran. */
static CUresult queue_copy_locked(void *stream, copy_t c, double bytes_per_s, unsigned long *seq) {
    copy_t *h = malloc(sizeof *h);
    if (!h) { free(c.owned); return OUT_OF_MEMORY; }
    *h = c;
    item_t it = { ITEM_WORK, run_copy, h, NULL, 0, 0, 0, LAUNCH_NS + (double)c.n / bytes_per_s * 1e9, NULL };
    CUresult r = enqueue_locked(stream, it, seq);
    if (r) { free(h->owned); free(h); }
    return r;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r && !src && n) r = INVALID_VALUE;
    if (!r && extent_locked(dst, n, "cuMemcpyHtoDAsync_v2", "destination")) r = INVALID_VALUE;
    if (!r && n) {
        /* Pageable host memory: CUDA stages it before returning, so the caller may
         * reuse its buffer at once; the fake takes a copy. */
        void *stage = malloc(n);
        if (!stage) r = OUT_OF_MEMORY;
        else {
            memcpy(stage, src, n);
            r = queue_copy_locked(stream, (copy_t){ (void *)(uintptr_t)dst, stage, n, 0, 0, stage }, PCIE_BYTES_PER_S, NULL);
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    CUresult r = cuMemcpyHtoDAsync_v2(dst, src, n, NULL);
    if (!r) {
        pthread_mutex_lock(&mu);
        drain_locked(&default_stream);
        pthread_mutex_unlock(&mu);
    }
    return r;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r && !dst && n) r = INVALID_VALUE;
    if (!r && extent_locked(src, n, "cuMemcpyDtoHAsync_v2", "source")) r = INVALID_VALUE;
    unsigned long seq = 0;
    if (!r && n) r = queue_copy_locked(stream, (copy_t){ dst, (void *)(uintptr_t)src, n, 0, 0, NULL }, PCIE_BYTES_PER_S, &seq);
    /* Into pageable memory the copy is complete when the call returns. */
    if (!r && n) wait_seq_locked(stream, seq);
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return cuMemcpyDtoHAsync_v2(dst, src, n, NULL); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r && extent_locked(dst, n, "cuMemcpyDtoDAsync_v2", "destination")) r = INVALID_VALUE;
    if (!r && extent_locked(src, n, "cuMemcpyDtoDAsync_v2", "source")) r = INVALID_VALUE;
    if (!r && n) r = queue_copy_locked(stream, (copy_t){ (void *)(uintptr_t)dst, (void *)(uintptr_t)src, n, 0, 0, NULL }, HBM_BYTES_PER_S / 2, NULL);
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *stream) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r && extent_locked(dst, n, "cuMemsetD8Async", "destination")) r = INVALID_VALUE;
    if (!r && n) r = queue_copy_locked(stream, (copy_t){ (void *)(uintptr_t)dst, NULL, n, v, 1, NULL }, HBM_BYTES_PER_S, NULL);
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- streams ----------------------------------------------------------------- */

CUresult cuStreamCreate(void **out, unsigned flags) {
    (void)flags;
    if (!out) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    stream_t *s = r ? NULL : calloc(1, sizeof *s);
    if (!r && !s) r = OUT_OF_MEMORY;
    if (!r) {
        s->magic = STREAM_MAGIC;
        if (pthread_create(&s->thread, NULL, worker, s) != 0) { free(s); r = NOT_SUPPORTED; }
    }
    if (!r) {
        s->started = 1;
        s->next = streams;
        streams = s;
        live_streams++;
        *out = s;
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuStreamDestroy_v2(void *h) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r && (!h || !stream_live_locked(h))) r = INVALID_HANDLE;
    if (r) { pthread_mutex_unlock(&mu); return r; }
    stream_t *s = h;
    for (stream_t **x = &streams; *x; x = &(*x)->next)
        if (*x == s) { *x = s->next; break; }
    live_streams--;
    /* Work already queued still runs, as with CUDA; then the worker ends. */
    s->quit = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&mu);
    pthread_join(s->thread, NULL);
    s->magic = 0;
    free(s);
    return OK;
}
CUresult cuStreamSynchronize(void *h) {
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    if (!r && !stream_live_locked(h)) r = INVALID_HANDLE;
    if (!r) {
        stream_t *s = resolve_locked(h);
        if (s) drain_locked(s);
        trim_locked();
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuStreamWaitEvent(void *h, void *ev, unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    event_t *e = ev;
    int live = 0;
    for (event_t *x = events; x; x = x->next) live |= x == e;
    if (!r && !live) r = INVALID_HANDLE;
    if (!r && e->recorded) {
        item_t it = { ITEM_WAIT, NULL, NULL, e, e->recorded, 0, 0, 0, NULL };
        r = enqueue_locked(h, it, NULL);
    }
    pthread_mutex_unlock(&mu);
    return r;
}
/* A host function runs on the stream's worker, in order; its time on the fake
 * clock is the real time it took (a gate holds the stream that long). */
CUresult cuLaunchHostFunc(void *h, void (*fn)(void *), void *data) {
    if (!fn) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    item_t it = { ITEM_HOST, fn, data, NULL, 0, 0, 0, 0, NULL };
    CUresult r = enqueue_locked(h, it, NULL);
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- events ------------------------------------------------------------------- */

static event_t *live_event_locked(void *h) {
    for (event_t *x = events; x; x = x->next)
        if (x == h) return x;
    return NULL;
}

CUresult cuEventCreate(void **out, unsigned flags) {
    if (!out) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = need_ctx_locked();
    event_t *e = r ? NULL : calloc(1, sizeof *e);
    if (!r && !e) r = OUT_OF_MEMORY;
    if (!r) {
        e->magic = EVENT_MAGIC;
        e->flags = flags;
        e->next = events;
        events = e;
        live_events++;
        *out = e;
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuEventDestroy_v2(void *h) {
    pthread_mutex_lock(&mu);
    event_t *e = live_event_locked(h);
    if (!e) { pthread_mutex_unlock(&mu); return INVALID_HANDLE; }
    for (event_t **x = &events; *x; x = &(*x)->next)
        if (*x == e) { *x = e->next; break; }
    live_events--;
    /* As CUDA does, a destroyed event's queued uses still complete. */
    e->destroyed = 1;
    release_event_locked(e);
    pthread_mutex_unlock(&mu);
    return OK;
}
CUresult cuEventRecord(void *h, void *stream) {
    pthread_mutex_lock(&mu);
    event_t *e = live_event_locked(h);
    CUresult r = e ? OK : INVALID_HANDLE;
    if (!r) {
        item_t it = { ITEM_RECORD, NULL, NULL, e, e->recorded + 1, 0, 0, 0, NULL };
        r = enqueue_locked(stream, it, NULL);
        if (!r) e->recorded++;
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuEventQuery(void *h) {
    pthread_mutex_lock(&mu);
    event_t *e = live_event_locked(h);
    CUresult r = !e ? INVALID_HANDLE : e->completed < e->recorded ? NOT_READY : OK;
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuEventSynchronize(void *h) {
    pthread_mutex_lock(&mu);
    event_t *e = live_event_locked(h);
    CUresult r = e ? OK : INVALID_HANDLE;
    if (!r) {
        unsigned long gen = e->recorded;
        while (e->completed < gen) pthread_cond_wait(&changed, &mu);
        trim_locked();
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
    if (!ms) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    event_t *x = live_event_locked(a), *y = live_event_locked(b);
    CUresult r = OK;
    if (!x || !y || (x->flags & EVENT_DISABLE_TIMING) || (y->flags & EVENT_DISABLE_TIMING) ||
        !x->recorded || !y->recorded)
        r = INVALID_HANDLE;
    else if (x->completed < x->recorded || y->completed < y->recorded)
        r = NOT_READY;
    else
        *ms = (float)((y->at_ns - x->at_ns) / 1e6);
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { return cuEventElapsedTime_v2(ms, a, b); }

/* ---- errors ------------------------------------------------------------------- */

static const char *error_name(CUresult r) {
    switch (r) {
    case OK: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case NOT_READY: return "CUDA_ERROR_NOT_READY";
    case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return NULL;
    }
}
CUresult cuGetErrorName(CUresult r, const char **s) {
    if (!s) return INVALID_VALUE;
    *s = error_name(r);
    return *s ? OK : INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
    if (!s) return INVALID_VALUE;
    switch (r) {
    case OUT_OF_MEMORY: *s = "out of memory (" WHO ")"; break;
    case INVALID_VALUE: *s = "invalid argument (" WHO ")"; break;
    case INVALID_CONTEXT: *s = "no current context on this thread (" WHO ")"; break;
    default: *s = error_name(r) ? WHO " error" : NULL;
    }
    return *s ? OK : INVALID_VALUE;
}

/* ---- the report ------------------------------------------------------------------ */

static void report_locked(const char *when) {
    if (reported) return;
    reported = 1;
    unsigned long long bytes = 0;
    for (size_t i = 0; i < nallocs; i++) bytes += allocs[i].size;
    fprintf(stderr, WHO " report %s: %zu allocation(s) not freed (%llu bytes)", when, nallocs, bytes);
    for (size_t i = 0; i < nallocs && i < 4; i++)
        fprintf(stderr, "%s#%lu of %zu bytes", i ? ", " : ": ", allocs[i].nth, allocs[i].size);
    fprintf(stderr, "; %lu stream(s) and %lu event(s) not destroyed; %lu argument error(s); "
                    "%lu allocation(s), the pool grew %lu time(s), peak %llu bytes used, %llu reserved; "
                    "%lu stall(s) behind a host function; %lu injected fault(s)\n",
            live_streams, live_events, argument_errors, allocations, pool_grows, pool.used_high,
            pool.reserved_high, queue_stalls, injected_faults);
}

__attribute__((destructor)) static void at_exit_report(void) {
    if (!initialised) return;
    pthread_mutex_lock(&mu);
    report_locked("at exit");
    pthread_mutex_unlock(&mu);
}
