#include "cache/chunk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "cache/append_pack.h"
#include "cache/chunk_buffer.h"
#include "cache/io_engine.h"

namespace ckptfs {

struct ChunkCache::Inflight {
  std::condition_variable cv;
  bool done = false;
  Result<ChunkRef> result{Status::Ok()};
};

namespace {

// Chunks of at least this size are written with O_DIRECT (ChunkCache::Put), and read and written
// through a lent huge page (DirectBuffer) when their own buffer is in small pages.
constexpr size_t kDirectPutMin = 256 << 10;

#ifndef __NR_cachestat
#define __NR_cachestat 451  // x86-64, arm64 and the other generic-table architectures (Linux 6.5)
#endif

// Whether every page of the first `len` bytes of `fd` is in the page cache (cachestat(2)). An
// older kernel cannot tell: then true, and chunks are read the buffered way, as before.
bool WhollyCached(int fd, size_t len) {
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return true;
  struct {
    uint64_t off, len;
  } range{0, len};
  struct {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
  } st{};
  if (::syscall(__NR_cachestat, fd, &range, &st, 0) != 0) {
    // ENOSYS, or EPERM from a seccomp profile that refuses calls it does not know: ask no more.
    if (errno != EBADF) unsupported = true;
    return true;
  }
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return st.nr_cache >= (len + page - 1) / page;
}

// Turns O_DIRECT on or off for an open file; false where the filesystem refuses it.
bool SetDirect(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) == 0;
}

Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "mkdir " + path);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ChunkCache>> ChunkCache::Open(const std::string& dir, IoEngine* engine,
                                                     uint64_t ram_bytes, Metrics* metrics) {
  std::string chunks = dir + "/chunks";
  RETURN_IF_ERROR(MakeDir(chunks));
  RETURN_IF_ERROR(MakeDir(chunks + "/tmp"));
  RETURN_IF_ERROR(MakeDir(chunks + "/corrupt"));
  char sub[8];
  for (int i = 0; i < 256; ++i) {
    std::snprintf(sub, sizeof(sub), "/%02x", i);
    RETURN_IF_ERROR(MakeDir(chunks + sub));
  }
  // Temporary files are chunks whose writer died before the rename: never referenced.
  if (DIR* d = ::opendir((chunks + "/tmp").c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ::unlinkat(::dirfd(d), e->d_name, 0);
    }
    ::closedir(d);
  }
  ASSIGN_OR_RETURN(auto packs, Packs::Open(chunks + "/packs", GetLogger("cache")));
  int fd = ::open(chunks.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + chunks);
  return std::unique_ptr<ChunkCache>(
      new ChunkCache(chunks, fd, engine, ram_bytes, metrics, std::move(packs)));
}

ChunkCache::ChunkCache(std::string dir, int dirfd, IoEngine* engine, uint64_t ram_bytes,
                       Metrics* metrics, std::unique_ptr<Packs> packs)
    : dir_(std::move(dir)),
      dirfd_(dirfd),
      engine_(engine),
      ram_budget_(ram_bytes),
      metrics_(metrics),
      log_(GetLogger("cache")),
      packs_(std::move(packs)) {}

ChunkCache::~ChunkCache() {
  std::thread compactor;
  {
    MutexLock lock(&compact_mu_);
    compact_stop_ = true;
    compactor = std::move(compactor_);
  }
  compact_cv_.notify_all();
  if (compactor.joinable()) compactor.join();  // a pass in progress ends first (bounded)
  ::close(dirfd_);
}


std::string ChunkCache::PathOf(const ChunkId& id) const {
  std::string hex = id.Hex();
  return dir_ + "/" + hex.substr(0, 2) + "/" + hex;
}

bool ChunkCache::Contains(const ChunkId& id) const {
  struct stat st;
  return ::stat(PathOf(id).c_str(), &st) == 0 || packs_->Contains(id);
}

bool ChunkCache::OnDisk(const ChunkId& id) const {
  {
    MutexLock lock(&mu_);
    if (!tiers_.empty()) return disk_.count(id) > 0;
  }
  return Contains(id);
}

