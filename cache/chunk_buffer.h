// Buffers for chunk bytes (ChunkData::Allocate, declared in chunk_cache.h) and for direct
// transfers of chunks to and from the local tier's files.
//
// A disk request takes a bounded number of memory segments (virtio's 254, 128 on other VMs), and
// each 4 KiB page that is not physically next to the one before is a segment of its own: a direct
// transfer into small pages pays per page, in the guest and on the host. On this project's
// development VM a direct read of 1 MiB requests ran at 1.1-1.2 GB/s into small pages and at
// 2.4-3.0 GB/s into a huge page, and a buffered read of the same file (the page cache's large
// folios) at 2.2 GB/s. So chunk buffers of 1 MiB or more are huge-page backed themselves (one of
// 1 to 2 MiB takes a whole huge page), and the local tier reads and Put writes a smaller chunk of
// 256 KiB or more through a lent huge-page DirectBuffer. Not through one: chunks under 256 KiB
// (64 pages at most), and a fetched chunk under 1 MiB written to the local tier from its own
// buffer (off the reader's path; a copy would cost the fetching thread more than it saves).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptfs {

inline constexpr size_t kHugePage = 2 << 20;

// The memory ChunkData::Allocate(size) holds (its capacity()).
size_t ChunkBufferCapacity(size_t size);

// One huge page's worth of memory, on a huge page boundary and (where the kernel has transparent
// huge pages) backed by one, lent for one direct transfer of a chunk smaller than kHugePage.
// Taken from and given back to the chunk buffers' pool; data() is null when no memory could be
// mapped (the caller then does without).
class DirectBuffer {
 public:
  // Whether lending one is worth a copy: false where the kernel has no transparent huge pages
  // or gives none to madvise (/sys/kernel/mm/transparent_hugepage/enabled "never"). Read once.
  static bool Useful();
  DirectBuffer();
  ~DirectBuffer();
  DirectBuffer(const DirectBuffer&) = delete;
  DirectBuffer& operator=(const DirectBuffer&) = delete;

  uint8_t* data() const { return p_; }
  static constexpr size_t kSize = kHugePage;

 private:
  uint8_t* p_ = nullptr;
};

}  // namespace ckptfs
