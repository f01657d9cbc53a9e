// ckptfs retain ROOT --keep-last N [--keep-every K] [--dry-run]: deletes old checkpoints under
// ROOT through the mount (so every node sees the deletion), newest kept.
//
// Which directories of ROOT are checkpoints: Megatron-LM's iter_NNNNNNN, DeepSpeed's
// global_stepN, and directories holding a DCP .metadata (their step: the last number in the
// name). Where ROOT has none of these, every directory of ROOT is one, ordered by modification
// time. Never deleted: the last N, every K-th step, the one a tracker file names
// (latest_checkpointed_iteration.txt, latest, latest_universal), a pinned one (user.ckptfs.pin
// on it or anything in it), one with an open file (user.ckptfs.busy: being written or read).
#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "store/retention.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "tools/mount_table.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;

std::optional<uint64_t> Number(const std::string& s) {
  if (s.empty() || s.size() > 19 || !std::all_of(s.begin(), s.end(), ::isdigit)) return {};
  return std::stoull(s);
}

std::string ReadTrimmed(const fs::path& p) {
  std::ifstream in(p);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
  return s;
}

// Whether attribute `name` of p holds `value`; nullopt when that cannot be told (an error other
// than "no such attribute"), which the callers count as "yes": a check that fails keeps.
std::optional<bool> AttrIs(const fs::path& p, const char* name, const char* value) {
  char buf[16];
  const ssize_t n = ::lgetxattr(p.c_str(), name, buf, sizeof(buf));
  if (n < 0) return errno == ENODATA ? std::optional<bool>(false) : std::nullopt;
  return n == static_cast<ssize_t>(std::strlen(value)) && std::memcmp(buf, value, n) == 0;
}

// Why checkpoint directory p must stay now (open, pinned, or either cannot be told); empty: it
// may go. Asked right before its deletion.
std::string MustStay(const fs::path& p) {
  auto busy = AttrIs(p, "user.ckptfs.busy", "1");
  if (!busy) return "cannot tell whether a file in it is open";
  if (*busy) return "a file in it is open";
  auto pinned = AttrIs(p, "user.ckptfs.pin", "1");
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(p, ec); !ec && pinned == false &&
                                                         it != fs::end(it);
       it.increment(ec)) {
    pinned = AttrIs(it->path(), "user.ckptfs.pin", "1");
  }
  if (ec || !pinned) return "cannot tell whether it is pinned";
  return *pinned ? "pinned" : "";
}

uint64_t TreeBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}

// fs::remove_all, one entry at a time, counted on a terminal (a checkpoint may hold thousands
// of files, each a request to the daemon).
std::error_code RemoveWithProgress(const fs::path& dir, const std::string& name) {
  Progress progress;
  std::error_code ec;
  std::vector<fs::path> entries;  // parents before children
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    entries.push_back(it->path());
  }
  if (ec) return ec;
  for (size_t i = entries.size(); i-- > 0;) {
    if (!fs::remove(entries[i], ec) && ec) return ec;
    progress.Show("ckptfs retain: deleting " + name + ": " +
                  std::to_string(entries.size() - i) + " of " + std::to_string(entries.size()));
  }
  progress.Done();
  fs::remove(dir, ec);
  return ec;
}

int Usage() {
  std::fprintf(stderr, "usage: ckptfs retain ROOT --keep-last N [--keep-every K] [--dry-run]\n");
  return 2;
}

}  // namespace

int Retain(const std::vector<std::string>& args) {
  std::string root_arg;
  std::optional<uint64_t> keep_last, keep_every;
  bool dry_run = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: ckptfs retain ROOT --keep-last N [--keep-every K] [--dry-run]\n"
          "Deletes old checkpoints under ROOT (a directory in a ckptfs mount) through the mount.\n"
          "Checkpoints: Megatron iter_NNNNNNN, DeepSpeed global_stepN, directories with a DCP\n"
          ".metadata (step: the last number in the name); where there are none, every directory\n"
          "of ROOT, oldest first by modification time.\n"
          "Kept: the newest N, every K-th step, the one named by latest_checkpointed_iteration.txt,\n"
          "latest or latest_universal, pinned ones, ones with a file open.\n"
          "  --dry-run  say what would be deleted, delete nothing\n"
          "Exit status: 0 done, 1 a deletion failed, 2 bad arguments or ROOT not in a mount.\n");
      return 0;
    }
    if ((a == "--keep-last" || a == "--keep-every") && i + 1 < args.size()) {
      auto n = Number(args[++i]);
      if (!n || (a == "--keep-every" && *n == 0)) return Usage();
      (a == "--keep-last" ? keep_last : keep_every) = n;
    } else if (a == "--dry-run") {
      dry_run = true;
    } else if (!a.empty() && a[0] != '-' && root_arg.empty()) {
      root_arg = a;
    } else {
      return Usage();
    }
  }
  if (root_arg.empty() || !keep_last) return Usage();
  const fs::path root = AbsolutePath(root_arg);
  char probe[4];
  if (::getxattr(root.c_str(), "user.ckptfs.busy", probe, sizeof(probe)) < 0) {
    std::fprintf(stderr, "ckptfs retain: %s: %s\n", root.c_str(),
                 errno == ENOTSUP || errno == ENODATA
                     ? "not a directory in a ckptfs mount (or its daemon is too old)"
                     : std::strerror(errno));
    return 2;
  }

  // The checkpoints of ROOT, oldest first, and why each stays (store/retention.h).
  std::vector<CheckpointDir> dirs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec) || e.is_symlink(ec)) continue;
    CheckpointDir d;
    d.name = e.path().filename();
    struct stat st;
    if (::stat(e.path().c_str(), &st) == 0) {
      d.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
    }
    d.dcp_metadata = fs::exists(e.path() / ".metadata", ec);
    dirs.push_back(std::move(d));
  }
  if (ec) {
    std::fprintf(stderr, "ckptfs retain: listing %s: %s\n", root.c_str(), ec.message().c_str());
    return 2;
  }
  Trackers trackers{ReadTrimmed(root / "latest_checkpointed_iteration.txt"),
                    ReadTrimmed(root / "latest"), ReadTrimmed(root / "latest_universal")};
  std::vector<RetentionDecision> ckpts =
      DecideRetention(dirs, trackers, RetentionPolicy{*keep_last, keep_every.value_or(0)});

  int rc = 0;
  uint64_t freed = 0, deleted = 0;
  for (RetentionDecision& c : ckpts) {
    const fs::path p = root / c.name;
    if (c.keep.empty()) c.keep = MustStay(p);
    if (!c.keep.empty()) {
      std::printf("keep    %s (%s)\n", c.name.c_str(), c.keep.c_str());
      continue;
    }
    const uint64_t bytes = TreeBytes(p);
    std::printf("%s %s (%s)\n", dry_run ? "would delete" : "delete ", c.name.c_str(),
                HumanBytes(static_cast<double>(bytes)).c_str());
    std::fflush(stdout);
    if (dry_run) continue;
    std::error_code rm = RemoveWithProgress(p, c.name);
    if (rm) {
      std::fprintf(stderr, "ckptfs retain: deleting %s: %s\n", p.c_str(), rm.message().c_str());
      rc = 1;
      continue;
    }
    freed += bytes;
    ++deleted;
  }
  if (!dry_run) {
    std::printf("deleted %llu of %zu checkpoints, %s of files\n",
                static_cast<unsigned long long>(deleted), ckpts.size(), HumanBytes(static_cast<double>(freed)).c_str());
  }
  return rc;
}

}  // namespace ckptfs
