#include "store/file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>

#include "common/thread_pool.h"

namespace ckptfs {
namespace {

constexpr size_t kZeroBytes = 1 << 20;
const std::shared_ptr<const uint8_t[]>& Zeros() {
  static const std::shared_ptr<const uint8_t[]> zeros(new uint8_t[kZeroBytes]());
  return zeros;
}

void AppendZeros(uint64_t len, std::vector<ReadSlice>* out) {
  while (len > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, kZeroBytes));
    out->push_back(ReadSlice{Zeros(), Zeros().get(), n});
    len -= n;
  }
}

void AppendCopy(const uint8_t* data, size_t len, std::vector<ReadSlice>* out) {
  std::shared_ptr<uint8_t[]> copy(new uint8_t[len]);
  std::memcpy(copy.get(), data, len);
  out->push_back(ReadSlice{copy, copy.get(), len});
}

Status PwriteAll(int fd, const uint8_t* data, size_t len, uint64_t off, const std::string& path) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd, data, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write staging file " + path);
    }
    data += n;
    len -= static_cast<size_t>(n);
    off += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status ReadManifest(const Manifest& m, uint64_t offset, uint64_t len,
                    const std::function<Result<ChunkRef>(const ChunkId&, size_t)>& get,
                    std::vector<ReadSlice>* out) {
  const uint64_t end = std::min(offset + len, m.size());
  for (uint64_t pos = offset; pos < end;) {
    const size_t idx = m.Find(pos);
    const Extent& e = m.extents()[idx];
    const uint64_t within = pos - m.StartOf(idx);
    const uint64_t n = std::min(e.len - within, end - pos);
    if (e.hole()) {
      AppendZeros(n, out);
    } else {
      ASSIGN_OR_RETURN(ChunkRef c, get(e.id, e.len));
      out->push_back(ReadSlice{c, c->bytes.get() + within, static_cast<size_t>(n)});
    }
    pos += n;
  }
  return Status::Ok();
}

FileWriter::FileWriter(Manifest base, ChunkSink* sink, const ChunkingOptions& chunking,
                       uint64_t reorder_limit, Metrics* metrics, PayloadScannerFactory scanners,
                       MemoryBudget* reorder_budget)
    : sink_(sink),
      metrics_(metrics),
      reorder_limit_(reorder_limit),
      reorder_budget_(reorder_budget),
      chunker_(chunking),
      piece_bytes_(chunking.piece_bytes ? chunking.piece_bytes : chunking.max_bytes),
      scanners_(chunking.tensor_boundaries ? std::move(scanners) : nullptr),
      manifest_(std::move(base)) {
  size_ = manifest_.size();
  if (manifest_.empty() && scanners_) scanner_ = scanners_();
}

FileWriter::~FileWriter() {
  ReleasePending(pending_bytes_);
  if (staging_fd_ >= 0) {
    ::close(staging_fd_);
    if (!staging_path_.empty()) ::unlink(staging_path_.c_str());  // empty: adopted
  }
}

Status FileWriter::AdoptFile(int fd, uint64_t size) {
  if (mode_ != Mode::kStream || size_ != 0 || !buf_.empty()) return Internal("AdoptFile after a write");
  staging_fd_ = ::dup(fd);
  if (staging_fd_ < 0) return Status::FromErrno(errno, "dup of a file to chunk");
  staging_path_.clear();
  mode_ = Mode::kStaging;
  adopted_ = true;
  size_ = size;
  return Status::Ok();
}

Status FileWriter::Fail(Status st) {
  if (error_.ok()) error_ = st;
  return st;
}

Status FileWriter::Write(uint64_t offset, const uint8_t* data, size_t len) {
  if (!error_.ok()) return error_;
  if (len == 0) return Status::Ok();
  Status st;
  if (mode_ == Mode::kStream) {
    st = StreamWrite(offset, data, len);
  } else {
    st = PwriteAll(staging_fd_, data, len, offset, staging_path_);
  }
  if (!st.ok()) return Fail(st);
  size_ = std::max(size_, offset + len);
  return Status::Ok();
}

