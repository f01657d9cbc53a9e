// The device side with HIP: pinned staging buffers, one stream and one event per buffer.
//
// Only the HIP runtime API, no kernels: this file compiles with the host compiler against HIP's
// AMD headers (libamdhip64) or, with CKPTFS_GPU_CUDA, against the CUDA runtime (gpu/gpu_runtime.h).
#include "gpu/gpu_runtime.h"

#include <vector>

#include "gpu/loader.h"

namespace ckptfs::gpu {
namespace {

Status HipError(hipError_t err, const std::string& what) {
  return Status(Code::kIo, what + ": " + hipGetErrorName(err) + " (" + hipGetErrorString(err) + ")");
}

#define HIP_RETURN_IF_ERROR(call, what)             \
  do {                                              \
    hipError_t _e = (call);                         \
    if (_e != hipSuccess) return HipError(_e, what); \
  } while (0)

// Makes `device` current for the scope and restores the caller's device afterwards, so a read does
// not move torch's notion of the current device under it.
class DeviceScope {
 public:
  Status Enter(int device) {
    HIP_RETURN_IF_ERROR(hipGetDevice(&saved_), "hipGetDevice");
    HIP_RETURN_IF_ERROR(hipSetDevice(device), "hipSetDevice(" + std::to_string(device) + ")");
    entered_ = true;
    return Status::Ok();
  }
  ~DeviceScope() {
    if (entered_) (void)hipSetDevice(saved_);
  }

 private:
  int saved_ = 0;
  bool entered_ = false;
};

class HipStager final : public Stager {
 public:
  HipStager(int device, size_t buffers, size_t bytes)
      : device_(device), bytes_(bytes), slots_(buffers) {}

  ~HipStager() override {
    DeviceScope scope;
    (void)scope.Enter(device_);
    for (Slot& s : slots_) {
      if (s.stream) (void)hipStreamSynchronize(s.stream);
      if (s.done) (void)hipEventDestroy(s.done);
      if (s.stream) (void)hipStreamDestroy(s.stream);
      if (s.host) (void)hipHostFree(s.host);
    }
  }

  Status Init() {
    DeviceScope scope;
    RETURN_IF_ERROR(scope.Enter(device_));
    for (Slot& s : slots_) {
      void* p = nullptr;
      HIP_RETURN_IF_ERROR(hipHostMalloc(&p, bytes_, hipHostMallocDefault),
                          "hipHostMalloc(" + std::to_string(bytes_) + ")");
      s.host = static_cast<char*>(p);
      HIP_RETURN_IF_ERROR(hipStreamCreateWithFlags(&s.stream, hipStreamNonBlocking),
                          "hipStreamCreate");
      HIP_RETURN_IF_ERROR(hipEventCreateWithFlags(&s.done, hipEventDisableTiming),
                          "hipEventCreate");
    }
    return Status::Ok();
  }

  size_t buffer_count() const override { return slots_.size(); }
  size_t buffer_bytes() const override { return bytes_; }
  char* buffer(size_t i) override { return slots_[i].host; }

  Status Wait(size_t i) override {
    Slot& s = slots_[i];
    if (!s.pending) return Status::Ok();
    s.pending = false;
    HIP_RETURN_IF_ERROR(hipEventSynchronize(s.done), "hipEventSynchronize");
    return Status::Ok();
  }

  Status CopyOut(size_t i, std::span<const Copy> copies) override {
    DeviceScope scope;
    RETURN_IF_ERROR(scope.Enter(device_));
    Slot& s = slots_[i];
    for (const Copy& c : copies) {
      HIP_RETURN_IF_ERROR(
          hipMemcpyAsync(c.dst, s.host + c.src, c.len, hipMemcpyHostToDevice, s.stream),
          "hipMemcpyAsync of " + std::to_string(c.len) + " bytes");
    }
    HIP_RETURN_IF_ERROR(hipEventRecord(s.done, s.stream), "hipEventRecord");
    s.pending = true;
    return Status::Ok();
  }

  Status Finish() override {
    Status first;
    for (size_t i = 0; i < slots_.size(); ++i) {
      Status st = Wait(i);
      if (first.ok()) first = st;
    }
    return first;
  }

 private:
  struct Slot {
    char* host = nullptr;  // pinned, bytes_ long
    hipStream_t stream = nullptr;
    hipEvent_t done = nullptr;  // recorded after the slot's last queued copy
    bool pending = false;
  };
  const int device_;
  const size_t bytes_;
  std::vector<Slot> slots_;
};

}  // namespace

Result<std::unique_ptr<Stager>> NewHipStager(int device, const LoadOptions& options) {
  if (options.staging_buffers == 0 || options.staging_bytes == 0) {
    return Invalid("staging needs at least one non-empty buffer");
  }
  const int count = DeviceCount();
  if (device < 0 || device >= count) {
    return Invalid("no HIP device " + std::to_string(device) + " (this process sees " +
                   std::to_string(count) + ")");
  }
  auto s = std::make_unique<HipStager>(device, options.staging_buffers, options.staging_bytes);
  RETURN_IF_ERROR(s->Init());
  return std::unique_ptr<Stager>(std::move(s));
}

bool HaveHip() { return true; }

int DeviceCount() {
  int n = 0;
  return hipGetDeviceCount(&n) == hipSuccess ? n : 0;
}

}  // namespace ckptfs::gpu