Status ChunkCache::Warm(const ChunkId& id, size_t len) {
  std::shared_ptr<Inflight> flight;
  {
    MutexLock lock(&mu_);
    if (!tiers_.empty() && disk_.count(id)) {
      DiskTouch(id);  // asked for: the most recent, the last to be evicted
      return Status::Ok();
    }
    if (tiers_.empty()) {
      lock.Unlock();
      if (Contains(id)) return Status::Ok();
      return NotFound("chunk " + id.Hex() + " is not on the local tier (no backend)");
    }
    if (auto f = inflight_.find(id); f != inflight_.end()) {
      flight = f->second;
      flight->cv.wait(lock.native(), [&] { return flight->done; });
      return flight->result.status();
    }
    flight = std::make_shared<Inflight>();
    inflight_.emplace(id, flight);
  }
  // Unlike Get, the bytes go to disk only: the waiters of this flight get them, nobody keeps them.
  Result<ChunkRef> r = Fetch(id, len);
  MutexLock lock(&mu_);
  flight->result = r;
  flight->done = true;
  inflight_.erase(id);
  flight->cv.notify_all();
  return r.status();
}

bool ChunkCache::AlreadyOnDisk(const ChunkId& id, size_t len) {
  struct stat st;
  if ((::stat(PathOf(id).c_str(), &st) != 0 || static_cast<size_t>(st.st_size) != len) &&
      (packs_->Len(id) != len || !ExtentSure(id, len))) {
    return false;
  }
  MutexLock lock(&mu_);
  DiskAdd(id, len);  // known to the disk map even if a racing Load dropped it
  return true;
}

Result<bool> ChunkCache::Put(const ChunkId& id, const void* data, size_t len) {
  if (AlreadyOnDisk(id, len)) return false;
  if (auto copy = PreparePut(data, len)) return PutDirect(id, copy->bytes, len);
  return PutBuffered(id, data, len);
}

ChunkCache::PreparedPut::~PreparedPut() = default;

size_t ChunkCache::CopyFootprint(size_t len) {
  // A lent huge page, or a buffer of its own of at least one.
  return len < kDirectPutMin ? len : std::max(ChunkBufferCapacity(len), DirectBuffer::kSize);
}

bool ChunkCache::PutCopies(const ChunkId& id, size_t len) {
  return len >= kDirectPutMin && !direct_refused_.load(std::memory_order_relaxed) &&
         !AlreadyOnDisk(id, len);
}

Result<bool> ChunkCache::PutPrepared(const ChunkId& id, const PreparedPut& prepared) {
  if (AlreadyOnDisk(id, prepared.len)) return false;  // put meanwhile (the same chunk twice)
  return PutDirect(id, prepared.bytes, prepared.len);
}

std::unique_ptr<ChunkCache::PreparedPut> ChunkCache::PreparePut(const void* data, size_t len) {
  // A large chunk goes to disk with O_DIRECT, from an aligned copy (a pooled buffer, its pages
  // resident): a buffered write would copy it into fresh page cache, which nobody reads back
  // (a read of a chunk not in the page cache is direct too), and which pushes the job's own
  // pages out. That copy was over half of a seal's time. Small chunks stay buffered: many of
  // them (a model's biases and norms) would each wait for the disk.
  if (len < kDirectPutMin || direct_refused_.load(std::memory_order_relaxed)) return nullptr;
  auto copy = std::make_unique<PreparedPut>();
  copy->len = len;
  // A chunk smaller than a huge page is copied into a lent one, a larger one into a buffer of
  // its own (huge-page backed too): either way the disk gets contiguous memory.
  if (len < DirectBuffer::kSize && DirectBuffer::Useful()) {
    copy->lent = std::make_unique<DirectBuffer>();
    if (!copy->lent->data()) copy->lent.reset();
  }
  if (!copy->lent) {
    try {
      copy->own = ChunkData::Allocate(len);
    } catch (const std::bad_alloc&) {
      return nullptr;  // no buffer to spare: the page cache's copy will do
    }
  }
  auto* to = copy->lent ? copy->lent->data() : copy->own->bytes.get();
  std::memcpy(to, data, len);
  std::memset(to + len, 0, DirectBlocks(len) - len);  // whole blocks may be written
  copy->bytes = to;
  return copy;
}

Result<bool> ChunkCache::PutBuffered(const ChunkId& id, const void* data, size_t len) {
  if (append_) return PutAppended(id, data, len, false);
  return PutChunkFile(id, data, len);
}