Status FileWriter::StreamWrite(uint64_t offset, const uint8_t* data, size_t len) {
  const uint64_t end = offset + len;
  // A write reaching into the last committed chunk: bring that chunk back into the buffer first,
  // so that it can be patched or extended and re-cut.
  if (!tail_resumed_ && buf_.empty() && !manifest_.empty() &&
      end >= manifest_.StartOf(manifest_.extents().size() - 1)) {
    RETURN_IF_ERROR(ResumeTail());
  }
  const uint64_t cut_end = manifest_.size();
  if (offset < cut_end) {
    RETURN_IF_ERROR(ToStaging());
    return PwriteAll(staging_fd_, data, len, offset, staging_path_);
  }
  if (offset > stream_end()) {
    if (OverlapsPending(offset, end)) {
      RETURN_IF_ERROR(ToStaging());
      return PwriteAll(staging_fd_, data, len, offset, staging_path_);
    }
    if (reorder_budget_ && !reorder_budget_->TryTake(len)) {
      // The daemon's reorder memory is spent (many files written out of order at once).
      RETURN_IF_ERROR(ToStaging());
      return PwriteAll(staging_fd_, data, len, offset, staging_path_);
    }
    pending_.emplace(offset, std::vector<uint8_t>(data, data + len));
    pending_bytes_ += len;
    if (pending_bytes_ > reorder_limit_) return ToStaging();
    return Status::Ok();
  }
  // offset is inside the uncut buffer or right at its end.
  if (end > stream_end() && OverlapsPending(stream_end(), end)) {
    RETURN_IF_ERROR(ToStaging());
    return PwriteAll(staging_fd_, data, len, offset, staging_path_);
  }
  const size_t at = static_cast<size_t>(offset - cut_end);
  if (at == buf_.size()) {
    Scan(data, len);
    buf_.Append(data, len);  // the common case
  } else {
    chunker_.Reset();  // bytes already scanned change: scan again
    scanner_.reset();
    if (at + len > buf_.size()) buf_.Resize(at + len);
    std::memcpy(buf_.data() + at, data, len);
  }
  RETURN_IF_ERROR(CutChunks(false));
  return DrainPending();
}

bool FileWriter::OverlapsPending(uint64_t begin, uint64_t end) const {
  auto it = pending_.lower_bound(begin);
  if (it != pending_.end() && it->first < end) return true;
  if (it != pending_.begin()) {
    --it;
    if (it->first + it->second.size() > begin) return true;
  }
  return false;
}

Status FileWriter::DrainPending() {
  while (!pending_.empty() && pending_.begin()->first == stream_end()) {
    auto node = pending_.extract(pending_.begin());
    ReleasePending(node.mapped().size());
    Scan(node.mapped().data(), node.mapped().size());
    buf_.Append(node.mapped().data(), node.mapped().size());
    RETURN_IF_ERROR(CutChunks(false));
  }
  return Status::Ok();
}

Status FileWriter::CutChunks(bool final) { return CutInto(buf_, final, &manifest_); }

Status FileWriter::CutInto(TailBuffer& buf, bool final, Manifest* into) {
  size_t start = 0;
  while (start < buf.size()) {
    const size_t cut = NextCut(into->size(), buf.data() + start, buf.size() - start, final);
    if (cut == 0) break;
    RETURN_IF_ERROR(EmitChunk(buf.data() + start, cut, into));
    start += cut;
  }
  buf.Consume(start);
  return Status::Ok();
}

size_t FileWriter::NextCut(uint64_t pos, const uint8_t* p, size_t avail, bool final) {
  const std::optional<ByteRange> r = scanner_ ? scanner_->NextPayload(pos) : std::nullopt;
  if (r && pos >= r->begin) {
    // Inside a tensor: pieces counted from its first byte, the last one ending with it.
    const uint64_t piece_end =
        std::min(r->end, r->begin + ((pos - r->begin) / piece_bytes_ + 1) * piece_bytes_);
    const size_t want = static_cast<size_t>(piece_end - pos);
    if (avail < want && !final) return 0;
    metrics_->tensor_chunk_bytes.Add(std::min(avail, want));
    return std::min(avail, want);
  }
  // Before a tensor (or with none known): content-defined, but never across the tensor's start.
  size_t limit = avail;
  if (r && r->begin - pos < avail) limit = static_cast<size_t>(r->begin - pos);
  size_t cut;
  if (UseAhead(pos, p, limit)) {
    cut = chunker_.FindCutWith(ahead_, pos, p, limit);
    if (cut) {
      ++ahead_cuts_;
      metrics_->cut_ahead_cuts.Add(1);
    }
  } else {
    if (limit < chunker_.scanned()) chunker_.Reset();  // a hint arrived late: scan again
    cut = chunker_.FindCut(p, limit);
  }
  if (cut == 0 && (limit < avail || final)) {
    cut = limit;
    chunker_.Reset();
  }
  return cut;
}

