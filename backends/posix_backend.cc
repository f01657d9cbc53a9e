#include "backends/posix_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <string_view>
#include <thread>
#include <vector>

namespace ckptfs {

namespace {

// A Put whose directory keeps vanishing under it (each time another node's Delete prunes it)
// gives up after this many tries; one retry is all a real race ever needs.
constexpr int kMaxRenameAttempts = 32;
constexpr char kTempDirName[] = ".tmp";

// Status::FromErrno plus EACCES, which its table does not list: a directory the daemon may not
// write is a refused permission (kPermission), not an I/O failure.
Status Errno(int err, std::string what) {
  if (err == EACCES) return Status(Code::kPermission, what + ": " + std::strerror(err));
  return Status::FromErrno(err, std::move(what));
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string EscapeLead(std::string_view c) {
  std::string out;
  if (c.front() == '.' || c.front() == '%') out = "%";
  out += c;
  return out;
}

// The encoding of posix_backend.h: directories end in ".d", a file that would look like one (or
// like an escaped file) gets ".e", a leading '.' or '%' gets a '%'.
std::string FileName(std::string_view c) {
  std::string name = EscapeLead(c);
  if (EndsWith(c, ".d") || EndsWith(c, ".e")) name += ".e";
  return name;
}

std::string DirName(std::string_view c) { return EscapeLead(c) + ".d"; }

struct Decoded {
  std::string component;
  bool is_dir = false;
};

// The key component a directory entry stands for, or nothing for names we did not make (dot
// names, NFS leftovers, files dropped in by hand), so that List reports only keys that Get finds.
std::optional<Decoded> DecodeName(std::string_view name) {
  if (name.empty() || name.front() == '.') return std::nullopt;
  Decoded d;
  std::string_view base = name;
  if (EndsWith(name, ".d")) {
    d.is_dir = true;
    base.remove_suffix(2);
  } else if (EndsWith(name, ".e")) {
    base.remove_suffix(2);
  }
  if (!base.empty() && base.front() == '%') base.remove_prefix(1);
  if (base.empty() || base == "." || base == ".." || base.find('\n') != std::string_view::npos) {
    return std::nullopt;
  }
  d.component = base;
  if ((d.is_dir ? DirName(d.component) : FileName(d.component)) != name) return std::nullopt;
  return d;
}

// ObjectInfo::version: the inode and its mtime. Every Put writes a new file whose inode differs
// from the one it replaces (both exist until the rename), and an inode number freed since then and
// reused would still need the same mtime. No st_dev: NFS clients number devices each their own
// way, and the version should read the same on every node.
std::string VersionOf(const struct stat& st) {
  char v[64];
  std::snprintf(v, sizeof(v), "%llx-%lld.%09ld", static_cast<unsigned long long>(st.st_ino),
                static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec));
  return v;
}

std::string Parent(const std::string& path) { return path.substr(0, path.rfind('/')); }

std::string TempTag() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "host");
  char tag[HOST_NAME_MAX + 64];
  std::snprintf(tag, sizeof(tag), "%s.%d.%08x", host, static_cast<int>(::getpid()),
                static_cast<unsigned>(std::random_device()()));
  return tag;
}

}  // namespace

Result<std::unique_ptr<PosixBackend>> PosixBackend::Open(const std::string& root,
                                                         const PosixBackendOptions& options) {
  char* real = ::realpath(root.c_str(), nullptr);
  if (real == nullptr) {
    if (errno == ENOENT) {
      return NotFound("backend root " + root + " does not exist (it is not created implicitly)");
    }
    return Errno(errno, "resolving backend root " + root);
  }
  std::string abs = real;
  std::free(real);
  struct stat st;
  if (::stat(abs.c_str(), &st) != 0) return Errno(errno, "stat backend root " + abs);
  if (!S_ISDIR(st.st_mode)) {
    return Status(Code::kNotDir, "backend root " + abs + " is not a directory");
  }
  if (abs == "/") abs.clear();  // paths are built as root_ + "/" + ...

  std::unique_ptr<PosixBackend> b(new PosixBackend(abs, options, TempTag()));
  if (::mkdir(b->temp_dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    return Errno(errno, "creating the temporary directory " + b->temp_dir_);
  }
  DIR* d = ::opendir(b->temp_dir_.c_str());
  if (d == nullptr) return Errno(errno, "opening " + b->temp_dir_);
  const auto cutoff = std::chrono::system_clock::now() - options.stale_temp_age;
  const time_t cutoff_s = std::chrono::system_clock::to_time_t(cutoff);
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        st.st_mtime < cutoff_s && ::unlinkat(::dirfd(d), e->d_name, 0) == 0) {
      ++removed;
    }
  }
  ::closedir(d);
  if (removed > 0) {
    b->log_->info("removed {} stale temporary files (older than {} s) from {}", removed,
                  options.stale_temp_age.count(), b->temp_dir_);
  }
  return b;
}