Result<bool> ChunkCache::PutChunkFile(const ChunkId& id, const void* data, size_t len) {
  std::string tmp = TmpPath(id);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "create chunk file " + tmp);
  return WriteChunkFile(id, fd, tmp, data, len, false);
}

Result<bool> ChunkCache::PutDirect(const ChunkId& id, const uint8_t* data, size_t len) {
  if (append_) return PutAppended(id, data, len, true);
  std::string tmp = TmpPath(id);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {  // no O_DIRECT on this filesystem: not asked again
    if (!direct_refused_.exchange(true)) {
      log_->info("the local tier's filesystem refuses O_DIRECT: chunks are written buffered");
    }
    return PutBuffered(id, data, len);
  }
  if (fd < 0) return Status::FromErrno(errno, "create chunk file " + tmp);
  auto r = WriteChunkFile(id, fd, tmp, data, len, true);
  // A filesystem that takes O_DIRECT at open but not these writes (EINVAL): the buffered way.
  // Any other error (EIO from a failing disk, ENOSPC) is the answer.
  if (!r.ok() && r.status().code() == Code::kInvalid) {
    log_->debug("chunk {}: direct write refused ({}); writing it buffered", id.Hex(),
                r.status().ToString());
    return PutBuffered(id, data, len);
  }
  if (r.ok() && *r) metrics_->chunk_direct_write_bytes.Add(len);
  return r;
}

std::string ChunkCache::TmpPath(const ChunkId& id) {
  uint64_t seq;
  {
    MutexLock lock(&mu_);
    seq = ++tmp_seq_;
  }
  return dir_ + "/tmp/" + id.Hex() + "." + std::to_string(seq);
}

Status ChunkCache::WriteTmp(const ChunkId& id, int fd, const std::string& tmp, const void* data,
                            size_t len, bool direct) {
  // A direct write moves whole blocks; the last, partial one goes through the page cache. (Written
  // padded and cut back with ftruncate, it cost a synchronous read of that block, which ext4 zeroes
  // past the new end, and a second write of it.) Its writeback starts at once: a direct read of
  // the chunk waits for it, and until it is done the file on disk ends at the head.
  const size_t head = direct ? len / kDirectAlign * kDirectAlign : len;
  Status w = head ? engine_->WriteAt(fd, data, head, 0) : Status::Ok();
  if (w.ok() && head != len) {
    const auto at = static_cast<int64_t>(head);
    if (!SetDirect(fd, false)) {
      w = Status::FromErrno(errno, "leave direct I/O on chunk file " + tmp);
    } else {
      w = engine_->WriteAt(fd, static_cast<const char*>(data) + head, len - head, at);
      if (w.ok() && ::sync_file_range(fd, at, static_cast<off_t>(len - head),
                                      SYNC_FILE_RANGE_WRITE) != 0) {
        w = Status::FromErrno(errno, "write back the end of chunk file " + tmp);
      }
    }
  }
  if (::close(fd) != 0 && w.ok()) w = Status::FromErrno(errno, "close chunk file " + tmp);
  if (!w.ok()) {
    ::unlink(tmp.c_str());
    return Status(w.code(), "writing chunk " + id.Hex() + ": " + w.message());
  }
  return Status::Ok();
}

Result<bool> ChunkCache::WriteChunkFile(const ChunkId& id, int fd, const std::string& tmp,
                                        const void* data, size_t len, bool direct) {
  RETURN_IF_ERROR(WriteTmp(id, fd, tmp, data, len, direct));
  const std::string path = PathOf(id);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const Status w = Status::FromErrno(errno, "rename chunk file to " + path);
    ::unlink(tmp.c_str());
    return Status(w.code(), "writing chunk " + id.Hex() + ": " + w.message());
  }
  metrics_->chunks_written.Add(1);
  metrics_->chunk_bytes_written.Add(len);
  MutexLock lock(&mu_);
  DiskAdd(id, len);
  return true;
}

std::string ChunkCache::ObjectKey(const ChunkId& id) {
  const std::string hex = id.Hex();
  return "chunks/" + hex.substr(0, 2) + "/" + hex;
}