// Cut-ahead: the least bytes worth handing to other threads, and the least each one gets.
constexpr size_t kAheadMin = 2u << 20;
constexpr size_t kAheadPart = 1u << 20;
// A staging file is read this much at a time when cut with help (else one maximum chunk).
constexpr size_t kAheadRead = 16u << 20;

bool FileWriter::UseAhead(uint64_t pos, const uint8_t* p, size_t limit) {
  if (!ahead_pool_ || !cutting_staged_) return false;
  const size_t end = std::min<size_t>(limit, chunker_.options().max_bytes);
  const size_t from = chunker_.CandidatesFrom();
  if (end <= from) return false;  // no candidate would be read: scanned in line
  if (ahead_.Covers(pos + from, pos + end)) return true;
  if (pos + limit <= ahead_dense_until_) return false;
  PlanAhead(pos, p, limit);
  return ahead_.Covers(pos + from, pos + end);
}

void FileWriter::PlanAhead(uint64_t pos, const uint8_t* p, size_t avail) {
  // The list goes on from where it ends when that is within these bytes, with the 63 bytes before
  // at hand; else it starts again at pos (a byte is listed once 63 bytes precede it: no chunk
  // reads a candidate that close to its start).
  uint64_t from = pos;
  if (ahead_.begin <= pos + 63 && ahead_.end >= pos + 63 && ahead_.end < pos + avail) {
    from = ahead_.end;
    ahead_.at.erase(ahead_.at.begin(),
                    std::lower_bound(ahead_.at.begin(), ahead_.at.end(), pos << 1));
    ahead_.begin = std::max(ahead_.begin, pos);
  } else {
    ahead_.Clear();
    ahead_.begin = ahead_.end = pos + 63;
  }
  const uint64_t to = pos + avail;
  if (to - from < kAheadMin) return;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(ahead_parts_, (to - from) / kAheadPart));
  struct Part {
    uint64_t begin = 0, end = 0;
    std::vector<uint64_t> found;
    bool ok = false;
  };
  std::vector<Part> parts(n);
  for (size_t k = 0; k < n; ++k) {
    parts[k].begin = from + (to - from) * k / n;
    parts[k].end = from + (to - from) * (k + 1) / n;
  }
  auto find = [&](Part& part) {
    const size_t at = static_cast<size_t>(part.begin - pos);
    try {
      part.ok = chunker_.FindCandidates(p + at, static_cast<size_t>(part.end - part.begin), at,
                                        part.begin, &part.found);
    } catch (const std::bad_alloc&) {  // no room for the list: that part is scanned in line
      part.ok = false;
    }
  };
  {
    // Parts 1.. on the pool, part 0 here; every part handed out is waited for at the end of this
    // block, however it ends.
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    struct WaitAll {
      std::mutex& mu;
      std::condition_variable& cv;
      size_t& left;
      ~WaitAll() {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return left == 0; });
      }
    } wait_all{mu, cv, left};
    size_t inline_from = n;
    for (size_t k = 1; k < n; ++k) {
      {
        std::lock_guard lock(mu);
        ++left;
      }
      try {
        ahead_pool_->Submit([&, k] {
          find(parts[k]);
          std::lock_guard lock(mu);
          if (--left == 0) cv.notify_all();
        });
      } catch (...) {
        std::lock_guard lock(mu);
        --left;
        inline_from = k;  // not handed out: found here
        break;
      }
    }
    find(parts[0]);
    for (size_t k = inline_from; k < n; ++k) find(parts[k]);
  }
  // The list covers the parts up to the first with too many candidates (or no room for them).
  for (Part& part : parts) {
    if (part.ok) {
      try {
        ahead_.at.insert(ahead_.at.end(), part.found.begin(), part.found.end());
      } catch (const std::bad_alloc&) {
        part.ok = false;
      }
    }
    if (!part.ok) {
      metrics_->cut_ahead_refused.Add(1);
      ahead_dense_until_ = to;
      break;
    }
    ahead_.end = part.end;
  }
}

