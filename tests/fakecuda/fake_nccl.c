/* A fake NCCL 2 (libnccl.so.2) of one rank, for tests without a GPU: see README.md.
 *
 * Communicators have one rank (a world of more is refused: the fake does not
 * connect processes). Collectives copy the send buffer to the receive buffer on
 * the given stream, after the fake driver checked both extents. Between
 * ncclGroupStart and ncclGroupEnd calls are deferred to the group's end, where
 * each send to this rank is paired with the receive from it issued in the same
 * order and size, as NCCL pairs them; an unpaired one is refused (NCCL would hang).
 * Group depth is tracked per thread: ncclGroupEnd without a start, destroying or
 * aborting a communicator inside an open group, and exiting with a group open are
 * argument errors. SEXTANT_FAKE_NCCL_FAIL_AT=n makes the n-th call issued inside a
 * group fail with ncclInternalError (the group then ends with that error too). At
 * exit it prints one report line. It measures nothing. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <unistd.h>
#include "fake_common.h"

SEXTANT_FAKE("libnccl.so.2")

#define WHO "sextant fake libnccl.so.2"

typedef int ncclResult_t;
enum { ok = 0, system_error = 2, internal = 3, invalid_argument = 4, invalid_usage = 5 };
typedef struct { char internal[128]; } ncclUniqueId;

#define ID_TAG "sextant fake nccl id"
#define NET_BYTES_PER_S 1e11 /* the fake clock's arbitrary rate for every collective */

typedef struct comm {
    uint32_t magic;
    int id;
    struct comm *next;
} comm_t;

/* A call deferred to the end of its group. */
typedef struct call {
    int kind; /* 0 collective, 1 send, 2 recv */
    const char *name;
    const void *src;
    void *dst;
    size_t bytes;
    comm_t *comm;
    void *stream;
    struct call *next;
} call_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static comm_t *comms;
static int next_comm_id = 1;
static unsigned long live_comms, calls, argument_errors, injected_faults, in_group_calls, open_groups;
static int used;
static char last_error[512] = "no error";

static __thread int depth;
static __thread int group_failed;
static __thread call_t *pending, *pending_tail;

static void violation(const char *fmt, ...) {
    va_list ap;
    char line[512];
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, WHO ": argument error: %s\n", line);
    pthread_mutex_lock(&mu);
    argument_errors++;
    snprintf(last_error, sizeof last_error, "%s", line);
    pthread_mutex_unlock(&mu);
}

static comm_t *live(void *c) {
    comm_t *x;
    pthread_mutex_lock(&mu);
    for (x = comms; x && x != c; x = x->next) {}
    pthread_mutex_unlock(&mu);
    return x;
}

static size_t type_size(int t) {
    switch (t) {
    case 0: case 1: return 1;          /* int8, uint8 */
    case 2: case 3: case 7: return 4;  /* int32, uint32, float32 */
    case 4: case 5: case 8: return 8;  /* int64, uint64, float64 */
    case 6: case 9: return 2;          /* float16, bfloat16 */
    default: return 0;
    }
}

ncclResult_t ncclGetVersion(int *v) { if (!v) return invalid_argument; *v = 22800; return ok; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return invalid_argument;
    memset(id->internal, 0, sizeof id->internal);
    snprintf(id->internal, sizeof id->internal, ID_TAG " of process %ld", (long)getpid());
    return ok;
}

static ncclResult_t new_comm(void **out) {
    comm_t *c = calloc(1, sizeof *c);
    if (!c) return system_error;
    c->magic = 0xC033C033u;
    pthread_mutex_lock(&mu);
    c->id = next_comm_id++;
    c->next = comms;
    comms = c;
    live_comms++;
    used = 1;
    pthread_mutex_unlock(&mu);
    *out = c;
    return ok;
}

ncclResult_t ncclCommInitRank(void **out, int n, ncclUniqueId id, int rank) {
    if (!out) return invalid_argument;
    const fake_driver *d = fake_driver_get("libnccl.so.2");
    if (!d) return system_error;
    if (!d->context_current()) {
        violation("ncclCommInitRank: no CUDA context is current on this thread");
        return invalid_usage;
    }
    if (strncmp(id.internal, ID_TAG, strlen(ID_TAG)) != 0) {
        violation("ncclCommInitRank: the unique id did not come from ncclGetUniqueId");
        return invalid_argument;
    }
    if (n != 1 || rank != 0) {
        pthread_mutex_lock(&mu);
        snprintf(last_error, sizeof last_error, WHO " runs one rank only (asked for rank %d of %d)", rank, n);
        pthread_mutex_unlock(&mu);
        return system_error;
    }
    return new_comm(out);
}