void ChunkCache::AttachRemote(std::vector<Backend*> tiers, uint64_t disk_limit) {
  std::vector<std::pair<ChunkId, uint64_t>> found;
  Status st = ForEach([&](const ChunkId& id, uint64_t size) { found.emplace_back(id, size); });
  if (!st.ok()) log_->error("listing the local tier: {}", st.ToString());
  MutexLock lock(&mu_);
  tiers_ = std::move(tiers);
  disk_limit_ = disk_limit;
  for (const auto& [id, size] : found) DiskAdd(id, size);
}

void ChunkCache::SetKeepFetched(std::function<bool(const ChunkId&)> keep) {
  MutexLock lock(&mu_);
  keep_ = std::move(keep);
}

void ChunkCache::DiskAdd(const ChunkId& id, uint64_t size) {
  if (disk_.count(id)) return DiskTouch(id);
  disk_lru_.push_front(id);
  disk_.emplace(id, DiskEntry{size, 0, disk_lru_.begin()});
  disk_bytes_ += size;
  local_only_bytes_ += size;
}

void ChunkCache::DiskDrop(const ChunkId& id) {
  auto it = disk_.find(id);
  if (it == disk_.end()) return;
  disk_bytes_ -= it->second.size;
  if (!it->second.tiers) local_only_bytes_ -= it->second.size;
  disk_lru_.erase(it->second.pos);
  disk_.erase(it);
}

void ChunkCache::DiskTouch(const ChunkId& id) {
  auto it = disk_.find(id);
  if (it != disk_.end()) disk_lru_.splice(disk_lru_.begin(), disk_lru_, it->second.pos);
}

void ChunkCache::MarkRemote(const ChunkId& id, int tier) {
  MutexLock lock(&mu_);
  auto it = disk_.find(id);
  if (it == disk_.end()) return;
  if (!it->second.tiers) local_only_bytes_ -= it->second.size;
  it->second.tiers = static_cast<uint8_t>(it->second.tiers | (1u << tier));
}

void ChunkCache::UnmarkRemote(const ChunkId& id, int tier) {
  MutexLock lock(&mu_);
  auto it = disk_.find(id);
  if (it == disk_.end() || !(it->second.tiers & (1u << tier))) return;
  it->second.tiers = static_cast<uint8_t>(it->second.tiers & ~(1u << tier));
  if (!it->second.tiers) local_only_bytes_ += it->second.size;
}

void ChunkCache::Hold(const std::vector<ChunkId>& ids) {
  MutexLock lock(&mu_);
  for (const ChunkId& id : ids) ++held_[id];
}

void ChunkCache::Unhold(const std::vector<ChunkId>& ids) {
  MutexLock lock(&mu_);
  for (const ChunkId& id : ids) {
    auto it = held_.find(id);
    if (it != held_.end() && --it->second == 0) held_.erase(it);
  }
}

void ChunkCache::SetProtected(int tier, const std::unordered_set<ChunkId, ChunkIdHash>& ids) {
  const uint8_t bit = static_cast<uint8_t>(1u << tier);
  MutexLock lock(&mu_);
  for (auto it = protected_.begin(); it != protected_.end();) {
    it->second = static_cast<uint8_t>(it->second & ~bit);
    it = it->second ? std::next(it) : protected_.erase(it);
  }
  for (const ChunkId& id : ids) protected_[id] |= bit;
}

void ChunkCache::SetPinned(std::unordered_map<ChunkId, uint64_t, ChunkIdHash> pinned) {
  MutexLock lock(&mu_);
  pinned_ = std::move(pinned);
}

ChunkCache::Usage ChunkCache::usage() const {
  MutexLock lock(&mu_);
  return Usage{disk_bytes_, local_only_bytes_, disk_limit_, ram_used_, ram_budget_};
}

bool ChunkCache::Evictable(const ChunkId& id, const DiskEntry& d) const {
  // Held by a tier whose mark counts (not protected for that tier's gc round).
  auto p = protected_.find(id);
  const uint8_t tiers = static_cast<uint8_t>(d.tiers & ~(p == protected_.end() ? 0 : p->second));
  return tiers && !pinned_.count(id) && !held_.count(id) && !inflight_.count(id);
}

