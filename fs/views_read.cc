// Running a planned view file: its first open's CRC pass, its reads, readahead over its sources.
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "reshard/view_pages.h"
#include "fs/views_internal.h"

namespace ckptfs::fs {

namespace {

// Streams source bytes [off, off + len) of source s to sink, a few MiB at a time.
Status ReadSource(const Sources& src, uint32_t s, uint64_t off, uint64_t len,
                  const std::function<void(const uint8_t*, size_t)>& sink) {
  constexpr uint64_t kStep = 8 << 20;
  for (uint64_t at = 0; at < len; at += kStep) {
    std::vector<ReadSlice> slices;
    const uint64_t n = std::min(kStep, len - at);
    Status st = src.files[s]->Read(off + at, n, &slices);
    if (st.code() == Code::kNotFound) {
      return IoError("a source file of the view changed since it was planned");
    }
    RETURN_IF_ERROR(st);
    uint64_t got = 0;
    for (const ReadSlice& sl : slices) {
      sink(sl.data, sl.len);
      got += sl.len;
    }
    if (got != n) return Corrupt("a source file of the view is shorter than planned");
  }
  return Status::Ok();
}

}  // namespace

Status ViewTree::Open(uint64_t ino, const reshard::ViewBytesFn& seen) {
  ASSIGN_OR_RETURN(std::shared_ptr<Body> body, BodyOf(ino));
  std::lock_guard lock(body->mu);
  if (body->ready) return Status::Ok();
  if (!body->file.crc_tasks.empty()) {
    const Sources& src = *body->sources;
    auto read = [&](uint32_t s, uint64_t off, uint64_t len,
                    const std::function<void(const uint8_t*, size_t)>& sink) {
      WarmAhead(*body, s, off + len);
      return ReadSource(src, s, off, len, sink);
    };
    auto known = [&](uint32_t s, uint64_t off, uint64_t len) -> std::optional<uint32_t> {
      const auto& recs = src.records[s];
      auto it = recs.find(off);
      if (it != recs.end() && it->second.first == len) return it->second.second;
      return std::nullopt;
    };
    // Several records at once: the pass is bound by reading the sources. What it reads goes to
    // the page cache in whole pages, the pages around record boundaries once the headers hold
    // their CRCs, so that a reader of the whole file makes no FUSE read.
    std::optional<reshard::ViewPages> pages;
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    if (seen) pages.emplace(body->file.recipe.size(), page, seen);
    RETURN_IF_ERROR(reshard::ComputeCrcs(&body->file, read, known, kCrcThreads,
                                         pages ? pages->Sink() : nullptr));
    if (pages) pages->Finish(body->file.recipe);
  }
  body->ready = true;
  return Status::Ok();
}

void ViewTree::WarmAhead(Body& body, uint32_t source, uint64_t reached) {
  // A view reads each source front to back (rows in order), so the next bytes of a source are
  // the ones to load while this read is served.
  constexpr uint64_t kWindow = 64 << 20;
  uint64_t from, to;
  {
    std::lock_guard lock(body.warm_mu);
    if (body.warmed.size() != body.sources->files.size()) {
      body.warmed.assign(body.sources->files.size(), 0);
    }
    uint64_t& w = body.warmed[source];
    if (w >= reached + kWindow / 2) return;
    from = std::max(w, reached);
    to = reached + kWindow;
    w = to;
  }
  body.sources->files[source]->Warm(from, to - from);
}

Status ViewTree::Read(uint64_t ino, uint64_t offset, size_t len, std::vector<ReadSlice>* out) {
  ASSIGN_OR_RETURN(std::shared_ptr<Body> body, BodyOf(ino));
  {
    std::lock_guard lock(body->mu);
    if (!body->ready) return Internal("view file read before open");
  }
  return body->file.recipe.Walk(offset, len, [&](const reshard::Piece& pc) -> Status {
    if (pc.literal) {
      out->push_back(ReadSlice{body, pc.literal, pc.len});  // the body keeps the bytes alive
      return Status::Ok();
    }
    if (pc.mean) {  // computed: read the ranges it averages, into a buffer of its own
      std::shared_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[pc.len]);
      if (!buf) return IoError("no memory for a view's computed bytes");
      auto read = [&](uint32_t s, uint64_t off, uint64_t len,
                      const std::function<void(const uint8_t*, size_t)>& sink) {
        return ReadSource(*body->sources, s, off, len, sink);
      };
      RETURN_IF_ERROR(reshard::MeanBytes(pc, read, buf.get()));
      out->push_back(ReadSlice{buf, buf.get(), pc.len});
      return Status::Ok();
    }
    WarmAhead(*body, pc.source, pc.offset + pc.len);
    const size_t before = out->size();
    Status st = body->sources->files[pc.source]->Read(pc.offset, pc.len, out);
    if (st.code() == Code::kNotFound) {
      return IoError("a source file of the view changed since it was planned");
    }
    RETURN_IF_ERROR(st);
    uint64_t got = 0;
    for (size_t i = before; i < out->size(); ++i) got += (*out)[i].len;
    if (got != pc.len) return Corrupt("a source file of the view is shorter than planned");
    return Status::Ok();
  });
}

Result<std::vector<uint64_t>> ViewTree::SourceIds(uint64_t ino) {
  ASSIGN_OR_RETURN(std::shared_ptr<Body> body, BodyOf(ino));
  std::vector<uint64_t> ids;
  if (!body->sources) return ids;
  std::vector<bool> used(body->sources->inos.size(), false);
  for (const reshard::Segment& s : body->file.recipe.segments()) {
    for (const reshard::Part& p : s.parts) used[p.source] = true;
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (used[i]) ids.push_back(body->sources->inos[i]);
  }
  return ids;
}

}  // namespace ckptfs::fs
