// DirSource: the views' sources in a plain directory (ckptfs convert, ckptfs inspect --view).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>

#include "fs/checkpoint_source.h"

namespace ckptfs::fs {
namespace {

int64_t Ns(const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

Status Errno(const std::string& what, int err) {
  if (err == ENOENT || err == ENOTDIR) return NotFound(what);
  return IoError(what + ": " + std::strerror(err));
}

class DirFile final : public SourceFile {
 public:
  DirFile(int fd, const struct stat& st, std::string path)
      : fd_(fd), st_(st), path_(std::move(path)) {}
  ~DirFile() override { ::close(fd_); }
  uint64_t size() const override { return static_cast<uint64_t>(st_.st_size); }

  Status Read(uint64_t offset, uint64_t len, std::vector<ReadSlice>* out) const override {
    if (offset >= size()) return Status::Ok();
    return PreadSlice(fd_, offset, std::min(len, size() - offset), path_, out);
  }

  void Warm(uint64_t offset, uint64_t len) const override {
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(len),
                          POSIX_FADV_WILLNEED);
  }

  bool SameVersion(const SourceFile& now) const override {
    const auto* o = dynamic_cast<const DirFile*>(&now);
    return o && o->st_.st_dev == st_.st_dev && o->st_.st_ino == st_.st_ino &&
           o->st_.st_size == st_.st_size && Ns(o->st_.st_mtim) == Ns(st_.st_mtim) &&
           Ns(o->st_.st_ctim) == Ns(st_.st_ctim);
  }

 private:
  const int fd_;
  const struct stat st_;
  const std::string path_;
};

}  // namespace

Status PreadSlice(int fd, uint64_t offset, uint64_t len, const std::string& path,
                  std::vector<ReadSlice>* out) {
  std::shared_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[len]);
  if (!buf) return IoError("no memory to read " + path);
  uint64_t got = 0;
  while (got < len) {
    const ssize_t n = ::pread(fd, buf.get() + got, len - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("read " + path + ": " + std::strerror(errno));
    if (n == 0) break;  // the file shrank: the caller finds the bytes short
    got += static_cast<uint64_t>(n);
  }
  if (got) out->push_back(ReadSlice{buf, buf.get(), got});
  return Status::Ok();
}

// Ids are handed out per path on first sight and kept for the life of the source.
struct DirSource::Ids {
  std::mutex mu;
  std::vector<std::string> paths;                      // guarded by mu; id = index + 1
  std::unordered_map<std::string, uint64_t> by_path;  // guarded by mu

  uint64_t Of(const std::string& path) {
    std::lock_guard lock(mu);
    auto [it, added] = by_path.emplace(path, paths.size() + 1);
    if (added) paths.push_back(path);
    return it->second;
  }
  Result<std::string> Path(uint64_t id) {
    std::lock_guard lock(mu);
    if (id == 0 || id > paths.size()) return NotFound("no such source id");
    return paths[id - 1];
  }
};

namespace {

Result<InodeRecord> Stat(const std::string& path, uint64_t id) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Errno(path, errno);
  InodeRecord r;
  r.ino = id;
  r.mode = st.st_mode;
  r.uid = st.st_uid;
  r.gid = st.st_gid;
  r.nlink = static_cast<uint32_t>(st.st_nlink);
  r.size = static_cast<uint64_t>(st.st_size);
  r.atime_ns = Ns(st.st_atim);
  r.mtime_ns = Ns(st.st_mtim);
  r.ctime_ns = Ns(st.st_ctim);
  r.data_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  return r;
}

}  // namespace

Result<std::unique_ptr<DirSource>> DirSource::Make(const std::string& root) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) return IoError(root + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return Invalid(root + " is not a directory");
  auto ids = std::make_unique<Ids>();
  ids->Of(root);  // kRootId
  return std::unique_ptr<DirSource>(new DirSource(std::move(ids)));
}

DirSource::DirSource(std::unique_ptr<Ids> ids) : ids_(std::move(ids)) {}
DirSource::~DirSource() = default;

Result<InodeRecord> DirSource::Lookup(uint64_t dir, std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos) {
    return NotFound(std::string(name));
  }
  ASSIGN_OR_RETURN(std::string base, ids_->Path(dir));
  const std::string path = base + "/" + std::string(name);
  ASSIGN_OR_RETURN(InodeRecord r, Stat(path, 0));
  r.ino = ids_->Of(path);
  return r;
}

Result<InodeRecord> DirSource::GetAttr(uint64_t id) {
  ASSIGN_OR_RETURN(std::string path, ids_->Path(id));
  return Stat(path, id);
}

Status DirSource::ReadDir(uint64_t dir, uint64_t offset,
                          const std::function<bool(const DirItem&)>& fn) {
  ASSIGN_OR_RETURN(std::string path, ids_->Path(dir));
  DIR* d = ::opendir(path.c_str());
  if (!d) return Errno(path, errno);
  std::vector<std::pair<std::string, uint32_t>> names;  // sorted: the same order every time
  while (dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n == "." || n == "..") continue;
    uint32_t type = 0;
    if (e->d_type == DT_DIR) type = S_IFDIR;
    if (e->d_type == DT_REG) type = S_IFREG;
    if (e->d_type == DT_LNK) type = S_IFLNK;
    names.emplace_back(std::string(n), type);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  if (offset < 1 && !fn(DirItem{".", dir, S_IFDIR, 1})) return Status::Ok();
  if (offset < 2 && !fn(DirItem{"..", dir, S_IFDIR, 2})) return Status::Ok();
  for (size_t i = offset > 2 ? offset - 2 : 0; i < names.size(); ++i) {
    const std::string child = path + "/" + names[i].first;
    uint32_t type = names[i].second;
    if (type == 0 || type == S_IFLNK) {  // as stat sees it (links followed)
      struct stat st;
      if (::stat(child.c_str(), &st) != 0) continue;
      type = st.st_mode & S_IFMT;
    }
    if (!fn(DirItem{names[i].first, ids_->Of(child), type, i + 3})) break;
  }
  return Status::Ok();
}

Result<std::shared_ptr<const SourceFile>> DirSource::Open(uint64_t file) {
  ASSIGN_OR_RETURN(std::string path, ids_->Path(file));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno(path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno(path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status(Code::kIsDir, path);
  }
  return std::shared_ptr<const SourceFile>(std::make_shared<DirFile>(fd, st, path));
}

std::string DirSource::Describe(uint64_t dir) {
  auto path = ids_->Path(dir);
  return path.ok() ? *path : "";
}

}  // namespace ckptfs::fs