uint64_t ChunkCache::Evict() {
  std::vector<ChunkId> victims;
  {
    MutexLock lock(&mu_);
    if (disk_limit_ == 0 || disk_bytes_ <= disk_limit_) return 0;
    uint64_t excess = disk_bytes_ - disk_limit_;
    for (auto it = disk_lru_.rbegin(); it != disk_lru_.rend() && excess > 0; ++it) {
      const DiskEntry& d = disk_.at(*it);
      if (!Evictable(*it, d)) continue;
      victims.push_back(*it);
      excess -= std::min(excess, d.size);
    }
  }
  std::vector<ChunkId> going;
  std::vector<uint64_t> sizes;
  {
    // Checked again, and dropped from the map under the same lock: a chunk unmarked or
    // protected since it was picked stays, and one that goes no longer counts as on disk.
    MutexLock lock(&mu_);
    for (const ChunkId& id : victims) {
      auto it = disk_.find(id);
      if (it == disk_.end() || !Evictable(id, it->second)) continue;
      going.push_back(id);
      sizes.push_back(it->second.size);
      DiskDrop(id);
    }
  }
  // All at once: the extents of one pack cost one sync of its index.
  const std::vector<Status> removed = RemoveMany(going);
  uint64_t freed = 0;
  for (size_t i = 0; i < going.size(); ++i) {
    if (!removed[i].ok()) continue;
    freed += sizes[i];
    metrics_->chunks_evicted.Add(1);
    metrics_->chunk_evict_bytes.Add(sizes[i]);
  }
  if (!going.empty()) CompactSoon();  // never on this thread: it may be a reader's
  return freed;
}

Result<ChunkRef> ChunkCache::Get(const ChunkId& id, size_t len) {
  std::shared_ptr<Inflight> flight;
  bool leader = false;
  {
    MutexLock lock(&mu_);
    auto it = ram_.find(id);
    if (it != ram_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      metrics_->cache_hit_bytes.Add(len);
      return it->second->second;
    }
    auto f = inflight_.find(id);
    if (f != inflight_.end()) {
      flight = f->second;
    } else {
      flight = std::make_shared<Inflight>();
      inflight_.emplace(id, flight);
      leader = true;
    }
    if (!leader) {
      flight->cv.wait(lock.native(), [&] { return flight->done; });
      return flight->result;
    }
  }
  Result<ChunkRef> r = Load(id, len);
  // A corrupt local copy was moved aside by Load: the backend's copy replaces it.
  if (!r.ok() && (r.status().code() == Code::kNotFound || r.status().code() == Code::kCorrupt) &&
      !tiers_.empty()) {
    r = Fetch(id, len);
  }
  MutexLock lock(&mu_);
  if (r.ok()) {
    RamPut(id, *r);
    DiskTouch(id);
  }
  flight->result = r;
  flight->done = true;
  inflight_.erase(id);
  flight->cv.notify_all();
  return r;
}

Status ChunkCache::Verify(const ChunkId& id, size_t len) { return Load(id, len).status(); }

Result<ChunkRef> ChunkCache::LoadExtent(const ChunkId& id, size_t len, bool* moved) {
  const auto at = packs_->Locate(id);
  // Dropped since it was read there (compaction moves a chunk into its chunk file, then drops
  // the extent and punches its range): the caller looks for the file again.
  auto gone = [&] {
    const auto now = packs_->Locate(id);
    *moved = !now || now->first != at->first || now->second.offset != at->second.offset;
    return *moved;
  };
  if (!at) {
    *moved = true;
    return NotFound("chunk " + id.Hex() + " is not on the local tier");
  }
  const std::string& path = at->first;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && gone()) return NotFound("chunk " + id.Hex() + " moved");
  if (fd < 0) return Status::FromErrno(errno, "open pack " + path);
  auto data = ChunkData::Allocate(len);
  // A large extent on a block boundary (an append pack's) is read direct, as a chunk file is; one
  // elsewhere (a staging file's starts anywhere), or a direct read refused or short, buffered.
  const auto off = static_cast<int64_t>(at->second.offset);
  const bool whole = at->second.len == len, direct = whole && off % kDirectAlign == 0 &&
      len >= kDirectPutMin && !direct_refused_.load(std::memory_order_relaxed) && SetDirect(fd, true);
  auto n = direct ? engine_->ReadAt(fd, data->bytes.get(), DirectBlocks(len), off, true)
                  : Result<size_t>(size_t{0});
  if (direct) std::memset(data->bytes.get() + len, 0, DirectBlocks(len) - len);  // not the chunk's
  if (direct && (n.ok() ? *n >= len : n.status().code() != Code::kInvalid)) {
    if (n.ok()) metrics_->cache_direct_read_bytes.Add(*n = len);
  } else if (whole && (!direct || SetDirect(fd, false))) {
    n = engine_->ReadAt(fd, data->bytes.get(), len, off);
  }
  ::close(fd);
  if (!n.ok()) {
    log_->error("reading chunk {}: {}", id.Hex(), n.status().ToString());
    return n.status();
  }
  metrics_->cache_miss_bytes.Add(len);
  if (*n != len || ChunkId::Of(data->bytes.get(), len) != id) {
    if (gone()) return NotFound("chunk " + id.Hex() + " moved");
    metrics_->chunk_verify_failures.Add(1);
    // Its bytes are no chunk's: the extent goes (its range punched), so that the next Put or
    // fetch stores it anew, as a corrupt chunk file is moved aside.
    Status dropped = packs_->Drop(id, at);
    {
      MutexLock lock(&mu_);
      DiskDrop(id);
    }
    log_->error("chunk {} in a pack on the local tier is corrupt ({} of {} bytes, hash mismatch); "
                "its extent is dropped{}",
                id.Hex(), *n, len,
                dropped.ok() ? "" : " (not recorded: " + dropped.ToString() + ")");
    return Corrupt("chunk " + id.Hex() + " failed verification");
  }
  return ChunkRef(std::move(data));
}

