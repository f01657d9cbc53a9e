#include "cache/append_pack.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

namespace ckptfs {

struct AppendPacks::Open {
  Open(Packs* p, std::string n) : packs(p), name(std::move(n)) {}
  ~Open() {
    if (fd >= 0) ::close(fd);
    if (direct_fd >= 0) ::close(direct_fd);
    packs->EndAppend(name);
  }
  Packs* const packs;
  const std::string name;
  int fd = -1;         // buffered writes
  int direct_fd = -1;  // O_DIRECT writes; -1 where the filesystem refuses them
};

AppendPacks::~AppendPacks() {
  std::shared_ptr<Open> last;
  MutexLock lock(&mu_);
  last = std::move(open_);
  lock.Unlock();
}

Result<std::shared_ptr<AppendPacks::Open>> AppendPacks::Start() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  for (int64_t n = ns;; ++n) {
    const std::string name = "append." + std::to_string(n);
    const std::string pack = dir_ + "/" + name + ".pack";
    const int fd = ::open(pack.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) return Status::FromErrno(errno, "create pack " + pack);
    // The index, empty: a crash before its first record leaves a pack Packs::Open removes.
    const std::string index = dir_ + "/" + name + ".idx";
    const int ifd = ::open(index.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (ifd < 0 || packs_->StartAppend(name).code() != Code::kOk) {
      const Status st = ifd < 0 ? Status::FromErrno(errno, "create index " + index)
                                : Status(Code::kExists, "pack " + name + " exists");
      if (ifd >= 0) ::close(ifd);
      ::close(fd);
      ::unlink(pack.c_str());
      if (ifd >= 0) ::unlink(index.c_str());
      return st;
    }
    ::close(ifd);
    auto open = std::make_shared<Open>(packs_, name);
    open->fd = fd;
    if (!direct_refused_.load(std::memory_order_relaxed)) {
      open->direct_fd = ::open(pack.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
      if (open->direct_fd < 0 && errno == EINVAL && !direct_refused_.exchange(true)) {
        log_->info("the local tier's filesystem refuses O_DIRECT: packs are written buffered");
      }
    }
    log_->debug("appending chunks to pack {}", name);
    return open;
  }
}

Result<std::shared_ptr<AppendPacks::Open>> AppendPacks::Reserve(uint64_t room, uint64_t* offset) {
  std::shared_ptr<Open> full;  // ended (once its puts are done) with no lock held
  MutexLock lock(&mu_);
  if (!open_ || (end_ > 0 && end_ + room > bound_)) {
    ASSIGN_OR_RETURN(std::shared_ptr<Open> fresh, Start());
    full = std::exchange(open_, std::move(fresh));
    end_ = 0;
  }
  *offset = end_;
  end_ += room;
  std::shared_ptr<Open> out = open_;
  lock.Unlock();
  return out;
}

Status AppendPacks::Write(const Open& pack, const uint8_t* data, size_t len, bool aligned,
                          uint64_t offset, bool* direct) {
  *direct = false;
  const auto at = static_cast<int64_t>(offset);
  if (aligned && len > 0 && pack.direct_fd >= 0) {
    // Whole blocks, the padding's zeros included: the extent's room is its own.
    Status st = engine_->WriteAt(pack.direct_fd, data, DirectBlocks(len), at);
    if (st.code() != Code::kInvalid) {
      *direct = st.ok();
      return st;
    }
    log_->debug("direct write into pack {} refused ({}); writing it buffered", pack.name,
                st.ToString());
  }
  return len ? engine_->WriteAt(pack.fd, data, len, at) : Status::Ok();
}

Result<bool> AppendPacks::Put(const ChunkId& id, const uint8_t* data, size_t len, bool aligned) {
  const uint64_t room = DirectBlocks(len);
  uint64_t offset = 0;
  ASSIGN_OR_RETURN(std::shared_ptr<Open> pack, Reserve(room, &offset));
  bool direct = false;
  Status st = Write(*pack, data, len, aligned, offset, &direct);
  Result<bool> recorded = st.ok() ? packs_->Record(pack->name, Packs::Entry{id, offset, len})
                                  : Result<bool>(st);
  if (!recorded.ok() || !*recorded) {
    // The room is this put's alone (reserved, never recorded): given back at once.
    if (room > 0 && ::fallocate(pack->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                static_cast<off_t>(offset), static_cast<off_t>(room)) != 0 &&
        errno != EOPNOTSUPP) {
      log_->warn("pack {}: punching the room of chunk {}: {}", pack->name, id.Hex(),
                 std::strerror(errno));
    }
    if (!recorded.ok()) {
      return Status(recorded.status().code(),
                    "writing chunk " + id.Hex() + ": " + recorded.status().message());
    }
    return false;
  }
  metrics_->chunks_written.Add(1);
  metrics_->chunk_bytes_written.Add(len);
  if (direct) metrics_->chunk_direct_write_bytes.Add(len);
  return true;
}

}  // namespace ckptfs