PosixBackend::PosixBackend(std::string root, const PosixBackendOptions& options,
                           std::string temp_tag)
    : root_(std::move(root)),
      temp_dir_(root_ + "/" + kTempDirName),
      options_(options),
      temp_tag_(std::move(temp_tag)),
      log_(GetLogger("backend")) {}

std::string PosixBackend::PathOf(const std::string& key) const {
  std::string path = root_;
  size_t start = 0;
  while (true) {
    size_t slash = key.find('/', start);
    std::string_view part = std::string_view(key).substr(start, slash - start);
    path += '/';
    if (slash == std::string::npos) return path + FileName(part);
    path += DirName(part);
    start = slash + 1;
  }
}

Status PosixBackend::SyncDir(const std::string& dir) const {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, "opening directory " + dir + " to sync it");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Filesystems that cannot sync a directory say so with EINVAL: their entries need no sync.
  if (rc != 0 && err != EINVAL) return Errno(err, "fsync directory " + dir);
  return Status::Ok();
}

Status PosixBackend::MakeParents(const std::string& key) const {
  std::vector<std::string> dirs;  // ROOT/a.d, ROOT/a.d/b.d, ...
  std::string path = PathOf(key);
  for (size_t slash = path.find('/', root_.size() + 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    dirs.push_back(path.substr(0, slash));
  }
  for (int attempt = 0; attempt < kMaxRenameAttempts; ++attempt) {
    bool vanished = false;
    for (const std::string& dir : dirs) {
      if (::mkdir(dir.c_str(), 0755) == 0) {
        if (options_.fsync) RETURN_IF_ERROR(SyncDir(Parent(dir)));
      } else if (errno == ENOENT) {
        vanished = true;  // an ancestor was pruned after we made it: start again from the top
        break;
      } else if (errno != EEXIST) {
        return Errno(errno, "mkdir " + dir);
      }
    }
    if (!vanished) return Status::Ok();
  }
  return IoError("directories for " + key + " in " + root_ + " kept vanishing during mkdir");
}

Status PosixBackend::WriteTemp(const std::string& tmp, const void* data, size_t len) const {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(errno, "creating " + tmp);
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  Status s;
  while (done < len) {
    ssize_t n = ::write(fd, p + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      s = Errno(errno, "writing " + tmp);
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (s.ok() && options_.fsync && ::fsync(fd) != 0) s = Errno(errno, "fsync " + tmp);
  // NFS reports a failed write-back at close.
  if (::close(fd) != 0 && s.ok()) s = Errno(errno, "closing " + tmp);
  return s;
}

Status PosixBackend::Put(const std::string& key, const void* data, size_t len) {
  return Place(key, data, len, false);
}

Status PosixBackend::PutIfAbsent(const std::string& key, const void* data, size_t len) {
  return Place(key, data, len, true);
}

Status PosixBackend::Place(const std::string& key, const void* data, size_t len, bool exclusive) {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string path = PathOf(key);
  const std::string tmp = temp_dir_ + "/" + temp_tag_ + "." + std::to_string(temp_seq_++);
  const char* how = exclusive ? "linking " : "renaming ";
  Status s = WriteTemp(tmp, data, len);
  // The rename (link) comes first: the parents usually exist, and a mkdir is a metadata round
  // trip on a parallel filesystem. ENOENT means a parent is missing, or was pruned by a
  // concurrent Delete since our last mkdir; then make them and try again, holding off this
  // process's pruning (another node's can still strike: retry, backing off so that two loops
  // fall out of step).
  for (int attempt = 0; s.ok(); ++attempt) {
    std::shared_lock<std::shared_mutex> no_pruning;
    if (attempt > 0) {
      if (attempt > 1) {
        thread_local std::minstd_rand jitter(std::random_device{}());
        std::this_thread::sleep_for(std::chrono::microseconds(jitter() % (100 * attempt)));
      }
      no_pruning = std::shared_lock(prune_mu_);
      s = MakeParents(key);
      if (!s.ok()) break;
    }
    // link(2) is atomic and exclusive, also on NFS and Lustre: of concurrent creates, one wins.
    if ((exclusive ? ::link(tmp.c_str(), path.c_str()) : ::rename(tmp.c_str(), path.c_str())) ==
        0) {
      no_pruning = {};
      if (exclusive) ::unlink(tmp.c_str());
      if (options_.fsync) s = SyncDir(Parent(path));
      return s.ok() ? s : Status(s.code(), "storing " + key + ": " + s.message());
    }
    int err = errno;
    if (exclusive && (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP)) {
      // No hard links on this filesystem: an exclusive create written in place. Still one
      // winner of concurrent creates, but a reader may see it partly written (what PutIfAbsent
      // stores carries its own check: store/journal.h).
      no_pruning = {};
      s = WriteTemp(path, data, len);
      if (s.code() == Code::kExists) s = Status(Code::kExists, key + " exists in " + Describe());
      if (s.ok() && options_.fsync) s = SyncDir(Parent(path));
      break;
    }
    if (exclusive && err == EEXIST) {
      s = Status(Code::kExists, key + " exists in " + Describe());
      break;
    }
    if (err != ENOENT) {
      s = Errno(err, how + tmp + " to " + path);
    } else if (attempt + 1 == kMaxRenameAttempts) {
      // Not kNotFound: the caller asked to create something. The temporary file itself may be
      // what vanished (removed as stale after this Put stalled past stale_temp_age).
      s = IoError(how + tmp + " to " + path + ": " + std::strerror(err));
    }
  }
  ::unlink(tmp.c_str());
  if (s.ok() || s.code() == Code::kExists) return s;
  return Status(s.code(), "storing " + key + " in " + Describe() + ": " + s.message());
}

Result<size_t> PosixBackend::Get(const std::string& key, uint64_t offset, void* buf, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  ASSIGN_OR_RETURN(int fd, OpenObject(key));
  // The open descriptor pins one version of the object: a concurrent Put renames a new file over
  // the name, it does not change the bytes we read.
  Result<size_t> n = ReadAt(fd, static_cast<char*>(buf), len, offset, key);
  ::close(fd);
  return n;
}

Result<std::string> PosixBackend::GetObject(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  ASSIGN_OR_RETURN(int fd, OpenObject(key));
  // Size and bytes from one descriptor, so one version: no kCorrupt from a concurrent overwrite.
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Errno(errno, "fstat " + PathOf(key));
    ::close(fd);
    return s;
  }
  std::string data(static_cast<size_t>(st.st_size) + 1, '\0');
  Result<size_t> n = ReadAt(fd, data.data(), data.size(), 0, key);
  ::close(fd);
  if (!n.ok()) return n.status();
  if (*n != static_cast<uint64_t>(st.st_size)) {
    // Only a change in place (by something other than a Put) can do this.
    return Corrupt("object " + key + " in " + Describe() + " changed size while read (" +
                   std::to_string(*n) + " of " + std::to_string(st.st_size) + " bytes)");
  }
  data.resize(*n);
  return data;
}

Result<int> PosixBackend::OpenObject(const std::string& key) const {
  const std::string path = PathOf(key);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) return fd;
  if (errno == ENOENT || errno == ENOTDIR) {
    return NotFound("no object " + key + " in " + Describe());
  }
  return Errno(errno, "opening " + path);
}

Result<size_t> PosixBackend::ReadAt(int fd, char* buf, size_t len, uint64_t offset,
                                    const std::string& key) const {
  // Past off_t's range nothing can be stored.
  constexpr uint64_t kMaxOff = std::numeric_limits<off_t>::max();
  len = std::min<uint64_t>(len, offset >= kMaxOff ? 0 : kMaxOff - offset);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(errno, "reading " + PathOf(key));
    }
    if (n == 0) break;  // end of the object; a short read before it just loops
    done += static_cast<size_t>(n);
  }
  return done;
}

