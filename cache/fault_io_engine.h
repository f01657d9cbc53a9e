// FaultIoEngine: an IoEngine wrapper that fails chunk reads or writes on command, so that tests
// can show what a failing cache disk does to ckptfs (clear errors, nothing committed lost, the
// daemon up). Mounted with `--cache-faults SPEC` (tests only), like --backend-faults.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "cache/io_engine.h"

namespace ckptfs {

struct CacheFaultSpec {
  bool reads = false, writes = false;  // which ops fail
  int error = 5;                       // the errno they fail with (EIO; or ENOSPC)
  uint64_t after = 0;                  // bytes of those ops that succeed first
  uint64_t count = 0;                  // at most this many failures (0: every one after `after`)

  // "ops=read+write,error=eio|enospc,after=SIZE,count=N". kInvalid naming the item otherwise.
  static Result<CacheFaultSpec> Parse(std::string_view text);
  std::string ToString() const;
};

// Thread-safe like the engine it wraps.
class FaultIoEngine : public IoEngine {
 public:
  FaultIoEngine(std::unique_ptr<IoEngine> inner, CacheFaultSpec spec)
      : inner_(std::move(inner)), spec_(spec) {}
  Status Submit(std::span<IoOp> ops) override;
  const char* name() const override { return inner_->name(); }

 private:
  std::unique_ptr<IoEngine> inner_;
  const CacheFaultSpec spec_;
  std::atomic<uint64_t> moved_{0};   // bytes of the faulted kinds handed to the inner engine
  std::atomic<uint64_t> failed_{0};  // failures injected
};

}  // namespace ckptfs
