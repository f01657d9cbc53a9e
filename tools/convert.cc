// ckptfs convert SRC DST --view SPEC, and ckptfs inspect ROOT --view SPEC off a mount: a view
// planned and read without a daemon, over a plain directory of checkpoint files (a mount's path
// is one too, read through the mount) by the same code the mount's .views tree runs: the same
// specs, bytes, refusals and reasons.
#include <fcntl.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/open.h"
#include "fs/checkpoint_source.h"
#include "fs/views.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ckptfs {
namespace {

struct OfflineView {
  std::unique_ptr<fs::CheckpointSource> source;
  uint64_t root = 0;  // the checkpoint directory's id in source
  std::shared_ptr<fs::ViewTree> tree;
  uint64_t spec = 0;  // the spec directory's inode in the tree
};

struct ViewFileEntry {
  std::string path;  // relative to the spec directory
  uint64_t ino = 0, size = 0;
};

// Plans view `spec` of checkpoint directory `root`: a plain directory, or with `from.cache_dir`,
// a directory of that unmounted cache directory's namespace, its evicted chunks read from the
// tiers `from.backends` names. Errors carry the reason the mount would log and keep in
// user.ckptfs.view_errors.
Result<OfflineView> PlanOffline(const std::string& root, const OfflineFrom& from,
                                const std::string& spec, const std::string& rules) {
  OfflineView v;
  if (from.cache_dir.empty()) {
    if (!from.backends.empty()) return Invalid("--backend reads a cache directory's evicted chunks: "
                                            "give --cache-dir too");
    ASSIGN_OR_RETURN(v.source, fs::DirSource::Make(root));
    v.root = fs::DirSource::kRootId;
  } else {
    std::vector<std::unique_ptr<Backend>> tiers;
    for (const std::string& url : from.backends) {
      auto b = OpenBackend({url, from.s3_endpoint, ""});
      if (!b.ok()) return Status(b.status().code(), url + ": " + b.status().message());
      tiers.push_back(std::move(*b));
    }
    ASSIGN_OR_RETURN(v.source,
                     fs::OpenCacheDirSource(from.cache_dir, root, &v.root, std::move(tiers)));
  }
  // Refusals come back as errors with their reasons; the tree's own log lines would repeat them.
  auto log = std::make_shared<spdlog::logger>("views",
                                              std::make_shared<spdlog::sinks::null_sink_mt>());
  ASSIGN_OR_RETURN(v.tree, fs::ViewTree::Make(v.source.get(), log, rules));
  auto views = v.tree->LookupViews(v.root);
  if (!views.ok()) {
    if (views.status().code() != Code::kNotFound) return views.status();
    return NotFound(root + " holds no checkpoint ckptfs has views of (Megatron-LM, DeepSpeed, "
                    "PyTorch DCP)");
  }
  auto made = v.tree->Lookup(views->ino, spec);
  if (!made.ok()) {
    if (auto why = v.tree->ViewErrors(views->ino); why.ok()) {
      std::istringstream lines(*why);
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind(spec + ": ", 0) == 0) return Status(made.status().code(), "view " + line);
      }
    }
    return Status(made.status().code(), "view " + spec + ": " + made.status().message());
  }
  if (!S_ISDIR(made->mode)) return Invalid("view " + spec + " is not a directory of files");
  v.spec = made->ino;
  return v;
}

// Every file under view directory `dir`, depth first in name order.
Status ListFiles(fs::ViewTree& tree, uint64_t dir, const std::string& prefix,
                 std::vector<ViewFileEntry>* out) {
  std::vector<std::string> names;
  RETURN_IF_ERROR(tree.ReadDir(dir, 0, [&](const DirItem& item) {
    if (item.name != "." && item.name != "..") names.emplace_back(item.name);
    return true;
  }));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(InodeRecord rec, tree.Lookup(dir, name));
    const std::string path = prefix.empty() ? name : prefix + "/" + name;
    if (S_ISDIR(rec.mode)) {
      RETURN_IF_ERROR(ListFiles(tree, rec.ino, path, out));
    } else {
      out->push_back(ViewFileEntry{path, rec.ino, rec.size});
    }
  }
  return Status::Ok();
}