Result<ObjectInfo> PosixBackend::Head(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string path = PathOf(key);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return NotFound("no object " + key + " in " + Describe());
    }
    return Errno(errno, "stat " + path);
  }
  if (!S_ISREG(st.st_mode)) return Corrupt(path + " (object " + key + ") is not a regular file");
  return ObjectInfo{key, static_cast<uint64_t>(st.st_size), VersionOf(st)};
}

Status PosixBackend::Delete(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  const std::string path = PathOf(key);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Status::Ok();
    return Errno(errno, "unlink " + path);
  }
  PruneParents(key);
  return Status::Ok();
}

void PosixBackend::PruneParents(const std::string& key) const {
  // rmdir removes only empty directories, so this cannot take an object with it; a concurrent
  // Put that loses its directory this way makes it again (see Put).
  std::lock_guard lock(prune_mu_);
  std::string dir = Parent(PathOf(key));
  while (dir.size() > root_.size() && ::rmdir(dir.c_str()) == 0) dir = Parent(dir);
}

Status PosixBackend::List(const std::string& prefix, const std::string& start_after,
                          const std::function<bool(const ObjectInfo&)>& fn) {
  bool stop = false;
  return Walk(root_.empty() ? "/" : root_, "", prefix, start_after, fn, &stop);
}

