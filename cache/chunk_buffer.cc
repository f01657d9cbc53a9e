#include "cache/chunk_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/chunk_cache.h"

namespace ckptfs {

namespace {

// Buffers of at least kPoolClass bytes are mappings of their own, sized in kPoolStep multiples
// (munmap gives them back whole: in malloc's arenas, big aligned blocks fragment the heap and
// the daemon's resident size grows far past what it holds). Freed ones wait in a pool, up to
// kPoolBytes in all, for the next buffer of the same size.
constexpr size_t kPoolClass = 1 << 20;
constexpr size_t kPoolStep = 64 << 10;
constexpr size_t kPoolBytes = 64 << 20;

struct BufferPool {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<uint8_t*>> free;  // by capacity
  size_t bytes = 0;

  uint8_t* Take(size_t capacity) {
    std::lock_guard lock(mu);
    auto it = free.find(capacity);
    if (it == free.end() || it->second.empty()) return nullptr;
    uint8_t* p = it->second.back();
    it->second.pop_back();
    bytes -= capacity;
    return p;
  }
  bool Give(uint8_t* p, size_t capacity) {
    std::lock_guard lock(mu);
    if (bytes + capacity > kPoolBytes) return false;
    free[capacity].push_back(p);
    bytes += capacity;
    return true;
  }
};

BufferPool& Pool() {
  static auto* pool = new BufferPool();  // never destroyed: buffers may be freed at exit
  return *pool;
}

// A mapping of `capacity` bytes for a chunk buffer. One of at least a huge page starts on a huge
// page boundary and asks for huge pages, so that a direct transfer of it takes few memory
// segments (chunk_buffer.h).
uint8_t* MapBuffer(size_t capacity) {
  const size_t extra = capacity >= kHugePage ? kHugePage : 0;
  void* m = ::mmap(nullptr, capacity + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  auto* p = static_cast<uint8_t*>(m);
  if (extra == 0) return p;
  const auto at = reinterpret_cast<uintptr_t>(p);
  const size_t before = (at + kHugePage - 1) / kHugePage * kHugePage - at;  // cut off the front
  if (before) ::munmap(p, before);
  if (before < extra) ::munmap(p + before + capacity, extra - before);  // and the rest at the end
  uint8_t* aligned = p + before;
  // Refused where the kernel has no transparent huge pages: small pages then, as before.
  ::madvise(aligned, capacity, MADV_HUGEPAGE);
  return aligned;
}

}  // namespace

void ChunkBufferFree::operator()(uint8_t* p) const {
  if (capacity < kPoolClass) return std::free(p);
  if (!Pool().Give(p, capacity)) ::munmap(p, capacity);
}

size_t ChunkBufferCapacity(size_t size) {
  const size_t step = size >= kPoolClass ? kPoolStep : ChunkData::kAlign;
  const size_t capacity = std::max<size_t>((size + step - 1) / step * step, ChunkData::kAlign);
  // A buffer of a megabyte or more takes at least a whole huge page: its direct transfers then
  // move contiguous memory (chunk_buffer.h), and buffers of all sizes up to one share a pool
  // class, so that a freed one serves the next chunk of any such size.
  return capacity >= kPoolClass && capacity < kHugePage ? kHugePage : capacity;
}

std::shared_ptr<ChunkData> ChunkData::Allocate(size_t size) {
  const size_t capacity = ChunkBufferCapacity(size);
  uint8_t* p = nullptr;
  if (capacity >= kPoolClass) {
    p = Pool().Take(capacity);
    if (!p) p = MapBuffer(capacity);
  } else {
    p = static_cast<uint8_t*>(std::aligned_alloc(kAlign, capacity));
    if (!p) throw std::bad_alloc();
  }
  // The block after the last byte is the padding a direct read fills: zero what it holds of the
  // buffer (a pooled one keeps an earlier chunk's bytes).
  const size_t block_end = std::min(capacity, DirectBlocks(size));
  std::memset(p + size, 0, block_end - size);
  auto d = std::make_shared<ChunkData>();
  d->bytes = std::unique_ptr<uint8_t[], ChunkBufferFree>(p, ChunkBufferFree{capacity});
  d->size = size;
  return d;
}

bool DirectBuffer::Useful() {
  static const bool useful = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes;
    return std::getline(f, modes) && modes.find("[never]") == std::string::npos;
  }();
  return useful;
}

DirectBuffer::DirectBuffer() {
  p_ = Pool().Take(kSize);
  if (p_) return;
  try {
    p_ = MapBuffer(kSize);
  } catch (const std::bad_alloc&) {
    p_ = nullptr;
  }
}

DirectBuffer::~DirectBuffer() {
  if (p_) ChunkBufferFree{kSize}(p_);
}

}  // namespace ckptfs
