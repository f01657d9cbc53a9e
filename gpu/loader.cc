// Reading extents: straight into host memory, or through a Stager's pinned buffers to a device.
#include "gpu/loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu/extent_reader.h"

namespace ckptfs::gpu {
namespace {

class File {
 public:
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Open(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return Status::FromErrno(errno, path + ": open");
    struct stat st;
    if (::fstat(fd_, &st) != 0) return Status::FromErrno(errno, path + ": fstat");
    size_ = static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

std::string Describe(const Extent& e, size_t i) {
  std::string who = e.name.empty() ? "extent " + std::to_string(i) : "tensor '" + e.name + "'";
  return who + " (bytes " + std::to_string(e.offset) + ".." + std::to_string(e.offset + e.length) +
         ")";
}

Status ShorterThanIndex(const std::string& path, const Extent& e, size_t i, uint64_t size) {
  return Corrupt(path + ": file is shorter than its tensor index says: " + Describe(e, i) +
                 " ends past the end of the file (" + std::to_string(size) + " bytes)");
}

// Advice only: its failure (not anonymous memory, no THP in this kernel) changes nothing.
void AdviseHugePages(void* dst, uint64_t len) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t p = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t from = (p + kHuge - 1) & ~(kHuge - 1), to = (p + len) & ~(kHuge - 1);
  if (to > from) (void)::madvise(reinterpret_cast<void*>(from), to - from, MADV_HUGEPAGE);
}

// Checks every extent before any byte moves: a truncated file fails at once, not after reading
// everything before the missing part. The reader still catches a file that shrinks meanwhile.
Status CheckExtents(const std::string& path, std::span<const Extent> extents, uint64_t size) {
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    if (e.length == 0) continue;
    if (!e.dst) return Invalid(path + ": " + Describe(e, i) + " has no destination");
    if (e.offset > size || e.length > size - e.offset) return ShorterThanIndex(path, e, i, size);
  }
  return Status::Ok();
}

// The error of a failed ReadAll, naming the extent its failed op belongs to.
Status ReadFailed(const std::string& path, std::span<const Extent> extents, size_t extent,
                  uint64_t size, const Status& st) {
  const Extent& e = extents[extent];
  if (st.code() == Code::kCorrupt) return ShorterThanIndex(path, e, extent, size);
  return Status(st.code(), path + ": reading " + Describe(e, extent) + ": " + st.message());
}

// Stages extents through the stager's buffers in turn: buffer b is filled by one ReadAll, its
// copies are queued, and buffer b+1 is waited for (its previous copies done) before it refills.
Status RunStaged(const std::string& path, std::span<const Extent> extents, Stager& stager,
                 const LoadOptions& options) {
  const size_t nbuf = stager.buffer_count();
  const size_t cap = stager.buffer_bytes();
  if (nbuf == 0 || cap == 0) return Invalid("staging needs at least one non-empty buffer");
  File f;
  RETURN_IF_ERROR(f.Open(path));
  RETURN_IF_ERROR(CheckExtents(path, extents, f.size()));
  ASSIGN_OR_RETURN(std::unique_ptr<ExtentReader> reader, NewExtentReader(options));

  size_t b = 0;      // the buffer being filled
  size_t used = 0;   // its bytes taken so far
  std::vector<ReadOp> ops;
  std::vector<Stager::Copy> copies;
  RETURN_IF_ERROR(stager.Wait(b));
  auto flush = [&]() -> Status {
    if (used == 0) return Status::Ok();
    size_t failed = 0;
    Status st = reader->ReadAll(f.fd(), ops, &failed);
    if (!st.ok()) return ReadFailed(path, extents, ops[failed].extent, f.size(), st);
    RETURN_IF_ERROR(stager.CopyOut(b, copies));
    ops.clear();
    copies.clear();
    used = 0;
    b = (b + 1) % nbuf;
    return stager.Wait(b);
  };
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    for (uint64_t done = 0; done < e.length;) {
      if (used == cap) RETURN_IF_ERROR(flush());
      const size_t take = static_cast<size_t>(std::min<uint64_t>(cap - used, e.length - done));
      AppendPieces(i, stager.buffer(b) + used, e.offset + done, take, options.piece_bytes, &ops);
      copies.push_back(Stager::Copy{used, static_cast<char*>(e.dst) + done, take});
      used += take;
      done += take;
    }
  }
  return flush();
}

// The in-memory twin of the HIP stager: a copy "runs" when its buffer is waited for.
class HostStager final : public Stager {
 public:
  HostStager(size_t buffers, size_t bytes)
      : buffers_(buffers, std::vector<char>(bytes)), pending_(buffers) {}
  size_t buffer_count() const override { return buffers_.size(); }
  size_t buffer_bytes() const override { return buffers_.empty() ? 0 : buffers_[0].size(); }
  char* buffer(size_t i) override { return buffers_[i].data(); }
  Status Wait(size_t i) override {
    for (const Copy& c : pending_[i]) std::memcpy(c.dst, buffers_[i].data() + c.src, c.len);
    pending_[i].clear();
    return Status::Ok();
  }
  Status CopyOut(size_t i, std::span<const Copy> copies) override {
    for (const Copy& c : copies) {
      if (c.src > buffer_bytes() || c.len > buffer_bytes() - c.src) {
        return Internal("copy out of a staging buffer runs past its end");
      }
      pending_[i].push_back(c);
    }
    return Status::Ok();
  }
  Status Finish() override {
    for (size_t i = 0; i < buffers_.size(); ++i) RETURN_IF_ERROR(Wait(i));
    return Status::Ok();
  }

 private:
  std::vector<std::vector<char>> buffers_;
  std::vector<std::vector<Copy>> pending_;
};

}  // namespace

Status ReadToHost(const std::string& path, std::span<const Extent> extents,
                  const LoadOptions& options) {
  File f;
  RETURN_IF_ERROR(f.Open(path));
  RETURN_IF_ERROR(CheckExtents(path, extents, f.size()));
  if (options.huge_pages) {
    for (const Extent& e : extents) AdviseHugePages(e.dst, e.length);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ExtentReader> reader, NewExtentReader(options));
  std::vector<ReadOp> ops;
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    AppendPieces(i, static_cast<char*>(e.dst), e.offset, e.length, options.piece_bytes, &ops);
  }
  size_t failed = 0;
  Status st = reader->ReadAll(f.fd(), ops, &failed);
  if (!st.ok()) return ReadFailed(path, extents, ops[failed].extent, f.size(), st);
  return Status::Ok();
}

Status ReadStaged(const std::string& path, std::span<const Extent> extents, Stager& stager,
                  const LoadOptions& options) {
  Status st = RunStaged(path, extents, stager, options);
  // Never return with a copy in flight: the caller frees destinations after an error.
  Status fin = stager.Finish();
  return st.ok() ? fin : st;
}

Status ReadToDevice(const std::string& path, std::span<const Extent> extents, int device,
                    const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Stager> stager, NewHipStager(device, options));
  return ReadStaged(path, extents, *stager, options);
}

std::unique_ptr<Stager> NewHostStager(size_t buffers, size_t bytes) {
  return std::make_unique<HostStager>(buffers, bytes);
}

}  // namespace ckptfs::gpu
