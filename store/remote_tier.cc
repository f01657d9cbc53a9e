#include "store/remote_tier.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

namespace ckptfs {
namespace {

// Version 2: the record ends with the XXH3-128 of everything before it, so that bytes damaged
// in the backend or on the way are detected (a flipped chunk id would make the file unreadable).
constexpr std::string_view kRecordMagic = "CKFR\x02";
constexpr size_t kRecordSum = 16;

void PutU64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetU64(std::string_view b, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

std::string Op(char kind, std::string_view payload) {
  std::string op(1, kind);
  op.append(payload);
  return op;
}

// Errors that no retry can mend: the op is dropped (and logged) so that the queue moves on.
bool Permanent(const Status& st) {
  return st.code() == Code::kInvalid || st.code() == Code::kCorrupt ||
         st.code() == Code::kNotFound;
}

}  // namespace

std::string FileRecord::Encode() const {
  std::string out(kRecordMagic);
  for (uint64_t v : {uint64_t{mode}, uint64_t{uid}, uint64_t{gid},
                     static_cast<uint64_t>(mtime_ns), generation, uint64_t{origin.size()}}) {
    PutU64(out, v);
  }
  out += origin;
  out += manifest.Encode();
  uint8_t sum[kRecordSum];
  ChunkId::Of(out.data(), out.size()).ToBytes(sum);
  out.append(reinterpret_cast<const char*>(sum), kRecordSum);
  return out;
}

Result<FileRecord> FileRecord::Decode(std::string_view b) {
  constexpr size_t kFixed = 5 + 6 * 8;
  if (b.size() < kFixed + kRecordSum || b.substr(0, 5) != kRecordMagic) {
    return Corrupt("remote file record is damaged or of another version");
  }
  uint8_t sum[kRecordSum];
  ChunkId::Of(b.data(), b.size() - kRecordSum).ToBytes(sum);
  const std::string_view want(reinterpret_cast<const char*>(sum), kRecordSum);
  if (b.substr(b.size() - kRecordSum) != want) {
    return Corrupt("remote file record fails its checksum");
  }
  b.remove_suffix(kRecordSum);
  FileRecord r;
  r.mode = static_cast<uint32_t>(GetU64(b, 5));
  r.uid = static_cast<uint32_t>(GetU64(b, 13));
  r.gid = static_cast<uint32_t>(GetU64(b, 21));
  r.mtime_ns = static_cast<int64_t>(GetU64(b, 29));
  r.generation = GetU64(b, 37);
  const uint64_t origin_len = GetU64(b, 45);
  if (origin_len > b.size() - kFixed) return Corrupt("remote file record is truncated");
  r.origin = std::string(b.substr(kFixed, origin_len));
  ASSIGN_OR_RETURN(r.manifest, Manifest::Decode(b.substr(kFixed + origin_len)));
  return r;
}

namespace remote_op {
std::string PublishFile(uint64_t ino, uint64_t path_epoch) {
  std::string p;
  PutU64(p, ino);
  PutU64(p, path_epoch);
  return Op('F', p);
}
std::string Unpublish(std::string_view path) { return Op('D', path); }
std::string PublishDir(std::string_view path) { return Op('M', path); }
std::string UnpublishDir(std::string_view path) { return Op('R', path); }
}  // namespace remote_op

RemoteTier::RemoteTier(Backend* backend, MetaStore* meta, ChunkCache* cache, Metrics* metrics,
                       std::string origin, uint32_t threads, int tier)
    : backend_(backend),
      meta_(meta),
      cache_(cache),
      metrics_(metrics),
      origin_(std::move(origin)),
      tier_(tier),
      log_(GetLogger("remote")),
      upload_pool_(std::make_unique<ThreadPool>(std::max<uint32_t>(threads, 1))) {}

RemoteTier::~RemoteTier() { Stop(); }

Status RemoteTier::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

void RemoteTier::Start() {
  MutexLock lock(&mu_);
  if (worker_.joinable()) return;
  stop_ = false;
  worker_ = std::thread([this] { Loop(); });
}

void RemoteTier::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void RemoteTier::Kick() {
  {
    MutexLock lock(&mu_);
    kicked_ = true;
  }
  work_cv_.notify_all();
}

void RemoteTier::Loop() {
  using Clock = std::chrono::steady_clock;
  int failures = 0, gc_failures = 0, busy_waits = 0;
  bool idle_due = true;  // idle work to do once the queue is empty
  // gc/round is read at least every half window, whatever the queue holds or waits for, so that
  // a round's condemned chunks are fetched back well within its grace.
  const auto half_window = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(1.0, gc_window_s_ / 2)));
  auto follow_gc = [&] {
    Status gc = RefreshGc(false);
    if (!gc.ok() && ++gc_failures % 30 == 3) log_->warn("following gc rounds: {}", gc.ToString());
    if (gc.ok()) gc_failures = 0;
  };
  for (;;) {
    uint64_t seq = 0;
    std::string op;
    {
      auto txn = meta_->Begin(false);
      Status st = txn.ok() ? txn->ForEachRemoteOp(tier_, 0, [&](uint64_t s, std::string_view o) {
        seq = s;
        op = o;
        return false;
      })
                           : txn.status();
      if (!st.ok()) log_->error("reading the upload queue: {}", st.ToString());
    }
    follow_gc();
    if (seq == 0 && idle_due && idle_work_) {
      Status idle = idle_work_();
      if (!idle.ok()) log_->warn("applying the keep policy of {}: {}", backend_->Describe(), idle.ToString());
      idle_due = !idle.ok();
    }
    MutexLock lock(&mu_);
    if (stop_) return;
    if (seq == 0) {
      ++queue_empty_at_;
      done_cv_.notify_all();
      work_cv_.wait_for(lock.native(), half_window,
                        [&]() REQUIRES(mu_) { return kicked_ || stop_; });
      kicked_ = false;
      continue;
    }
    lock.Unlock();
    Status st = Process(op);
    if (!st.ok() && !Permanent(st)) {
      // The backend is down or refusing: keep the op, back off (0.1 s doubling to 30 s). A file
      // that waits for a gc round (kBusy) tries again every 0.2 s without backing off: it must
      // go as soon as the round ends, before the next round's listing finds its fresh chunks
      // (which no record names yet) and condemns them again.
      lock.Lock();
      last_error_ = st;
      done_cv_.notify_all();
      const bool waiting = IsGcWait(st);
      const auto wait = waiting ? std::chrono::milliseconds(200)
                                : std::chrono::milliseconds(
                                      std::min(30'000, 100 << std::min(failures, 9)));
      if ((waiting ? busy_waits++ % 50 : failures++ % 10) == 0) {
        log_->warn("upload queue stalled: {}; retrying", st.ToString());
      }
      // Backing off, too: a round this node does not see active is one whose condemned chunks
      // it cannot fetch back.
      for (const auto until = Clock::now() + wait; !stop_ && Clock::now() < until;) {
        const Clock::duration left = until - Clock::now();
        work_cv_.wait_for(lock.native(), std::min(left, half_window),
                          [&]() REQUIRES(mu_) { return stop_; });
        if (stop_) break;
        lock.Unlock();
        follow_gc();
        lock.Lock();
      }
      continue;
    }
    if (!st.ok()) log_->error("dropping an upload that cannot succeed: {}", st.ToString());
    failures = busy_waits = 0;
    Status del = [&]() -> Status {
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
      RETURN_IF_ERROR(txn.DelRemoteOp(tier_, seq));
      return txn.Commit();
    }();
    lock.Lock();
    if (!del.ok()) {
      last_error_ = del;
      log_->error("updating the upload queue: {}", del.ToString());
    } else {
      done_upto_ = seq;
      last_error_ = Status::Ok();
      idle_due = true;
    }
    done_cv_.notify_all();
  }
}

void RemoteTier::NoteRetry(const Status& st) { log_->warn("{}; trying again", st.ToString()); }

Status RemoteTier::Process(std::string_view op) {
  if (op.empty()) return Corrupt("empty upload op");
  const std::string_view arg = op.substr(1);
  switch (op[0]) {
    case 'F': {
      // 8 bytes: queued by a binary of store format 2, before path epochs.
      if (arg.size() != 8 && arg.size() != 16) return Corrupt("damaged upload op");
      const uint64_t ino = GetU64(arg, 0);
      const auto epoch = arg.size() == 16 ? std::optional<uint64_t>(GetU64(arg, 8)) : std::nullopt;
      Status st = PublishFile(ino, epoch);
      if (st.ok() && on_published_) {
        on_published_(ino);
        cache_->Evict();  // what the file held may go now
      }
      return st;
    }
    case 'D':
      RETURN_IF_ERROR(backend_->Delete("files/" + std::string(arg)));
      return Announce("files/" + std::string(arg));
    case 'M':
      RETURN_IF_ERROR(backend_->Put("dirs/" + std::string(arg), "", 0));
      return Announce("dirs/" + std::string(arg));
    case 'R':
      RETURN_IF_ERROR(backend_->Delete("dirs/" + std::string(arg)));
      return Announce("dirs/" + std::string(arg));
    default:
      return Corrupt("unknown upload op '" + std::string(1, op[0]) + "'");
  }
}

Status RemoteTier::PublishFile(uint64_t ino, std::optional<uint64_t> path_epoch) {
  InodeRecord rec;
  std::string path;
  Manifest m;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    auto r = txn.GetInode(ino);
    if (!r.ok() && r.status().code() == Code::kNotFound) return Status::Ok();  // gone since
    if (!r.ok()) return r.status();
    rec = *r;
    if (!S_ISREG(rec.mode) || rec.nlink == 0) return Status::Ok();
    // Moved since this op was queued: the move queued the publish under the path it has now,
    // after the deletion of the record under this op's path, which may be that path again.
    if (path_epoch && *path_epoch != rec.path_epoch) return Status::Ok();
    auto p = txn.PathOf(ino);
    if (!p.ok() && p.status().code() == Code::kNotFound) return Status::Ok();  // unlinked
    if (!p.ok()) return p.status();
    path = std::move(*p);
    ASSIGN_OR_RETURN(auto mm, txn.GetManifest(ino));
    if (mm) m = std::move(*mm);
    ASSIGN_OR_RETURN(uint64_t published, txn.GetPublished(tier_, ino));
    if (published >= rec.generation && rec.generation > 0) return Status::Ok();
    // Made by create(2) and not yet committed or closed: its commit or close publishes it (a
    // crash before then removes it, which an uploaded record would undo on the next sync).
    ASSIGN_OR_RETURN(bool unborn, txn.IsUnborn(ino));
    if (unborn) return Status::Ok();
  }
  // From this read of gc/round to the record's PUT: the window (see remote_gc.cc).
  // A gc error is never a reason to drop the op: it is retried like a backend error.
  if (Status gc = RefreshGc(false); !gc.ok()) return IoError("following gc rounds: " + gc.ToString());
  const auto window_start = gc_.read_at;
  const uint64_t epoch = gc_.epoch;
  RETURN_IF_ERROR(CheckGc(m));
  std::vector<std::pair<ChunkId, uint64_t>> held;
  RETURN_IF_ERROR(UploadChunks(m, &held));
  FileRecord fr;
  fr.mode = rec.mode;
  fr.uid = rec.uid;
  fr.gid = rec.gid;
  fr.mtime_ns = rec.mtime_ns;
  fr.generation = rec.generation;
  fr.origin = origin_;
  fr.manifest = std::move(m);
  const std::string bytes = fr.Encode();
  RETURN_IF_ERROR(
      Tried([&] { return backend_->Put("files/" + path, bytes.data(), bytes.size()); }));
  // Announced before the published mark: a failed append redoes the publish and the append.
  RETURN_IF_ERROR(Announce("files/" + path));
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count() >
      gc_window_s_) {
    // Too slow for the protocol: a round that began meanwhile may delete a chunk this record
    // relied on. Publish again once that round has been seen (and is over, for its chunks).
    if (Status gc = RefreshGc(true); !gc.ok()) {
      return IoError("following gc rounds: " + gc.ToString());
    }
    if (gc_.epoch != epoch) {
      return Status(Code::kBusy, std::string(kGcWait) + std::to_string(gc_.epoch) +
                                     " began while this publish took longer than gc_window: "
                                     "publishing it again");
    }
  }
  // Only now may the local copies go: a chunk evicted before its record was safely in the
  // bucket could be condemned and swept while this node holds no other copy.
  for (const auto& [id, len] : held) cache_->MarkRemote(id, tier_);
  cache_->Evict();
  metrics_->files_published.Add(1);
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  auto cur = txn.GetInode(ino);
  if (!cur.ok()) return cur.status().code() == Code::kNotFound ? Status::Ok() : cur.status();
  // Moved while this ran (a save to a temporary name, then a rename over the checkpoint; or away
  // and back, A -> B -> A, which leaves the path as it was): the move dropped the published
  // mark, queued the deletion of the record just put, and after it the publish under the path
  // the file has now. Until that one is done the tier does not hold the file.
  if (cur->nlink == 0 || cur->path_epoch != rec.path_epoch) return Status::Ok();
  auto now = txn.PathOf(ino);
  if (!now.ok()) return Status::Ok();  // unlinked since
  if (*now != path) {
    // Linked elsewhere (the path names its newest link, and a link queues nothing): publish
    // again under the name it has now.
    RETURN_IF_ERROR(
        txn.QueueRemoteOpFor(tier_, remote_op::PublishFile(ino, cur->path_epoch)).status());
    RETURN_IF_ERROR(txn.Commit());
    Kick();
    return Status::Ok();
  }
  // An op of store format 2 cannot tell whether a deletion queued after it undoes this record:
  // the mark is left to the publish each mount queues for every file a tier lacks.
  if (!path_epoch) return Status::Ok();
  ASSIGN_OR_RETURN(uint64_t published, txn.GetPublished(tier_, ino));
  if (published < rec.generation) RETURN_IF_ERROR(txn.PutPublished(tier_, ino, rec.generation));
  return txn.Commit();
}

