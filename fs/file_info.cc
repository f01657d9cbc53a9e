// The computed attributes: what ckptfs knows about a checkpoint file, for loaders, the GPU module
// and `ckptfs inspect`. They describe the file's committed bytes (a view file's: its recipe's), are
// computed on first use and cached per (inode, size, mtime), and are not listed by listxattr (so
// `getfattr -d` over a tree does not parse every file).
#include <spdlog/spdlog.h>

#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <string_view>

#include "common/xattr.h"
#include "formats/describe.h"
#include "fs/fs_ops.h"

namespace ckptfs::fs {

namespace {

constexpr std::string_view kChunks = "user.ckptfs.chunks";
constexpr std::string_view kState = "user.ckptfs.state";
// Per remote tier, nearest first: JSON {"tiers":[{"backend":URL,"state":...},...]}.
constexpr std::string_view kTiers = "user.ckptfs.tiers";
constexpr std::string_view kCached = "user.ckptfs.cached";
// "1" while the file, or a file under the directory, is open (`ckptfs retain` skips it).
constexpr std::string_view kBusy = "user.ckptfs.busy";
// user.ckptfs.fsck[.deep][.repair]: runs Store::Fsck on the file or tree (`ckptfs fsck`).
constexpr std::string_view kFsck = "user.ckptfs.fsck";
// The kernel passes attribute values of at most 64 KiB; longer tensor lists come in pages.
constexpr size_t kMaxValue = 64 * 1024;

struct Described {
  uint64_t ino = 0, size = 0;
  int64_t mtime_ns = 0;
  Result<FileDescription> desc = FileDescription{};
  std::vector<size_t> page_starts;  // tensor index where each page starts
};

}  // namespace

class FileInfoCache {
 public:
  std::shared_ptr<const Described> Get(const InodeRecord& rec) {
    std::lock_guard lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      const Described& d = **it;
      if (d.ino == rec.ino && d.size == rec.size && d.mtime_ns == rec.mtime_ns) {
        lru_.splice(lru_.begin(), lru_, it);
        return lru_.front();
      }
    }
    return nullptr;
  }
  void Put(std::shared_ptr<const Described> d) {
    std::lock_guard lock(mu_);
    lru_.push_front(std::move(d));
    if (lru_.size() > kEntries) lru_.pop_back();
  }

 private:
  static constexpr size_t kEntries = 32;
  std::mutex mu_;
  std::list<std::shared_ptr<const Described>> lru_;
};

namespace {

// Describes a file of `size` bytes whose ranges `read` hands over as slices, without a copy.
Result<FileDescription> DescribeSlices(
    uint64_t size, const std::function<Status(uint64_t, size_t, std::vector<ReadSlice>*)>& read) {
  return DescribeFile("", size, [&](uint64_t off, size_t len) -> Result<std::string> {
    if (off > size || len > size - off) return Corrupt("read past the end of the file");
    std::vector<ReadSlice> slices;
    RETURN_IF_ERROR(read(off, len, &slices));
    std::string out;
    out.reserve(len);
    for (const ReadSlice& s : slices) out.append(reinterpret_cast<const char*>(s.data), s.len);
    return out;
  });
}

// Reads the committed bytes through one manifest snapshot.
Result<FileDescription> DescribeOnce(Store& store, const Manifest& m) {
  return DescribeSlices(m.size(), [&](uint64_t off, size_t len, std::vector<ReadSlice>* out) {
    return store.ReadCommitted(m, off, len, out);
  });
}

// A view file's bytes, read through its recipe (opening it first computes its CRCs, once: the
// cost its first read would pay anyway, and the bytes go to the page cache as on a FUSE open).
Result<FileDescription> DescribeView(Context& ctx, fuse_ino_t ino, uint64_t size) {
  ViewTree& views = *ctx.views;
  Status open = views.Open(ino, PageCacheStore(ctx, ino));
  if (open.code() == Code::kIsDir) return Status(Code::kNoData, "a directory");
  RETURN_IF_ERROR(open);
  return DescribeSlices(size, [&](uint64_t off, size_t len, std::vector<ReadSlice>* out) {
    return views.Read(ino, off, len, out);
  });
}

Result<std::shared_ptr<const Described>> Describe(Context& ctx, fuse_ino_t ino) {
  const bool view = IsViewIno(ino);
  ASSIGN_OR_RETURN(InodeRecord rec, view ? ctx.views->GetAttr(ino) : ctx.store->GetAttr(ino));
  if (auto hit = ctx.info->Get(rec)) return hit;
  auto d = std::make_shared<Described>();
  d->ino = rec.ino;
  d->size = rec.size;
  d->mtime_ns = rec.mtime_ns;
  if (view) {
    d->desc = DescribeView(ctx, ino, rec.size);
    if (!d->desc.ok() && d->desc.status().code() == Code::kNoData) return d->desc.status();
  }
  // A chunk may be reclaimed under a snapshot when the file is replaced meanwhile: retry.
  for (int attempt = 0; !view; ++attempt) {
    ASSIGN_OR_RETURN(auto m, ctx.store->CommittedManifest(ino));
    d->desc = DescribeOnce(*ctx.store, *m);
    if (d->desc.ok() || d->desc.status().code() != Code::kNotFound || attempt == 2) break;
  }
  if (!d->desc.ok()) {
    // Once per version of the file (the description is cached): the reader gets EIO.
    ctx.log->warn("inode {}: cannot describe its checkpoint: {}", ino, d->desc.status().ToString());
  } else {
    const auto& tensors = d->desc->tensors;
    for (size_t i = 0; i < tensors.size();) {
      d->page_starts.push_back(i);
      TensorsJson(tensors, i, kMaxValue, &i);
    }
  }
  ctx.info->Put(d);
  return std::shared_ptr<const Described>(d);
}

}  // namespace