struct FileWriter::PutWindow {
  explicit PutWindow(uint64_t limit) : limit(limit) {}

  // Waits for room for `len` more bytes (one chunk always fits); the first failed put's error.
  Status Reserve(size_t len) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return !first.ok() || inflight == 0 || inflight + len <= limit; });
    if (!first.ok()) return first;
    inflight += len;
    return Status::Ok();
  }
  void Done(const ChunkId& id, size_t len, Status st) {
    std::lock_guard lock(mu);
    inflight -= len;
    if (st.ok()) {
      stored.push_back(id);
    } else if (first.ok()) {
      first = std::move(st);
      cancelled = true;  // the puts not yet begun are skipped: the cut has failed
    }
    cv.notify_all();
  }
  // Waits for every put; the chunks stored go to `held`.
  Status Wait(std::vector<ChunkId>* held) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return inflight == 0; });
    held->insert(held->end(), stored.begin(), stored.end());
    stored.clear();
    return first;
  }

  std::mutex mu;
  std::condition_variable cv;
  const uint64_t limit;
  uint64_t inflight = 0;         // guarded by mu
  Status first;                  // guarded by mu
  std::vector<ChunkId> stored;   // guarded by mu
  std::atomic<bool> cancelled{false};
};

Status FileWriter::EmitChunk(const uint8_t* data, size_t len, Manifest* into) {
  ChunkId id = ChunkId::Of(data, len);
  if (adopted_ && sink_->PutsInPlace()) {
    // Cutting an adopted file from its start: `into` ends where this chunk begins in it.
    RETURN_IF_ERROR(sink_->PutInPlace(id, into->size(), len));
    held_.push_back(id);
  } else if (window_) {
    const size_t cost = ChunkCache::CopyFootprint(len);
    RETURN_IF_ERROR(window_->Reserve(cost));
    sink_->PutChunkAsync(id, data, len, &window_->cancelled,
                         [w = window_, id, cost](Status st) { w->Done(id, cost, std::move(st)); });
  } else {
    RETURN_IF_ERROR(sink_->PutChunk(id, data, len));
    held_.push_back(id);
  }
  into->Append(Extent{id, len});
  return Status::Ok();
}

Status FileWriter::ResumeTail() {
  tail_resumed_ = true;
  const Extent last = manifest_.extents().back();
  if (last.hole()) return Status::Ok();
  ASSIGN_OR_RETURN(ChunkRef chunk, sink_->GetChunk(last.id, last.len));
  manifest_.PopBack();
  buf_.Assign(chunk->bytes.get(), chunk->size);
  chunker_.Reset();
  return Status::Ok();
}

Status FileWriter::Truncate(uint64_t size) {
  if (!error_.ok()) return error_;
  Status st;
  if (mode_ == Mode::kStaging) {
    if (::ftruncate(staging_fd_, static_cast<off_t>(size)) != 0) {
      st = Status::FromErrno(errno, "truncate staging file " + staging_path_);
    }
  } else if (size >= stream_end()) {
    // Growing (a hole filled at commit), or cutting into the reorder window only.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->first >= size) {
        ReleasePending(it->second.size());
        it = pending_.erase(it);
        continue;
      }
      if (it->first + it->second.size() > size) {
        ReleasePending(it->first + it->second.size() - size);
        it->second.resize(size - it->first);
      }
      ++it;
    }
  } else {
    pending_.clear();
    ReleasePending(pending_bytes_);
    scanner_.reset();
    st = size >= manifest_.size() ? Status::Ok() : Rewind(size);
    if (st.ok()) {
      buf_.Resize(size - manifest_.size());
      chunker_.Reset();
    }
  }
  if (!st.ok()) return Fail(st);
  size_ = size;
  return Status::Ok();
}

Status FileWriter::PunchHole(uint64_t offset, uint64_t len) {
  if (!error_.ok()) return error_;
  const uint64_t end = std::min(size_, offset + std::min(len, UINT64_MAX - offset));
  if (offset >= end) return Status::Ok();
  Status st = mode_ == Mode::kStaging ? Status::Ok() : ToStaging();
  if (st.ok() && ::fallocate(staging_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                             static_cast<off_t>(offset), static_cast<off_t>(end - offset)) != 0) {
    if (errno != EOPNOTSUPP) {
      st = Status::FromErrno(errno, "punch a hole in staging file " + staging_path_);
    } else {  // a cache filesystem without holes: zeros, stored as one deduplicated chunk
      const auto& zeros = Zeros();
      for (uint64_t at = offset; st.ok() && at < end; at += kZeroBytes) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kZeroBytes, end - at));
        st = PwriteAll(staging_fd_, zeros.get(), n, at, staging_path_);
      }
    }
  }
  if (!st.ok()) return Fail(st);
  return Status::Ok();
}

