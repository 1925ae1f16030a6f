/* Shared by the fakes (see README.md): what each one says it is, how it reaches
 * the fake driver's memory and streams, and small helpers. Everything here is
 * host code: the fakes run no GPU work and measure nothing. */
#ifndef SEXTANT_FAKE_COMMON_H
#define SEXTANT_FAKE_COMMON_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEXTANT_FAKE(name) \
    const char *sextant_fake_library(void) { return "sextant fake " name " (tests only, no GPU)"; }

/* A non-negative whole number from the environment, or 0 when unset or not one. */
static inline unsigned long fake_env_count(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end = NULL;
    unsigned long n = strtoul(v, &end, 10);
    return (end && *end == '\0') ? n : 0;
}

/* BF16 <-> float: the upper half of an IEEE single, rounded to nearest even. */
static inline float fake_bf16_to_f32(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
static inline uint16_t fake_f32_to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu)) return (uint16_t)((b >> 16) | 0x40);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* What the fake driver exports to the other fakes (found with dlsym in the
 * already-loaded libcuda.so.1, so each fake is one file with no link-time
 * dependency). */
typedef struct {
    /* 0 when [ptr, ptr + bytes) lies inside one live allocation; otherwise prints
     * why (naming `who` and `operand`), counts an argument error and returns -1. */
    int (*extent)(unsigned long long ptr, unsigned long long bytes, const char *who,
                  const char *operand);
    /* Queues fn(arg) on `stream` (NULL: the default stream) as device work lasting
     * `secs` on the fake clock; fn runs on that stream's worker thread, in order.
     * Returns a CUresult (0: queued; on failure fn is not called, arg is the caller's). */
    int (*launch)(void *stream, void (*fn)(void *), void *arg, double secs);
    /* 1 when `stream` is a live stream (or NULL, the default stream). */
    int (*stream_ok)(void *stream);
    /* 1 when the calling thread has the fake's context current. */
    int (*context_current)(void);
} fake_driver;

/* The fake driver's exports, or NULL with a line on stderr when it is not loaded. */
static fake_driver fake_driver_exports;
static int fake_driver_found;
static inline void fake_driver_bind(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *e = h ? dlsym(h, "sextant_fake_extent") : NULL;
    void *l = h ? dlsym(h, "sextant_fake_launch") : NULL;
    void *s = h ? dlsym(h, "sextant_fake_stream_ok") : NULL;
    void *c = h ? dlsym(h, "sextant_fake_context_current") : NULL;
    if (!e || !l || !s || !c) return;
    memcpy(&fake_driver_exports.extent, &e, sizeof e);
    memcpy(&fake_driver_exports.launch, &l, sizeof l);
    memcpy(&fake_driver_exports.stream_ok, &s, sizeof s);
    memcpy(&fake_driver_exports.context_current, &c, sizeof c);
    fake_driver_found = 1;
}
static inline const fake_driver *fake_driver_get(const char *who) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fake_driver_bind);
    if (!fake_driver_found) {
        fprintf(stderr, "sextant fake %s: the fake libcuda.so.1 is not loaded (the fakes work only together)\n", who);
        return NULL;
    }
    return &fake_driver_exports;
}

#endif
