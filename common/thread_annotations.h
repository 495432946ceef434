// Clang's thread-safety annotations (as LevelDB's port/thread_annotations.h):
// which mutex guards which field, which functions need it held. Checked by
// clang's -Wthread-safety (the ASan pass of scripts/test builds with clang and
// turns these warnings into errors); no-ops for other compilers. Use them with
// gpufeed::Mutex (common/mutex.h): libstdc++'s std::mutex carries none.
#ifndef GPUFEED_COMMON_THREAD_ANNOTATIONS_H_
#define GPUFEED_COMMON_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define GPUFEED_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GPUFEED_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) GPUFEED_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY GPUFEED_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) GPUFEED_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) GPUFEED_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) GPUFEED_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) GPUFEED_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) GPUFEED_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) GPUFEED_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) GPUFEED_THREAD_ANNOTATION(assert_capability(x))
#define NO_THREAD_SAFETY_ANALYSIS GPUFEED_THREAD_ANNOTATION(no_thread_safety_analysis)

#endif  // GPUFEED_COMMON_THREAD_ANNOTATIONS_H_
