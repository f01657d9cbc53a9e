#include "store/pack_sink.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "common/file_lease.h"

namespace ckptfs {

Status PackSink::PutInPlace(const ChunkId& id, uint64_t offset, size_t len) {
  chunks_->Hold(id);  // before the look: a chunk found stored cannot be reclaimed after it
  if (seen_.count(id) || cache_->HasWhole(id, len)) {
    punch_.push_back(Packs::Range{offset, len});
    metrics_->chunk_dedup_hits.Add(1);
    metrics_->chunk_dedup_bytes.Add(len);
    return Status::Ok();
  }
  seen_.insert(id);
  fresh_.push_back(Packs::Entry{id, offset, len});
  return Status::Ok();
}

Status PackSink::Adopt(const std::string& path, const std::string& name) {
  if (fresh_.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(std::vector<size_t> skipped, cache_->AdoptPack(path, name, fresh_));
  for (size_t i : skipped) punch_.push_back(Packs::Range{fresh_[i].offset, fresh_[i].len});
  adopted_ = skipped.size() < fresh_.size();
  return Status::Ok();
}

bool PackSink::NoOtherOpens(int fd) { return OtherOpeners(fd) == Openers::kNone; }

Status PackSink::Copy(int fd) {
  std::vector<uint8_t> buf;
  for (const Packs::Entry& e : fresh_) {
    buf.resize(e.len);
    size_t got = 0;
    while (got < e.len) {
      const ssize_t n =
          ::pread(fd, buf.data() + got, e.len - got, static_cast<off_t>(e.offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "read of a staging file");
      got += static_cast<size_t>(n);
    }
    // The bytes hashed a moment ago; a writer may have changed them since (then the seal's epoch
    // check discards this commit, and these chunks are reclaimed with its holds).
    if (ChunkId::Of(buf.data(), e.len) != e.id) {
      return Status(Code::kIo, "a staging file changed while it was sealed");
    }
    RETURN_IF_ERROR(cache_->Put(e.id, buf.data(), e.len).status());
  }
  return Status::Ok();
}

void PackSink::Punch(const std::string& name, const Logger& log) {
  if (!adopted_) return;
  if (Status st = cache_->PunchPack(name, punch_); !st.ok()) {
    log->warn("pack {}: returning the room of chunks stored elsewhere: {}", name, st.ToString());
  }
}

}  // namespace ckptfs