Result<ChunkRef> ChunkCache::Load(const ChunkId& id, size_t len) {
  std::string path = PathOf(id);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    // An extent; or a chunk moved out of its pack meanwhile (compaction renames its chunk file
    // into place before it drops the extent): a second look finds the file.
    bool moved = !packs_->Contains(id);
    if (!moved) {
      auto r = LoadExtent(id, len, &moved);
      if (!moved) return r;
    }
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) {
    if (errno == ENOENT) {
      MutexLock lock(&mu_);
      DiskDrop(id);  // gone behind our back: Warm and OnDisk must not count it any more
      return NotFound("chunk " + id.Hex() + " is not on the local tier");
    }
    return Status::FromErrno(errno, "open chunk " + path);
  }
  auto data = ChunkData::Allocate(len);
  // A chunk the page cache does not hold whole is read with O_DIRECT into its buffer (aligned,
  // padded to whole blocks): its bytes go on to the RAM tier and the reader's page cache, so a
  // copy in the page cache of the chunk file would only push other pages out, and copying it in
  // and out there cost about a third of the daemon's CPU in a cold sequential read.
  const bool direct = len > 0 && !direct_refused_.load(std::memory_order_relaxed) &&
                      !WhollyCached(fd, len) && SetDirect(fd, true);
  const size_t blocks = DirectBlocks(len);
  // A chunk whose buffer is in small pages (under 1 MiB) is read into a lent huge page and copied
  // out: the copy costs less than a transfer into scattered small pages (chunk_buffer.h).
  std::optional<DirectBuffer> lent;
  if (direct && len >= kDirectPutMin && data->capacity() < DirectBuffer::kSize &&
      DirectBuffer::Useful()) {
    lent.emplace();
  }
  uint8_t* into = lent && lent->data() ? lent->data() : data->bytes.get();
  auto n = engine_->ReadAt(fd, into, direct ? blocks : len, 0, direct);
  if (direct) {
    // Blocks past the chunk (a longer, damaged file) are not the chunk's: the padding stays zero.
    if (into == data->bytes.get()) std::memset(data->bytes.get() + len, 0, blocks - len);
    // Refused, or short (a partial transfer on a device with smaller blocks would end off a
    // 4 KiB boundary and look like end of file): the buffered way tells. A disk error is the
    // answer (EIO reads the same either way).
    if (n.ok() ? *n < len : n.status().code() == Code::kInvalid) {
      log_->debug("chunk {}: direct read {}; reading it buffered", id.Hex(),
                  n.ok() ? "short" : n.status().ToString());
      n = SetDirect(fd, false) ? engine_->ReadAt(fd, data->bytes.get(), len, 0) : n;
    } else if (n.ok()) {
      *n = len;
      if (into != data->bytes.get()) std::memcpy(data->bytes.get(), into, len);
      metrics_->cache_direct_read_bytes.Add(len);
    }
  }
  ::close(fd);
  if (!n.ok()) {
    log_->error("reading chunk {}: {}", id.Hex(), n.status().ToString());
    return n.status();
  }
  metrics_->cache_miss_bytes.Add(len);
  if (*n != len || ChunkId::Of(data->bytes.get(), len) != id) {
    metrics_->chunk_verify_failures.Add(1);
    std::string aside = dir_ + "/corrupt/" + id.Hex();
    ::rename(path.c_str(), aside.c_str());
    log_->error("chunk {} on the local tier is corrupt ({} of {} bytes, hash mismatch); moved to {}",
                id.Hex(), *n, len, aside);
    // A chunk file cut short by a machine crash does not hide the chunk's extent in a pack (a
    // seal stored it there, not trusting the short file).
    if (packs_->Contains(id)) {
      bool moved = false;
      return LoadExtent(id, len, &moved);
    }
    // Gone from the tier: the disk map (eviction, OnDisk) must not count it any more.
    MutexLock lock(&mu_);
    DiskDrop(id);
    return Corrupt("chunk " + id.Hex() + " failed verification");
  }
  return ChunkRef(std::move(data));
}

