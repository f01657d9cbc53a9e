#include "cache/chunk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>

#include "cache/io_engine.h"

namespace ckptfs {

struct ChunkCache::Inflight {
  std::condition_variable cv;
  bool done = false;
  Result<ChunkRef> result{Status::Ok()};
};

namespace {

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
  int fd = ::open(chunks.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + chunks);
  return std::unique_ptr<ChunkCache>(new ChunkCache(chunks, fd, engine, ram_bytes, metrics));
}

ChunkCache::ChunkCache(std::string dir, int dirfd, IoEngine* engine, uint64_t ram_bytes,
                       Metrics* metrics)
    : dir_(std::move(dir)),
      dirfd_(dirfd),
      engine_(engine),
      ram_budget_(ram_bytes),
      metrics_(metrics),
      log_(GetLogger("cache")) {}

ChunkCache::~ChunkCache() { ::close(dirfd_); }

std::string ChunkCache::PathOf(const ChunkId& id) const {
  std::string hex = id.Hex();
  return dir_ + "/" + hex.substr(0, 2) + "/" + hex;
}

bool ChunkCache::Contains(const ChunkId& id) const {
  struct stat st;
  return ::stat(PathOf(id).c_str(), &st) == 0;
}

Result<bool> ChunkCache::Put(const ChunkId& id, const void* data, size_t len) {
  std::string path = PathOf(id);
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && static_cast<size_t>(st.st_size) == len) return false;
  uint64_t seq;
  {
    std::lock_guard lock(mu_);
    seq = ++tmp_seq_;
  }
  std::string tmp = dir_ + "/tmp/" + id.Hex() + "." + std::to_string(seq);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "create chunk file " + tmp);
  Status w = engine_->WriteAt(fd, data, len, 0);
  if (::close(fd) != 0 && w.ok()) w = Status::FromErrno(errno, "close chunk file " + tmp);
  if (w.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    w = Status::FromErrno(errno, "rename chunk file to " + path);
  }
  if (!w.ok()) {
    ::unlink(tmp.c_str());
    return Status(w.code(), "writing chunk " + id.Hex() + ": " + w.message());
  }
  metrics_->chunks_written.Add(1);
  metrics_->chunk_bytes_written.Add(len);
  return true;
}

Result<ChunkRef> ChunkCache::Get(const ChunkId& id, size_t len) {
  std::shared_ptr<Inflight> flight;
  bool leader = false;
  {
    std::unique_lock lock(mu_);
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
      flight->cv.wait(lock, [&] { return flight->done; });
      return flight->result;
    }
  }
  Result<ChunkRef> r = Load(id, len);
  std::lock_guard lock(mu_);
  if (r.ok()) RamPut(id, *r);
  flight->result = r;
  flight->done = true;
  inflight_.erase(id);
  flight->cv.notify_all();
  return r;
}

Result<ChunkRef> ChunkCache::Load(const ChunkId& id, size_t len) {
  std::string path = PathOf(id);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("chunk " + id.Hex() + " is not on the local tier");
    return Status::FromErrno(errno, "open chunk " + path);
  }
  auto data = std::make_shared<ChunkData>();
  data->bytes.reset(new uint8_t[len ? len : 1]);
  data->size = len;
  auto n = engine_->ReadAt(fd, data->bytes.get(), len, 0);
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
    return Corrupt("chunk " + id.Hex() + " failed verification");
  }
  return ChunkRef(std::move(data));
}

void ChunkCache::RamPut(const ChunkId& id, const ChunkRef& data) {
  if (data->size > ram_budget_ || ram_.count(id)) return;
  lru_.emplace_front(id, data);
  ram_[id] = lru_.begin();
  ram_used_ += data->size;
  while (ram_used_ > ram_budget_ && !lru_.empty()) {
    ram_used_ -= lru_.back().second->size;
    ram_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

Status ChunkCache::Remove(const ChunkId& id) {
  {
    std::lock_guard lock(mu_);
    auto it = ram_.find(id);
    if (it != ram_.end()) {
      ram_used_ -= it->second->second->size;
      lru_.erase(it->second);
      ram_.erase(it);
    }
  }
  std::string path = PathOf(id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "unlink chunk " + path);
  }
  return Status::Ok();
}

Status ChunkCache::Sync() {
  if (::syncfs(dirfd_) != 0) return Status::FromErrno(errno, "syncfs " + dir_);
  return Status::Ok();
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
  return Status::Ok();
}

}  // namespace ckptfs
