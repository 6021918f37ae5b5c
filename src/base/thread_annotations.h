// Lock contracts the compiler checks: clang's -Wthread-safety (on in the clang fuzz build)
// proves that state marked FERRY_GUARDED_BY(mu_) is touched only with mu_ held. The names
// follow abseil's base/thread_annotations.h. GCC has no such analysis: there they are empty.
// libstdc++'s std::mutex carries no capability attribute, so guarded state uses ferry::Mutex
// (base/mutex.h).
#pragma once

#if defined(__clang__)
#define FERRY_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define FERRY_THREAD_ANNOTATION_(x)
#endif

// A type that is a lock (ferry::Mutex) or holds one for a scope (ferry::MutexLock).
#define FERRY_CAPABILITY(name) FERRY_THREAD_ANNOTATION_(capability(name))
#define FERRY_SCOPED_CAPABILITY FERRY_THREAD_ANNOTATION_(scoped_lockable)

// Data read or written only with the lock held (PT_: the data a pointer points to).
#define FERRY_GUARDED_BY(mu) FERRY_THREAD_ANNOTATION_(guarded_by(mu))
#define FERRY_PT_GUARDED_BY(mu) FERRY_THREAD_ANNOTATION_(pt_guarded_by(mu))

// Functions: called with the lock held / not held; taking and releasing it.
#define FERRY_REQUIRES(...) FERRY_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define FERRY_EXCLUDES(...) FERRY_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define FERRY_ACQUIRE(...) FERRY_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define FERRY_RELEASE(...) FERRY_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define FERRY_TRY_ACQUIRE(...) FERRY_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define FERRY_RETURN_CAPABILITY(mu) FERRY_THREAD_ANNOTATION_(lock_returned(mu))

// Turns the analysis off for one function whose locking it cannot follow; say why beside it.
#define FERRY_NO_THREAD_SAFETY_ANALYSIS FERRY_THREAD_ANNOTATION_(no_thread_safety_analysis)