Status RemoteTier::UploadChunks(const Manifest& m,
                                std::vector<std::pair<ChunkId, uint64_t>>* held) {
  std::map<ChunkId, uint64_t> todo;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    for (const Extent& e : m.extents()) {
      if (e.hole() || todo.count(e.id)) continue;
      ASSIGN_OR_RETURN(ChunkRecord r, txn.GetChunk(e.id));
      if (!(r.tiers & (1u << tier_))) {
        todo.emplace(e.id, e.len);
      } else {
        // Evicted and then written again (the same tensor saved anew), it is back on disk as
        // local-only: this tier holds it, so it may be evicted again once the record is up.
        held->emplace_back(e.id, e.len);
      }
    }
  }
  if (todo.empty()) return Status::Ok();
  struct Batch {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    Status first;
    std::vector<std::pair<ChunkId, uint64_t>> held;  // chunks the backend now holds
  } batch;
  batch.left = todo.size();
  for (const auto& [id, len] : todo) {
    upload_pool_->Submit([this, &batch, id = id, len = len] {
      Status st = [&]() -> Status {
        const std::string key = ChunkCache::ObjectKey(id);
        auto head = Tried([&] { return backend_->Head(key); });
        if (head.ok() && head->size == len) {
          metrics_->chunk_upload_skips.Add(1);  // another node (or an earlier run) put it
          return Status::Ok();
        }
        if (!head.ok() && head.status().code() != Code::kNotFound) return head.status();
        ASSIGN_OR_RETURN(ChunkRef data, cache_->Get(id, len));
        RETURN_IF_ERROR(Tried([&] { return backend_->Put(key, data->bytes.get(), data->size); }));
        metrics_->chunks_uploaded.Add(1);
        metrics_->chunk_upload_bytes.Add(len);
        return Status::Ok();
      }();
      std::lock_guard lock(batch.mu);
      if (st.ok()) {
        batch.held.emplace_back(id, len);
      } else if (batch.first.ok()) {
        batch.first = Status(st.code(), "chunk " + id.Hex() + ": " + st.message());
      }
      if (--batch.left == 0) batch.cv.notify_all();
    });
  }
  {
    std::unique_lock lock(batch.mu);
    // A long upload keeps following gc rounds (fetching back what a round condemned).
    while (!batch.cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return batch.left == 0; })) {
      lock.unlock();
      (void)RefreshGc(false);  // an error here is met again, and returned, by the next refresh
      lock.lock();
    }
  }
  // A round that began meanwhile may have condemned what was just put (no record names it yet):
  // none of it is marked, and the file waits for the round.
  RETURN_IF_ERROR(CheckGc(m));
  // Record what the backend holds even when some chunks failed: they are not uploaded again.
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    for (const auto& [id, len] : batch.held) RETURN_IF_ERROR(txn.MarkChunkRemote(id, tier_));
    RETURN_IF_ERROR(txn.Commit());
  }
  held->insert(held->end(), batch.held.begin(), batch.held.end());
  return batch.first;
}

