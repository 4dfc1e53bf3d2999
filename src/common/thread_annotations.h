// Clang thread-safety annotations (-Wthread-safety); no-ops elsewhere.
// Mark members "GUARDED_BY(mu_)" so the compiler checks the locking.
#pragma once

#if defined(__clang__)
#define KVPOOL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVPOOL_THREAD_ANNOTATION(x)
#endif

#define GUARDED_BY(x) KVPOOL_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) KVPOOL_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) KVPOOL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) KVPOOL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
