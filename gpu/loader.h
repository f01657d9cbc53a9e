// ckptfs_gpu: load checkpoint tensors from a ckptfs mount straight into memory, host or device.
//
// The mount says where every tensor's bytes are (the user.ckptfs.tensors attribute); this library
// reads that index and then reads the bytes with io_uring, several requests in flight, either
// straight into the caller's host memory or through a fixed set of pinned staging buffers that
// are copied to the device asynchronously (HIP), so disk reads and host-to-device copies overlap.
// The caller owns the destination memory (torch allocates it); the library only fills it.
//
// This header is the C++ API; gpu/ckptfs_gpu.h is the C ABI the Python module (gpu/ckptfs_gpu.py)
// loads with ctypes. Nothing here depends on HIP: a build without it (CKPTFS_WITH_HIP=OFF) has
// the same API and fails device reads with a clear error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/describe.h"

namespace ckptfs::gpu {

// One tensor as the mount describes it (formats/describe.h): name, torch dtype name, shape,
// stride (empty: contiguous), its storage span [offset, offset + length) in the file, and for a
// DCP shard the whole tensor's shape and the shard's place in it.
using TensorInfo = ::ckptfs::TensorInfo;

// Parses the JSON of user.ckptfs.tensors (or one of its pages). `file` only names the source in
// error messages. Errors: Code::kCorrupt, naming the file and what is wrong (not JSON, not a list,
// a member missing or of the wrong type, a negative size or offset).
Result<std::vector<TensorInfo>> ParseTensorIndex(std::string_view json_text, std::string_view file);

// Reads the tensor index of the file at `path` on a ckptfs mount: user.ckptfs.tensors, or its
// pages (user.ckptfs.tensors.pages, .0, .1, ...) when the list is larger than an attribute holds.
// Errors, each naming the file:
//   Code::kNotFound     no such file
//   Code::kNoData       no index: not on a ckptfs mount, or not a recognized checkpoint (the
//                       mount lists no tensors and calls the format "unknown"), or a DCP
//                       .metadata file (its tensors live in the .distcp files)
//   Code::kCorrupt      the mount cannot describe the file (EIO: a damaged or truncated
//                       checkpoint), or the index does not parse
//   others              the system call's errno, mapped by Status::FromErrno
// A recognized checkpoint with no tensors is an empty list, not an error.
Result<std::vector<TensorInfo>> ReadTensorIndex(const std::string& path);

// The tensors of `index` named in `names`, in the order of `names`. Errors: Code::kNotFound
// listing every name that is not in the index (a rank asking for a tensor its file lacks).
Result<std::vector<TensorInfo>> SelectTensors(const std::vector<TensorInfo>& index,
                                              std::span<const std::string> names,
                                              std::string_view file);

// The index as JSON in the mount's own form (formats' TensorsJson, all of it), for the C ABI.
std::string TensorIndexJson(const std::vector<TensorInfo>& tensors);

// A byte range of the file and where its bytes go.
struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dst = nullptr;  // host memory, or device memory for a device read; `length` bytes
  std::string name;     // for error messages (the tensor's name); may be empty
};

struct LoadOptions {
  // io_uring requests in flight at once (the ring's depth). Four 4 MiB requests keep a mount's
  // read path busy; far more outrun its read-ahead and RAM cache (bench/RESULTS.md: 32 in
  // flight read a cold file at half the rate of 4 on the 2-core development machine).
  unsigned queue_depth = 4;
  // Each extent is read in requests of at most this many bytes, so one large tensor still has
  // several reads in flight.
  size_t piece_bytes = size_t{4} << 20;
  // Device reads: the pinned host staging buffers, `staging_buffers` of `staging_bytes` each. This
  // is all the host memory a device read uses, whatever the checkpoint's size.
  unsigned staging_buffers = 4;
  size_t staging_bytes = size_t{16} << 20;
  // "uring", or "pread" (one request at a time). "uring" falls back to "pread" when the kernel
  // refuses io_uring.
  std::string engine = "uring";
  // Testing aid: no request moves more than this many bytes (0: no limit), which sends every
  // larger request through the short-read path.
  size_t max_op_bytes = 0;
  // Host reads: advise transparent huge pages (MADV_HUGEPAGE) over the 2 MiB-aligned part of
  // every destination, before the first byte lands. Fresh memory is faulted in as the reads fill
  // it, and 4 KiB faults cost more than the reads on some machines (virtual ones above all);
  // the advice is ignored where it does not apply (memory that is not anonymous, THP off).
  bool huge_pages = true;
};

// Reads every extent of the file at `path` into host memory.
// REQUIRES: every dst points to `length` writable bytes, and no two extents' destinations overlap.
// Errors: the file cannot be opened; a read fails; the file ends before an extent does
// (Code::kCorrupt: "file is shorter than its tensor index says", naming the extent). After an
// error the destinations hold unspecified bytes.
Status ReadToHost(const std::string& path, std::span<const Extent> extents,
                  const LoadOptions& options = {});

// The device side of a staged read: pinned host buffers and asynchronous copies out of them. One
// implementation uses HIP (gpu/hip_copy.cc); NewHostStager is its in-memory twin for tests.
// Not thread-safe: one read uses one stager from one thread.
class Stager {
 public:
  struct Copy {
    size_t src = 0;  // byte offset in the staging buffer
    void* dst = nullptr;
    size_t len = 0;
  };
  virtual ~Stager() = default;
  virtual size_t buffer_count() const = 0;
  virtual size_t buffer_bytes() const = 0;
  // Staging buffer i, buffer_bytes() long. Its bytes may be written only after Wait(i).
  virtual char* buffer(size_t i) = 0;
  // Blocks until every copy queued from buffer i has finished reading it.
  virtual Status Wait(size_t i) = 0;
  // Queues the copies out of buffer i; returns before they finish.
  virtual Status CopyOut(size_t i, std::span<const Copy> copies) = 0;
  // Waits for every queued copy; after Ok the destinations hold their bytes.
  virtual Status Finish() = 0;
};

// A HIP stager on `device` (the caller's current device is restored afterwards). Errors: no HIP
// in this build ("ckptfs_gpu was built without HIP"), no such device, allocation failures.
Result<std::unique_ptr<Stager>> NewHipStager(int device, const LoadOptions& options);

// A stager whose "device" is host memory: copies run only at Wait/Finish, as if they were still
// in flight until then, so a reader that refills a buffer too early is caught by the bytes.
std::unique_ptr<Stager> NewHostStager(size_t buffers, size_t bytes);

// Reads every extent through `stager`: each staging buffer is filled by reads in flight together,
// then copied out while the next buffers fill. Large extents are cut into buffer-sized pieces;
// small ones share a buffer. Errors: as ReadToHost, plus the stager's.
Status ReadStaged(const std::string& path, std::span<const Extent> extents, Stager& stager,
                  const LoadOptions& options = {});

// ReadStaged with NewHipStager(device, options). Every dst is device memory on `device`.
Status ReadToDevice(const std::string& path, std::span<const Extent> extents, int device,
                    const LoadOptions& options = {});

// Whether this build has HIP, and how many devices it sees (0 without HIP or without devices).
bool HaveHip();
int DeviceCount();

}  // namespace ckptfs::gpu