// Cuts the stream back to `size` < manifest_.size(): the extent holding `size` is dropped with
// everything after it, and its surviving prefix goes back into the buffer.
Status FileWriter::Rewind(uint64_t size) {
  size_t idx = manifest_.Find(size);
  const uint64_t start = manifest_.StartOf(idx);
  const Extent ext = manifest_.extents()[idx];
  while (manifest_.extents().size() > idx) manifest_.PopBack();
  buf_.clear();
  if (ext.hole()) {
    manifest_.AppendHole(size - start);
  } else if (size > start) {
    ASSIGN_OR_RETURN(ChunkRef chunk, sink_->GetChunk(ext.id, ext.len));
    buf_.Assign(chunk->bytes.get(), size - start);
  }
  tail_resumed_ = true;
  return Status::Ok();
}

Status FileWriter::ToStaging() {
  staging_path_ = sink_->NewStagingPath();
  staging_fd_ = ::open(staging_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (staging_fd_ < 0) return Status::FromErrno(errno, "create staging file " + staging_path_);
  mode_ = Mode::kStaging;
  metrics_->staging_switches.Add(1);
  const auto& ext = manifest_.extents();
  for (size_t i = 0; i < ext.size(); ++i) {
    if (ext[i].hole()) continue;
    ASSIGN_OR_RETURN(ChunkRef c, sink_->GetChunk(ext[i].id, ext[i].len));
    RETURN_IF_ERROR(PwriteAll(staging_fd_, c->bytes.get(), c->size, manifest_.StartOf(i),
                              staging_path_));
  }
  RETURN_IF_ERROR(PwriteAll(staging_fd_, buf_.data(), buf_.size(), manifest_.size(), staging_path_));
  // size_ does not count the write being handled yet (Write updates it afterwards), and that write
  // may be among pending_ (the one that overflowed the window): the file must keep its bytes.
  uint64_t staged_size = size_;
  for (const auto& [off, bytes] : pending_) {
    RETURN_IF_ERROR(PwriteAll(staging_fd_, bytes.data(), bytes.size(), off, staging_path_));
    staged_size = std::max<uint64_t>(staged_size, off + bytes.size());
  }
  if (::ftruncate(staging_fd_, static_cast<off_t>(staged_size)) != 0) {
    return Status::FromErrno(errno, "truncate staging file " + staging_path_);
  }
  manifest_ = Manifest();
  buf_.Release();
  pending_.clear();
  ReleasePending(pending_bytes_);
  return Status::Ok();
}

Status FileWriter::Read(uint64_t offset, size_t len, std::vector<ReadSlice>* out) {
  // No sticky error here: a failed write leaves the state as it was before that write.
  const uint64_t end = std::min<uint64_t>(offset + len, size_);
  if (offset >= end) return Status::Ok();
  if (mode_ == Mode::kStaging) {
    const size_t n = static_cast<size_t>(end - offset);
    std::shared_ptr<uint8_t[]> buf(new uint8_t[n]);
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(staging_fd_, buf.get() + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::FromErrno(errno, "read staging file " + staging_path_);
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    std::memset(buf.get() + got, 0, n - got);
    out->push_back(ReadSlice{buf, buf.get(), n});
    return Status::Ok();
  }
  uint64_t pos = offset;
  while (pos < end) {
    if (pos < manifest_.size()) {
      const uint64_t n = std::min(manifest_.size(), end) - pos;
      RETURN_IF_ERROR(ReadManifest(
          manifest_, pos, n,
          [this](const ChunkId& id, size_t l) { return sink_->GetChunk(id, l); }, out));
      pos += n;
    } else if (pos < stream_end()) {
      const uint64_t n = std::min(stream_end(), end) - pos;
      AppendCopy(buf_.data() + (pos - manifest_.size()), static_cast<size_t>(n), out);
      pos += n;
    } else {
      auto it = pending_.upper_bound(pos);
      if (it != pending_.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second.size() > pos) {
          const uint64_t n = std::min<uint64_t>(prev->first + prev->second.size(), end) - pos;
          AppendCopy(prev->second.data() + (pos - prev->first), static_cast<size_t>(n), out);
          pos += n;
          continue;
        }
      }
      const uint64_t gap_end = it == pending_.end() ? end : std::min(end, it->first);
      AppendZeros(gap_end - pos, out);
      pos = gap_end;
    }
  }
  return Status::Ok();
}

Result<Manifest> FileWriter::Finish() {
  if (!error_.ok()) return error_;
  if (mode_ == Mode::kStaging) {
    auto m = ChunkStagingFile();
    if (!m.ok()) return Fail(m.status());
    return m;
  }
  Status st;
  for (auto& [off, bytes] : pending_) {
    if (off > stream_end()) {
      scanner_.reset();
      st = CutChunks(true);
      if (!st.ok()) break;
      manifest_.AppendHole(off - manifest_.size());
    }
    buf_.Append(bytes.data(), bytes.size());
    st = CutChunks(false);
    if (!st.ok()) break;
  }
  pending_.clear();
  ReleasePending(pending_bytes_);
  if (st.ok()) st = CutChunks(true);
  if (!st.ok()) return Fail(st);
  manifest_.AppendHole(size_ - manifest_.size());
  return std::move(manifest_);
}

Result<Manifest> FileWriter::ChunkStagingFile() {
  window_ = std::make_shared<PutWindow>(kPutWindow);
  // Every put is waited for, whatever the outcome (an exception too): the chunks stored are held
  // either way.
  struct WaitPuts {
    FileWriter& w;
    Status Run() {
      Status st = w.window_->Wait(&w.held_);
      w.window_.reset();
      return st;
    }
    ~WaitPuts() {
      if (w.window_) (void)Run();
    }
  } wait{*this};
  auto m = CutStagingFile();
  Status puts = wait.Run();
  if (!m.ok()) return m.status();
  if (!puts.ok()) return puts;
  return m;
}

Result<Manifest> FileWriter::CutStagingFile() {
  Manifest m;
  // With help, more at a time: the other threads each get a part of what is read.
  const size_t max = ahead_pool_ ? kAheadRead : chunker_.options().max_bytes;
  TailBuffer buf;
  chunker_.Reset();
  ahead_.Clear();
  ahead_dense_until_ = 0;
  cutting_staged_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{cutting_staged_};
  scanner_ = scanners_ ? scanners_() : nullptr;
  auto cut_all = [&](bool final) { return CutInto(buf, final, &m); };
  // Walk the data regions, so that a sparse file's holes stay holes.
  uint64_t pos = 0;
  while (pos < size_) {
    off_t data = ::lseek(staging_fd_, static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0 && errno != ENXIO) return Status::FromErrno(errno, "seek staging file");
    uint64_t data_start = data < 0 ? size_ : std::min<uint64_t>(static_cast<uint64_t>(data), size_);
    if (data_start > pos) {
      scanner_.reset();  // a hole: the scanner would lose its place
      RETURN_IF_ERROR(cut_all(true));
      m.AppendHole(data_start - pos);
      pos = data_start;
      continue;
    }
    off_t hole = ::lseek(staging_fd_, static_cast<off_t>(pos), SEEK_HOLE);
    uint64_t data_end = hole < 0 ? size_ : std::min<uint64_t>(static_cast<uint64_t>(hole), size_);
    while (pos < data_end) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(max, data_end - pos));
      size_t at = buf.size();
      buf.Grow(at + want);
      ssize_t r = ::pread(staging_fd_, buf.data() + at, want, static_cast<off_t>(pos));
      if (r < 0 && errno == EINTR) {
        buf.Resize(at);
        continue;
      }
      if (r <= 0) return Status::FromErrno(r < 0 ? errno : EIO, "read staging file");
      buf.Resize(at + static_cast<size_t>(r));
      Scan(buf.data() + at, static_cast<size_t>(r));
      pos += static_cast<uint64_t>(r);
      RETURN_IF_ERROR(cut_all(false));
    }
  }
  RETURN_IF_ERROR(cut_all(true));
  return m;
}

}  // namespace ckptfs