Status PwriteAll(int fd, const uint8_t* p, size_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return IoError("write " + path + ": " + std::strerror(errno));
    p += w;
    off += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Writes view file `f` to `path` (a new file) and starts its writeback. The first open's CRC pass
// reads the records on several threads; what it reads is written where it belongs as it comes
// (the pass's page-cache sink), so the sources are read once. The rest (zip headers, and every
// byte of a file the pass does not read) is read through the view, 8 MiB at a time: with the
// pass's buffers, the memory bound of a conversion.
Status WriteViewFile(fs::ViewTree& tree, const ViewFileEntry& f, const std::string& path,
                     const std::function<void(uint64_t)>& done_bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("create " + path + ": " + std::strerror(errno));
  std::mutex mu;
  Status st;                                          // guarded by mu: the first write error
  std::vector<std::pair<uint64_t, uint64_t>> written;  // guarded by mu: [offset, end)
  auto seen = [&](uint64_t off, const uint8_t* data, size_t len) {
    Status w = PwriteAll(fd, data, len, off, path);
    std::lock_guard lock(mu);
    if (!w.ok() && st.ok()) st = w;
    if (w.ok()) written.emplace_back(off, off + len);
  };
  Status opened = tree.Open(f.ino, seen);
  if (!opened.ok() && st.ok()) st = opened;
  std::sort(written.begin(), written.end());
  uint64_t done = 0;
  for (const auto& [a, b] : written) done += b - a;
  if (done) done_bytes(done);
  constexpr uint64_t kStep = 8 << 20;
  auto fill = [&](uint64_t from, uint64_t to) -> Status {  // bytes the pass did not write
    for (uint64_t at = from; at < to; at += kStep) {
      std::vector<ReadSlice> slices;
      const uint64_t n = std::min(kStep, to - at);
      RETURN_IF_ERROR(tree.Read(f.ino, at, n, &slices));
      uint64_t got = 0;
      for (const ReadSlice& sl : slices) {
        RETURN_IF_ERROR(PwriteAll(fd, sl.data, sl.len, at + got, path));
        got += sl.len;
      }
      if (got != n) return Corrupt("view file " + f.path + " read short");
      done_bytes(n);
    }
    return Status::Ok();
  };
  uint64_t at = 0;
  for (size_t i = 0; st.ok() && i <= written.size(); ++i) {
    const uint64_t next = i < written.size() ? written[i].first : f.size;
    if (next > at) st = fill(at, next);
    if (i < written.size()) at = std::max(at, written[i].second);
  }
  // Writeback starts now; the conversion syncs the filesystem once at the end.
  if (st.ok()) (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  ::close(fd);
  return st;
}

// fsync of directory `dir`, or with `whole_fs`, syncfs of its filesystem.
Status Sync(const std::string& dir, bool whole_fs) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("open " + dir + ": " + std::strerror(errno));
  const int rc = whole_fs ? ::syncfs(fd) : ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? Status::Ok() : IoError("sync " + dir + ": " + std::strerror(err));
}

// The source files (paths relative to the checkpoint root) view file `ino` reads.
std::string SourcesOf(OfflineView& v, uint64_t ino) {
  auto ids = v.tree->SourceIds(ino);
  if (!ids.ok() || ids->empty()) return "-";
  const std::string root = v.source->Describe(v.root);
  std::set<std::string> paths;
  for (uint64_t id : *ids) {
    const std::string p = v.source->Describe(id);
    paths.insert(p.rfind(root + "/", 0) == 0 ? p.substr(root.size() + 1) : p);
  }
  std::string out;
  for (const std::string& p : paths) out += (out.empty() ? "" : ",") + p;
  return out;
}

std::string Trimmed(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

bool OfflineFrom::Parse(const std::vector<std::string>& args, size_t* i) {
  const std::string& a = args[*i];
  if (*i + 1 >= args.size()) return false;
  if (a == "--cache-dir") {
    cache_dir = Trimmed(args[++*i]);
  } else if (a == "--backend") {
    backends.push_back(args[++*i]);
  } else if (a == "--s3-endpoint") {
    s3_endpoint = args[++*i];
  } else {
    return false;
  }
  return true;
}

int InspectViewOffline(const std::string& root_arg, const std::string& spec,
                       const OfflineFrom& from) {
  const std::string root = Trimmed(root_arg);
  auto v = PlanOffline(root, from, spec, "");
  if (!v.ok()) return Fail(v.status().message());
  std::vector<ViewFileEntry> files;
  if (Status st = ListFiles(*v->tree, v->spec, "", &files); !st.ok()) return Fail(st.message());
  uint64_t bytes = 0;
  for (const ViewFileEntry& f : files) {
    std::printf("%12llu  %s  <- %s\n", static_cast<unsigned long long>(f.size), f.path.c_str(),
                SourcesOf(*v, f.ino).c_str());
    bytes += f.size;
  }
  std::printf("view %s: %llu files, %llu bytes (planned without a mount)\n", spec.c_str(),
              static_cast<unsigned long long>(files.size()),
              static_cast<unsigned long long>(bytes));
  return 0;
}

int Convert(const std::vector<std::string>& args) {
  std::string src, dst, spec, rules;
  OfflineFrom from;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--view" && i + 1 < args.size()) {
      spec = args[++i];
    } else if (a == "--rules" && i + 1 < args.size()) {
      rules = args[++i];
    } else if (from.Parse(args, &i)) {
    } else if (src.empty()) {
      src = Trimmed(a);
    } else if (dst.empty()) {
      dst = Trimmed(a);
    } else {
      return Fail("convert takes one source and one destination");
    }
  }
  if (src.empty() || dst.empty() || spec.empty()) {
    return Fail("usage: ckptfs convert SRC DST --view SPEC [--cache-dir DIR [--backend URL]... "
                "[--s3-endpoint URL]] [--rules FILE]");
  }
  struct stat st {};
  if (::lstat(dst.c_str(), &st) == 0) return Fail(dst + " exists: convert writes a new directory");
  auto v = PlanOffline(src, from, spec, rules);
  if (!v.ok()) return Fail(v.status().message());
  std::vector<ViewFileEntry> files;
  if (Status s = ListFiles(*v->tree, v->spec, "", &files); !s.ok()) return Fail(s.message());
  uint64_t total = 0, done = 0;
  for (const ViewFileEntry& f : files) total += f.size;
  // Into a directory of its own beside DST, renamed to DST once every file is synced: DST
  // appears whole or not at all, and a failed conversion leaves nothing behind.
  const std::filesystem::path out(dst);
  const std::filesystem::path tmp =
      out.parent_path() / ("." + out.filename().string() + ".convert-" + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  if (ec) return Fail("create " + tmp.string() + ": " + ec.message());
  Progress progress;
  Status result;
  for (size_t i = 0; result.ok() && i < files.size(); ++i) {
    const std::filesystem::path path = tmp / files[i].path;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) {
      result = IoError("create " + path.parent_path().string() + ": " + ec.message());
      break;
    }
    result = WriteViewFile(*v->tree, files[i], path.string(), [&](uint64_t n) {
      done += n;
      progress.Show("convert " + spec + ": " + std::to_string(i + 1) + "/" +
                    std::to_string(files.size()) + " files, " + HumanBytes(done) + " of " +
                    HumanBytes(total));
    });
  }
  // Every file's bytes and every directory on the disk before DST appears: one syncfs of the
  // destination's filesystem (its other dirty data too) rather than a sync per file.
  if (result.ok()) result = Sync(tmp.string(), true);
  if (result.ok() && ::rename(tmp.c_str(), out.c_str()) != 0) {
    result = IoError("rename " + tmp.string() + " to " + dst + ": " + std::strerror(errno));
  }
  const std::string parent = out.parent_path().empty() ? "." : out.parent_path().string();
  if (result.ok()) result = Sync(parent, false);
  progress.Done();
  if (!result.ok()) {
    std::filesystem::remove_all(tmp, ec);
    return Fail(result.message());
  }
  std::printf("view %s of %s: %zu files, %s written to %s\n", spec.c_str(), src.c_str(),
              files.size(), HumanBytes(total).c_str(), dst.c_str());
  return 0;
}

}  // namespace ckptfs