Status PosixBackend::Walk(const std::string& dir, const std::string& key_prefix,
                          const std::string& prefix, const std::string& start_after,
                          const std::function<bool(const ObjectInfo&)>& fn, bool* stop) const {
  struct Entry {
    std::string key;  // the object's key, or the key prefix of a directory (ending in '/')
    std::string name;
    bool is_dir;
  };
  std::vector<Entry> entries;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    // A subdirectory pruned by a concurrent Delete after we read its name held nothing to list.
    if ((errno == ENOENT || errno == ENOTDIR) && !key_prefix.empty()) return Status::Ok();
    return Errno(errno, "listing " + dir);
  }
  while (true) {
    errno = 0;
    dirent* e = ::readdir(d);
    if (e == nullptr) break;
    std::optional<Decoded> dec = DecodeName(e->d_name);
    if (!dec) continue;
    std::string key = key_prefix + dec->component + (dec->is_dir ? "/" : "");
    if (dec->is_dir) {
      // Descend only where a key could both start with `prefix` and sort after `start_after`.
      if (!key.starts_with(prefix) && !prefix.starts_with(key)) continue;
      if (key < start_after && !start_after.starts_with(key)) continue;
    } else if (!key.starts_with(prefix) || key <= start_after) {
      continue;
    }
    entries.push_back(Entry{std::move(key), e->d_name, dec->is_dir});
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return Errno(err, "reading directory " + dir);

  // Every key below a directory starts with its key prefix, and no sibling's key starts with
  // that prefix (a component has no '/'), so sorting the siblings sorts the whole subtrees:
  // "a-b" < "a/..." < "a0", whatever order readdir or `ls` shows.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.key < b.key; });
  for (const Entry& entry : entries) {
    std::string path = dir + (dir.ends_with('/') ? "" : "/") + entry.name;
    if (entry.is_dir) {
      RETURN_IF_ERROR(Walk(path, entry.key, prefix, start_after, fn, stop));
      if (*stop) return Status::Ok();
      continue;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;  // deleted since we read the directory
      return Errno(errno, "stat " + path);
    }
    if (!S_ISREG(st.st_mode)) continue;
    if (!fn(ObjectInfo{entry.key, static_cast<uint64_t>(st.st_size), VersionOf(st)})) {
      *stop = true;
      return Status::Ok();
    }
  }
  return Status::Ok();
}

std::string PosixBackend::Describe() const { return "file://" + (root_.empty() ? "/" : root_); }

}  // namespace ckptfs