Status RemoteTier::WaitPublished(uint64_t ino, uint64_t generation, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  for (;;) {
    {
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
      auto rec = txn.GetInode(ino);
      if (!rec.ok()) return rec.status().code() == Code::kNotFound ? Status::Ok() : rec.status();
      ASSIGN_OR_RETURN(uint64_t published, txn.GetPublished(tier_, ino));
      if (published >= generation || rec->nlink == 0) return Status::Ok();
    }
    Kick();
    MutexLock lock(&mu_);
    if (stop_) return Status(Code::kIo, "the remote tier is stopping");
    if (done_cv_.wait_until(lock.native(), deadline) == std::cv_status::timeout) {
      return Status(Code::kIo, "the backend " + backend_->Describe() +
                                   " did not take the file in time" +
                                   (last_error_.ok() ? "" : ": " + last_error_.ToString()));
    }
  }
}

Status RemoteTier::Drain(double timeout_s) {
  Kick();
  MutexLock lock(&mu_);
  const uint64_t seen = queue_empty_at_;
  const bool ok = done_cv_.wait_for(lock.native(), std::chrono::milliseconds(static_cast<int64_t>(
                                              timeout_s * 1000)),
                                    [&]() REQUIRES(mu_) { return queue_empty_at_ > seen + 1 || stop_; });
  if (!ok) {
    return Status(Code::kIo, "uploads to " + backend_->Describe() + " did not finish in time" +
                                 (last_error_.ok() ? "" : ": " + last_error_.ToString()));
  }
  return Status::Ok();
}

}  // namespace ckptfs