// A miss of the disk tier: the copy of the nearest remote tier that has it, verified, then kept
// on disk (a full disk only costs the copy). A tier that answers "not here" or fails passes the
// request on to the next. A failed GET (kIo) and a copy that fails verification make another
// round over the tiers, up to kFetchAttempts in all, with a short backoff after I/O errors: the
// backend's client retries its own transport errors, this covers what still gets through (a
// flaky server, a proxy that damages bytes) before a reader sees EIO. Any other error
// (kPermission, ...) is final for that tier.
Result<ChunkRef> ChunkCache::Fetch(const ChunkId& id, size_t len) {
  constexpr int kFetchAttempts = 5;
  ScopedLatency timed(metrics_->chunk_fetches);
  auto data = ChunkData::Allocate(len);
  for (int attempt = 1;; ++attempt) {
    Status first;         // the first error other than "not here"
    bool again = false;   // some tier may answer another try
    uint8_t missing = 0;  // bit T: tier T answered "not here"
    for (size_t tier = 0; tier < tiers_.size(); ++tier) {
      Backend* backend = tiers_[tier];
      auto n = backend->GetExact(ObjectKey(id), data->bytes.get(), len);
      Status st;
      if (!n.ok()) {
        if (n.status().code() == Code::kNotFound) {
          missing = static_cast<uint8_t>(missing | (1u << tier));
          continue;
        }
        st = n.status();
      } else {
        metrics_->remote_fetches.Add(1);
        metrics_->remote_fetch_bytes.Add(*n);
        if (tier > 0) metrics_->remote_fetch_fallthrough.Add(1);
        if (*n == len && ChunkId::Of(data->bytes.get(), len) == id) {
          // A chunk nobody references any more (its file was deleted meanwhile) is served, not
          // kept: nothing would ever remove it from disk.
          if (!keep_ || keep_(id)) {
            if (auto put = AlreadyOnDisk(id, len) ? Result<bool>(false)
                                                  : PutDirect(id, data->bytes.get(), len);
                !put.ok()) {
              log_->warn("chunk {} fetched but not kept on the local tier: {}", id.Hex(),
                         put.status().ToString());
            }
            MarkRemote(id, static_cast<int>(tier));
            Evict();
          }
          ChunkRef ref(std::move(data));
          if (missing && fetched_from_far_) fetched_from_far_(id, missing, ref);
          return ref;
        }
        metrics_->remote_verify_failures.Add(1);
        st = Corrupt("chunk " + id.Hex() + " from " + backend->Describe() +
                     " failed verification (" + std::to_string(*n) + " of " +
                     std::to_string(len) + " bytes)");
      }
      const bool retryable = st.code() == Code::kIo || st.code() == Code::kCorrupt;
      again = again || retryable;
      const bool last = attempt >= kFetchAttempts && tier + 1 == tiers_.size();
      if (st.code() == Code::kCorrupt) {
        log_->error("{}{}", st.message(), last ? "" : "; fetching it again");
      } else if (retryable && !last) {
        log_->warn("fetching chunk {} from {}: {}", id.Hex(), backend->Describe(), st.ToString());
      } else {
        log_->error("fetching chunk {} from {}: {}", id.Hex(), backend->Describe(), st.ToString());
      }
      if (first.ok()) first = st;
    }
    if (first.ok()) {
      std::string where;
      for (Backend* b : tiers_) where += (where.empty() ? "" : ", ") + b->Describe();
      return NotFound("chunk " + id.Hex() + " is neither on the local tier nor in " + where);
    }
    if (!again || attempt >= kFetchAttempts) return first;
    if (first.code() == Code::kIo) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 << (attempt - 1)));
    }
  }
}