ncclResult_t ncclCommSplit(void *c, int color, int key, void **out, void *cfg) {
    (void)cfg;
    if (!live(c)) { violation("ncclCommSplit: %p is not a live communicator", c); return invalid_argument; }
    if (!out || key < 0) return invalid_argument;
    if (color == -1) { *out = NULL; return ok; } /* NCCL_SPLIT_NOCOLOR */
    if (color < 0) return invalid_argument;
    return new_comm(out);
}

static ncclResult_t end_comm(void *c, const char *name) {
    if (depth > 0) violation("%s inside an open group (ncclGroupEnd first)", name);
    pthread_mutex_lock(&mu);
    comm_t **x;
    for (x = &comms; *x && *x != c; x = &(*x)->next) {}
    int found = *x != NULL;
    if (found) { *x = ((comm_t *)c)->next; live_comms--; }
    pthread_mutex_unlock(&mu);
    if (!found) { violation("%s: %p is not a live communicator", name, c); return invalid_argument; }
    free(c);
    return ok;
}
ncclResult_t ncclCommDestroy(void *c) { return end_comm(c, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(void *c) { return end_comm(c, "ncclCommAbort"); }

typedef struct { void *dst; const void *src; size_t n; } copy_t;
static void run_copy(void *p) {
    copy_t *c = p;
    if (c->dst != c->src) memmove(c->dst, c->src, c->n);
    free(c);
}

static ncclResult_t launch(const call_t *c, const fake_driver *d) {
    copy_t *cp = malloc(sizeof *cp);
    if (!cp) return system_error;
    *cp = (copy_t){ c->dst, c->src, c->bytes };
    if (d->launch(c->stream, run_copy, cp, 5e-6 + (double)c->bytes / NET_BYTES_PER_S)) {
        free(cp);
        violation("%s: the copy could not be queued on stream %p", c->name, c->stream);
        return invalid_argument;
    }
    return ok;
}

/* Checks one call's arguments, then runs it (outside a group) or defers it. */
static ncclResult_t issue(call_t c, size_t send_bytes, size_t recv_bytes, int type, int peer) {
    const fake_driver *d = fake_driver_get("libnccl.so.2");
    if (!d) return system_error;
    pthread_mutex_lock(&mu);
    calls++;
    unsigned long nth = depth > 0 ? ++in_group_calls : 0;
    pthread_mutex_unlock(&mu);
    unsigned long fail_at = fake_env_count("SEXTANT_FAKE_NCCL_FAIL_AT");
    if (nth && nth == fail_at) {
        pthread_mutex_lock(&mu);
        injected_faults++;
        snprintf(last_error, sizeof last_error, WHO ": injected failure of in-group call %lu (SEXTANT_FAKE_NCCL_FAIL_AT)", nth);
        pthread_mutex_unlock(&mu);
        group_failed = 1;
        return internal;
    }
    if (!live(c.comm)) { violation("%s: %p is not a live communicator", c.name, (void *)c.comm); return invalid_argument; }
    if (!type_size(type)) { violation("%s: data type %d is not one NCCL has", c.name, type); return invalid_argument; }
    if (peer != 0) { violation("%s: peer %d is not in a communicator of 1 rank", c.name, peer); return invalid_argument; }
    if (!d->stream_ok(c.stream)) { violation("%s: %p is not a live stream", c.name, c.stream); return invalid_argument; }
    if (c.kind != 2 && d->extent((unsigned long long)(uintptr_t)c.src, send_bytes, c.name, "send buffer")) return invalid_argument;
    if (c.kind != 1 && d->extent((unsigned long long)(uintptr_t)c.dst, recv_bytes, c.name, "receive buffer")) return invalid_argument;
    if (depth == 0) {
        if (c.kind != 0) {
            violation("%s to this rank outside a group: NCCL would wait for its partner forever", c.name);
            return invalid_usage;
        }
        return launch(&c, d);
    }
    call_t *p = malloc(sizeof *p);
    if (!p) return system_error;
    *p = c;
    p->next = NULL;
    if (pending_tail) pending_tail->next = p; else pending = p;
    pending_tail = p;
    return ok;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
    if (op < 0 || op > 4) { violation("ncclAllReduce: reduction %d is not one NCCL has", op); return invalid_argument; }
    size_t b = n * type_size(t);
    return issue((call_t){ 0, "ncclAllReduce", s, r, b, c, st, NULL }, b, b, t, 0);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
    if (op < 0 || op > 4) { violation("ncclReduceScatter: reduction %d is not one NCCL has", op); return invalid_argument; }
    size_t b = n * type_size(t); /* one rank: the input is recvcount x 1 */
    return issue((call_t){ 0, "ncclReduceScatter", s, r, b, c, st, NULL }, b, b, t, 0);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int t, void *c, void *st) {
    size_t b = n * type_size(t);
    return issue((call_t){ 0, "ncclAllGather", s, r, b, c, st, NULL }, b, b, t, 0);
}
ncclResult_t ncclSend(const void *b, size_t n, int t, int peer, void *c, void *st) {
    size_t bytes = n * type_size(t);
    return issue((call_t){ 1, "ncclSend", b, NULL, bytes, c, st, NULL }, bytes, 0, t, peer);
}
ncclResult_t ncclRecv(void *b, size_t n, int t, int peer, void *c, void *st) {
    size_t bytes = n * type_size(t);
    return issue((call_t){ 2, "ncclRecv", NULL, b, bytes, c, st, NULL }, 0, bytes, t, peer);
}

ncclResult_t ncclGroupStart(void) {
    if (depth++ == 0) {
        pthread_mutex_lock(&mu);
        open_groups++;
        used = 1;
        pthread_mutex_unlock(&mu);
    }
    return ok;
}

/* Pairs each send with the next unpaired receive on the same communicator. */
static ncclResult_t run_group(const fake_driver *d) {
    for (call_t *c = pending; c; c = c->next) {
        if (c->kind == 0) {
            ncclResult_t r = launch(c, d);
            if (r) return r;
        } else if (c->kind == 1) {
            call_t *m = pending;
            for (; m; m = m->next)
                if (m->kind == 2 && m->comm == c->comm) break;
            if (!m) { violation("ncclGroupEnd: a send of %zu bytes has no matching receive (NCCL would hang)", c->bytes); return invalid_usage; }
            if (m->bytes != c->bytes) { violation("ncclGroupEnd: a send of %zu bytes meets a receive of %zu bytes", c->bytes, m->bytes); return invalid_usage; }
            m->kind = 3; /* paired */
            ncclResult_t r = launch(&(call_t){ 0, "ncclSend/ncclRecv", c->src, m->dst, c->bytes, c->comm, m->stream, NULL }, d);
            if (r) return r;
        }
    }
    for (call_t *c = pending; c; c = c->next)
        if (c->kind == 2) { violation("ncclGroupEnd: a receive of %zu bytes has no matching send (NCCL would hang)", c->bytes); return invalid_usage; }
    return ok;
}

ncclResult_t ncclGroupEnd(void) {
    if (depth == 0) {
        violation("ncclGroupEnd without ncclGroupStart");
        return invalid_usage;
    }
    if (--depth > 0) return ok;
    pthread_mutex_lock(&mu);
    open_groups--;
    pthread_mutex_unlock(&mu);
    ncclResult_t r = group_failed ? internal : ok;
    const fake_driver *d = fake_driver_get("libnccl.so.2");
    if (!r) r = d ? run_group(d) : system_error;
    while (pending) {
        call_t *n = pending->next;
        free(pending);
        pending = n;
    }
    pending_tail = NULL;
    group_failed = 0;
    return r;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ok: return "no error";
    case system_error: return "unhandled system error (" WHO ")";
    case internal: return "internal error (" WHO ")";
    case invalid_argument: return "invalid argument (" WHO ")";
    case invalid_usage: return "invalid usage (" WHO ")";
    default: return WHO " error";
    }
}
const char *ncclGetLastError(void *c) { (void)c; return last_error; }

__attribute__((destructor)) static void at_exit_report(void) {
    if (!used) return;
    if (depth > 0) violation("the process exits with an NCCL group open (depth %d)", depth);
    fprintf(stderr, WHO " report at exit: %lu call(s); %lu group(s) open; %lu communicator(s) not destroyed; %lu argument error(s); %lu injected fault(s)\n",
            calls, open_groups, live_comms, argument_errors, injected_faults);
}
