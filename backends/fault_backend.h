// FaultBackend: a Backend wrapper that misbehaves on command (LevelDB's fault-injecting
// EnvWrapper, RocksDB's FaultInjectionTestFS, 3FS FAULT_INJECTION_SET). It sits in front of any
// backend and, on the operations a FaultSpec names, with the spec's probabilities:
//   fail      returns kIo ("injected fault ...") without calling the wrapped backend;
//   delay     sleeps delay_ms first (and may come on top of another fault);
//   truncate  Get returns fewer bytes than the wrapped backend gave; Put stores a prefix of the
//             data and still says OK: a backend that lies;
//   flip      Get returns the bytes with one bit flipped; Put stores them so.
// Truncate and flip only touch Put and Get, and only non-empty payloads. The layers above must
// turn all of it into clear errors and never into stored garbage (invariant 5).
//
// Randomness is one std::mt19937_64 seeded by the spec, drawn under a mutex with a fixed number
// of draws per call, so a given seed and sequence of calls (one thread) faults the same calls
// every run. Thread-safe; the wrapped backend must be too (every Backend is).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>

#include "backends/backend.h"

namespace ckptfs {

// Bits of FaultSpec::ops.
enum BackendOp : uint32_t {
  kOpPut = 1u << 0,
  kOpGet = 1u << 1,
  kOpHead = 1u << 2,
  kOpDelete = 1u << 3,
  kOpList = 1u << 4,
  kOpAll = kOpPut | kOpGet | kOpHead | kOpDelete | kOpList,
};

struct FaultSpec {
  // Per-call probabilities, each in [0, 1]. At most one of fail, truncate and flip hits a call,
  // so their sum is at most 1.
  double fail = 0;
  double truncate = 0;
  double flip = 0;
  // The probability that a call is delayed, when delay_ms > 0 (so "delay_ms=5" alone delays
  // every call). At most kMaxDelayMs.
  double delay = 1;
  uint32_t delay_ms = 0;
  uint64_t seed = 0;
  // At most this many faults of all kinds (delays included) from SetSpec on; 0: no limit.
  uint64_t count = 0;
  uint32_t ops = kOpAll;  // BackendOp bits: which operations may be faulted

  static constexpr uint32_t kMaxDelayMs = 60'000;

  // kInvalid, naming the field, unless the rules above hold.
  Status Validate() const;

  // Parses "fail=0.1,delay_ms=5,truncate=0.01,flip=0.01,seed=42,count=100,ops=put+get": keys as
  // the fields above, ops a '+'-joined subset of put, get, head, delete, list (or "all"); keys
  // left out keep their defaults, "" is the spec that injects nothing. kInvalid with the
  // offending item on anything else (unknown or repeated key, bad number, rule broken).
  static Result<FaultSpec> Parse(std::string_view text);
  // The form Parse reads back to an equal spec.
  std::string ToString() const;
};

// Faults injected so far, by kind.
struct FaultCounts {
  uint64_t fail = 0;
  uint64_t delay = 0;
  uint64_t truncate = 0;
  uint64_t flip = 0;
  uint64_t total() const { return fail + delay + truncate + flip; }
};

class FaultBackend : public Backend {
 public:
  // Wraps `base`, which must outlive this object. Injects nothing until SetSpec.
  explicit FaultBackend(Backend* base);
  // Wraps and owns `base`.
  explicit FaultBackend(std::unique_ptr<Backend> base);
  // An owning wrapper faulting as `spec_text` (FaultSpec::Parse) says; for a mount option.
  static Result<std::unique_ptr<FaultBackend>> Wrap(std::unique_ptr<Backend> base,
                                                    std::string_view spec_text);

  // Replaces the spec, reseeds the generator with spec.seed and restarts spec.count. An invalid
  // spec is refused (kInvalid) and the old one stays. Faults in flight finish as drawn.
  Status SetSpec(const FaultSpec& spec);
  FaultSpec spec() const;
  // Since construction; SetSpec does not reset them.
  FaultCounts counts() const;

  Status Put(const std::string& key, const void* data, size_t len) override;
  Status PutIfAbsent(const std::string& key, const void* data, size_t len) override;
  Result<size_t> Get(const std::string& key, uint64_t offset, void* buf, size_t len) override;
  // GetObject and GetExact are deliberately the defaults (Head, then Get; Get), even when the
  // wrapped backend has its own: they go through the faulty Head and Get, so a truncated body
  // shows up as the kCorrupt that a lying server earns.
  Result<ObjectInfo> Head(const std::string& key) override;
  Status Delete(const std::string& key) override;
  Status List(const std::string& prefix, const std::string& start_after,
              const std::function<bool(const ObjectInfo&)>& fn) override;
  std::string Describe() const override;
  std::string Identity() const override { return base_->Identity(); }

 private:
  enum class Damage { kNone, kTruncate, kFlip };
  struct Plan {
    bool fail = false;
    uint32_t delay_ms = 0;
    Damage damage = Damage::kNone;
  };

  // Draws the faults of one call of `op` and sleeps its delay. Fail is counted here; damage is
  // counted by Apply, once there are bytes to damage.
  Plan Begin(uint32_t op);
  // Damages bytes[0..n) as planned (bytes may be null for kTruncate, which only shortens);
  // returns their new length.
  size_t Apply(Damage damage, char* bytes, size_t n);
  bool TakeLocked();  // one more fault within spec_.count?
  double UniformLocked();

  std::unique_ptr<Backend> owned_;  // null when not owning
  Backend* const base_;

  mutable std::mutex mu_;  // guards everything below
  FaultSpec spec_;
  std::mt19937_64 rng_;
  uint64_t injected_ = 0;  // faults since the last SetSpec, against spec_.count
  FaultCounts counts_;
};

}  // namespace ckptfs