void ChunkCache::RamPut(const ChunkId& id, const ChunkRef& data) {
  if (data->capacity() > ram_budget_ || ram_.count(id)) return;
  lru_.emplace_front(id, data);
  ram_[id] = lru_.begin();
  ram_used_ += data->capacity();
  while (ram_used_ > ram_budget_ && !lru_.empty()) {
    ram_used_ -= lru_.back().second->capacity();
    ram_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

Status ChunkCache::Remove(const ChunkId& id) { return RemoveMany({id}).front(); }

Status ChunkCache::Sync() {
  if (::syncfs(dirfd_) != 0) return Status::FromErrno(errno, "syncfs " + dir_);
  return Status::Ok();
}

Status ChunkCache::SyncChunks(const std::vector<ChunkId>& ids) {
  bool dirs[256] = {};
  for (const ChunkId& id : ids) {
    if (id.IsZero()) continue;
    const std::string path = PathOf(id);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) continue;
      return Status::FromErrno(errno, "open " + path);
    }
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, "fsync " + path);
    uint8_t b[16];
    id.ToBytes(b);
    dirs[b[0]] = true;
  }
  char sub[8];
  for (int i = 0; i < 256; ++i) {
    if (!dirs[i]) continue;
    std::snprintf(sub, sizeof(sub), "/%02x", i);
    const std::string d = dir_ + sub;
    const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + d);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, "fsync " + d);
  }
  return packs_->Sync(ids);
}

Result<std::vector<size_t>> ChunkCache::AdoptPack(const std::string& src, const std::string& name,
                                                  const std::vector<Packs::Entry>& entries) {
  // Chunk files first: a chunk stored as a file is not recorded again.
  std::vector<Packs::Entry> fresh;
  std::vector<size_t> at, skipped;
  for (size_t i = 0; i < entries.size(); ++i) {
    struct stat st;
    if (::stat(PathOf(entries[i].id).c_str(), &st) == 0 &&
        static_cast<uint64_t>(st.st_size) == entries[i].len) {
      skipped.push_back(i);
    } else {
      fresh.push_back(entries[i]);
      at.push_back(i);
    }
  }
  ASSIGN_OR_RETURN(std::vector<size_t> dup, packs_->Adopt(src, name, fresh));
  std::vector<bool> recorded(fresh.size(), true);
  for (size_t i : dup) {
    recorded[i] = false;
    skipped.push_back(at[i]);
  }
  MutexLock lock(&mu_);
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (!recorded[i]) continue;
    DiskAdd(fresh[i].id, fresh[i].len);
    // New chunks stored, as a Put counts them; adopted, so not written a second time.
    metrics_->chunks_written.Add(1);
    metrics_->chunk_bytes_written.Add(fresh[i].len);
    metrics_->chunk_adopted_bytes.Add(fresh[i].len);
  }
  return skipped;
}

Status ChunkCache::PunchPack(const std::string& name, const std::vector<Packs::Range>& ranges) {
  return packs_->Punch(name, ranges);
}

Status ChunkCache::ForEach(const std::function<void(const ChunkId&, uint64_t)>& fn) const {
  char sub[8];
  for (int i = 0; i < 256; ++i) {
    std::snprintf(sub, sizeof(sub), "/%02x", i);
    std::string d = dir_ + sub;
    DIR* dir = ::opendir(d.c_str());
    if (!dir) return Status::FromErrno(errno, "opendir " + d);
    while (dirent* e = ::readdir(dir)) {
      auto id = ChunkId::FromHex(e->d_name);
      if (!id) continue;
      struct stat st;
      if (::fstatat(::dirfd(dir), e->d_name, &st, 0) == 0) fn(*id, st.st_size);
    }
    ::closedir(dir);
  }
  packs_->ForEach(fn);
  return Status::Ok();
}

}  // namespace ckptfs
