// ckptfs fsck [PATH] [--deep] [--repair] [--json]: asks the daemon of the mount PATH is in to
// check the files under PATH (user.ckptfs.fsck[.deep][.repair], one call, so that a repair runs
// once) and prints what it found. Exit status: 0 clean (after repairs), 1 damage remains, 2 the
// check could not run.
#include <sys/xattr.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "formats/json.h"
#include "tools/commands.h"
#include "tools/mount_table.h"
#include "tools/progress.h"

namespace ckptfs {
namespace {

uint64_t Count(const json::Value& v, const char* key) {
  const json::Value* f = v.Find(key);
  return f && f->is_int() ? static_cast<uint64_t>(f->as_int()) : 0;
}

void PrintList(const json::Value& v, const char* key, const char* title) {
  const json::Value* list = v.Find(key);
  if (!list || !list->is_array() || list->as_array().empty()) return;
  std::printf("%s\n", title);
  for (const json::Value& e : list->as_array()) {
    if (e.is_string()) std::printf("  %s\n", e.as_string().c_str());
  }
}

}  // namespace

int Fsck(const std::vector<std::string>& args) {
  std::string path = ".";
  bool deep = false, repair = false, as_json = false, have_path = false;
  for (const std::string& a : args) {
    if (a == "--deep") {
      deep = true;
    } else if (a == "--repair") {
      repair = true;
    } else if (a == "--json") {
      as_json = true;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: ckptfs fsck [PATH] [--deep] [--repair] [--json]\n"
          "Checks the files under PATH (default: the working directory) in a ckptfs mount: their\n"
          "chunks on the local tier and in the backend, the backend's file records, and (from the\n"
          "mount's root) the chunk reference counts.\n"
          "  --deep    read and verify every chunk (local files; backend objects by GET)\n"
          "  --repair  fetch a missing or corrupt local chunk from the nearest tier with a good\n"
          "            copy, put a missing or corrupt tier chunk back from the local tier or\n"
          "            another tier, publish a bad or missing record again\n"
          "  --json    print the daemon's report as JSON\n"
          "Exit status: 0 clean, 1 damage found and not repaired, 2 the check could not run.\n");
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "ckptfs fsck: unknown option %s\n", a.c_str());
      return 2;
    } else if (have_path) {
      std::fprintf(stderr, "ckptfs fsck: one PATH only\n");
      return 2;
    } else {
      path = a;
      have_path = true;
    }
  }
  const std::string name =
      std::string("user.ckptfs.fsck") + (deep ? ".deep" : "") + (repair ? ".repair" : "");
  std::string value(kMaxXattrValue, '\0');
  // The daemon checks in one request: on a terminal, the time it has taken so far.
  std::atomic<bool> checked{false};
  std::thread ticker([&] {
    Progress progress;
    const auto start = std::chrono::steady_clock::now();
    while (progress.on_terminal() && !checked.load()) {
      const auto s = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::steady_clock::now() - start).count();
      progress.Show("ckptfs fsck: checking " + path + (deep ? " (deep)" : "") + "... " +
                    std::to_string(s) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const ssize_t n =
      ::getxattr(AbsolutePath(path).c_str(), name.c_str(), value.data(), value.size());
  checked = true;
  ticker.join();
  if (n < 0) {
    const int err = errno;
    std::fprintf(stderr, "ckptfs fsck: %s: %s\n", path.c_str(),
                 err == ENOTSUP || err == ENODATA
                     ? "not in a ckptfs mount (or its daemon is too old to check it)"
                     : std::strerror(err));
    return 2;
  }
  value.resize(static_cast<size_t>(n));
  auto report = json::Parse(value);
  if (!report.ok() || !report->is_object()) {
    std::fprintf(stderr, "ckptfs fsck: the daemon's report is not JSON: %s\n", value.c_str());
    return 2;
  }
  const json::Value* clean_v = report->Find("clean");
  const bool clean = clean_v && clean_v->is_bool() && clean_v->as_bool();
  if (as_json) {
    std::printf("%s\n", value.c_str());
    return clean ? 0 : 1;
  }
  std::printf("%s: %lu files, %lu chunks, %lu bytes checked%s\n", path.c_str(),
              static_cast<unsigned long>(Count(*report, "files")),
              static_cast<unsigned long>(Count(*report, "chunks")),
              static_cast<unsigned long>(Count(*report, "bytes")), deep ? " (deep)" : "");
  const struct {
    const char* key;
    const char* what;
  } lines[] = {
      {"local_missing", "chunks missing from the local tier"},
      {"local_corrupt", "corrupt chunks on the local tier"},
      {"local_repaired", "local chunks repaired from a remote tier"},
      {"remote_missing", "chunks missing from a remote tier"},
      {"remote_corrupt", "corrupt chunks in a remote tier"},
      {"remote_repaired", "remote chunks put back from another copy"},
      {"records_bad", "bad file records in a remote tier"},
      {"records_missing", "file records missing from a remote tier"},
      {"records_republished", "file records queued to be published again"},
      {"refcount_errors", "chunk reference counts that differ from the manifests"},
      {"unreferenced_chunk_files", "chunk files no committed file names (being written, or left)"},
  };
  for (const auto& l : lines) {
    if (uint64_t c = Count(*report, l.key)) {
      std::printf("  %lu %s\n", static_cast<unsigned long>(c), l.what);
    }
  }
  PrintList(*report, "problems", "found:");
  if (uint64_t d = Count(*report, "damaged_files")) {
    std::printf("%lu files have bytes that no tier holds:\n", static_cast<unsigned long>(d));
    PrintList(*report, "damaged", "");
  }
  std::printf("%s\n", clean ? "clean" : "damage found");
  return clean ? 0 : 1;
}

}  // namespace ckptfs
