// A mutex that clang's thread-safety analysis (-Wthread-safety) understands, and the annotations
// that name which lock guards what. std::mutex carries none in libstdc++, so a field marked
// GUARDED_BY(mu_) is checked only where mu_ is a Mutex held through MutexLock (or a function
// that REQUIRES it). Other compilers see plain std::mutex code.
//
// Use: `Mutex mu_; int n_ GUARDED_BY(mu_);`, `MutexLock lock(&mu_);`, and on a function whose
// caller must hold it, `void Bump() REQUIRES(mu_);`. A condition variable waits with
// `cv.wait(lock.native())` (std::condition_variable over the inner std::unique_lock).
#pragma once

#include <mutex>

#if defined(__clang__)
#define CKPTFS_TSA(x) __attribute__((x))
#else
#define CKPTFS_TSA(x)
#endif

#define CAPABILITY(x) CKPTFS_TSA(capability(x))
#define SCOPED_CAPABILITY CKPTFS_TSA(scoped_lockable)
#define GUARDED_BY(x) CKPTFS_TSA(guarded_by(x))
#define REQUIRES(...) CKPTFS_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) CKPTFS_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) CKPTFS_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CKPTFS_TSA(release_capability(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) CKPTFS_TSA(acquired_before(__VA_ARGS__))
#define RETURN_CAPABILITY(x) CKPTFS_TSA(lock_returned(x))
#define ASSERT_CAPABILITY(x) CKPTFS_TSA(assert_capability(x))
#define NO_THREAD_SAFETY_ANALYSIS CKPTFS_TSA(no_thread_safety_analysis)

namespace ckptfs {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds it, where it cannot see so (a lock taken through another
  // object's reference to the same Mutex); no check at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}
  // For std::unique_lock and condition variables; the analysis does not follow it.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope. native() is the std::unique_lock inside, for condition variables.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->native()) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  std::unique_lock<std::mutex>& native() { return lock_; }
  // Lets go of the mutex for a while (a backend call, a sync), and takes it back.
  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace ckptfs