std::shared_ptr<FileInfoCache> NewFileInfoCache() { return std::make_shared<FileInfoCache>(); }

bool IsComputedXattr(std::string_view name) {
  return name == kXattrFormat || name == kChunks || name == kState || name == kTiers ||
         name == kCached ||
         name == kFsck || name == kBusy || name == "user.ckptfs.fsck.deep" || name == "user.ckptfs.fsck.repair" ||
         name == "user.ckptfs.fsck.deep.repair" ||
         name == kPrefetchXattr || name.substr(0, kXattrTensors.size()) == kXattrTensors;
}

Result<std::string> ComputedXattr(Context& ctx, fuse_ino_t ino, std::string_view name) {
  if (!IsComputedXattr(name)) return Status(Code::kNoData, "not a computed attribute");
  // A view file has no chunks, remote state or cache of its own: only what it holds.
  if (IsViewIno(ino) && name != kXattrFormat &&
      name.substr(0, kXattrTensors.size()) != kXattrTensors) {
    return Status(Code::kNoData, "not an attribute of a view file");
  }
  if (name == kState) return ctx.store->RemoteState(ino);
  if (name == kTiers) return ctx.store->TierStates(ino);
  if (name == kBusy) {
    ASSIGN_OR_RETURN(bool busy, ctx.store->Busy(ino));
    return std::string(busy ? "1" : "0");
  }
  if (name.substr(0, kFsck.size()) == kFsck) {
    Store::FsckOptions o;
    o.deep = name.find(".deep") != std::string_view::npos;
    o.repair = name.find(".repair") != std::string_view::npos;
    ASSIGN_OR_RETURN(Store::FsckReport r, ctx.store->Fsck(ino, o));
    // The report must fit one attribute value: long paths and lines go first (the counts stay;
    // damaged_files still says how many files lost bytes).
    std::string json = r.Json();
    while (json.size() > kMaxValue && !(r.damaged.empty() && r.problems.empty())) {
      auto& longer = r.problems.size() >= r.damaged.size() ? r.problems : r.damaged;
      longer.pop_back();
      json = r.Json();
    }
    return json;
  }
  if (name == kPrefetchXattr) return std::string(ctx.store->Prefetching(ino) ? "1" : "0");
  if (name == kCached) {
    ASSIGN_OR_RETURN(Store::CacheUsage u, ctx.store->Cached(ino));
    return "{\"bytes\":" + std::to_string(u.bytes) +
           ",\"cached_bytes\":" + std::to_string(u.cached_bytes) +
           ",\"files\":" + std::to_string(u.files) + ",\"chunks\":" + std::to_string(u.chunks) +
           ",\"cached_chunks\":" + std::to_string(u.cached_chunks) + "}";
  }
  if (name == kChunks) {
    ASSIGN_OR_RETURN(auto m, ctx.store->CommittedManifest(ino));
    ASSIGN_OR_RETURN(Store::ChunkUsage u, ctx.store->Usage(*m));
    return "{\"chunks\":" + std::to_string(u.chunks) + ",\"bytes\":" + std::to_string(u.bytes) +
           ",\"shared_chunks\":" + std::to_string(u.shared_chunks) +
           ",\"shared_bytes\":" + std::to_string(u.shared_bytes) + "}";
  }
  ASSIGN_OR_RETURN(auto d, Describe(ctx, ino));
  // A damaged checkpoint: its format is still named; its tensors are the error.
  if (name == kXattrFormat)
    return std::string(FormatName(d->desc.ok() ? d->desc->format : FileFormat::kUnknown));
  if (!d->desc.ok()) return d->desc.status();
  const auto& tensors = d->desc->tensors;
  size_t next = 0;
  if (name == kXattrTensors) {
    std::string all = TensorsJson(tensors, 0, SIZE_MAX, &next);
    if (all.size() > kMaxValue) {
      return Status(Code::kValueTooLarge,
                    "tensor list is " + std::to_string(all.size()) +
                        " bytes, more than an attribute can hold: read user.ckptfs.tensors.pages "
                        "and user.ckptfs.tensors.0, .1, ...");
    }
    return all;
  }
  if (name == kXattrTensorPages) {
    return std::to_string(std::max<size_t>(d->page_starts.size(), 1));
  }
  const std::string_view index = name.substr(kXattrTensors.size());
  size_t page = 0;
  if (index.size() < 2 || index[0] != '.' || index.size() > 12) {
    return Status(Code::kNoData, "no such attribute");
  }
  for (char c : index.substr(1)) {
    if (c < '0' || c > '9') return Status(Code::kNoData, "no such attribute");
    page = page * 10 + static_cast<size_t>(c - '0');
  }
  if (page == 0 && d->page_starts.empty()) return std::string("[]");
  if (page >= d->page_starts.size()) return Status(Code::kNoData, "no such tensor page");
  return TensorsJson(tensors, d->page_starts[page], kMaxValue, &next);
}

}  // namespace ckptfs::fs
