// ckptfs gc --backend URL [--s3-endpoint URL] --dry-run: how much of a backend's chunk space no
// file record references, in memory bounded by one 256th of the references. It reads every
// files/ record (each checks its own hash), spills the chunk ids they name into 256 files by
// their first byte, then, one prefix at a time, sorts that spill and walks the listing of
// chunks/<2 hex>/ beside it. It deletes nothing: deleting safely while other nodes save needs
// the protocol docs/gc.md describes, which is not built yet.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/open.h"
#include "cache/chunk_cache.h"
#include "store/remote_tier.h"
#include "tools/commands.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A progress line on stderr, redrawn in place on a terminal at most every 0.2 s; nothing
// otherwise.
class Progress {
 public:
  Progress() : tty_(::isatty(STDERR_FILENO)) {}
  ~Progress() { Done(); }
  void Show(const std::string& line) {
    if (!tty_ || Clock::now() - last_ < std::chrono::milliseconds(200)) return;
    last_ = Clock::now();
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    drawn_ = true;
  }
  void Done() {
    if (drawn_) std::fprintf(stderr, "\r\033[K");
    drawn_ = false;
  }

 private:
  const bool tty_;
  bool drawn_ = false;
  Clock::time_point last_{};
};

// The check could not run: exit status 2.
int Error(const std::string& msg) {
  Fail(msg);
  return 2;
}

int Usage() {
  std::fprintf(stderr, "usage: ckptfs gc --backend URL [--s3-endpoint URL] --dry-run\n");
  return 2;
}

}  // namespace

int Gc(const std::vector<std::string>& args) {
  BackendSpec spec;
  bool dry_run = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: ckptfs gc --backend URL [--s3-endpoint URL] --dry-run\n"
          "Counts the chunks of a backend (file:///PATH or s3://BUCKET[/PREFIX]) that no file\n"
          "record references: what a garbage collection would free. Reads every record, in\n"
          "memory bounded by a 256th of the references (the rest waits in temporary files under\n"
          "$TMPDIR). Deleting is not built yet: --dry-run is required.\n"
          "Exit status: 0 done, 1 a record could not be read (a gc would refuse to delete),\n"
          "2 bad arguments or the backend could not be listed.\n");
      return 0;
    }
    if (a == "--backend" && i + 1 < args.size()) {
      spec.url = args[++i];
    } else if (a == "--s3-endpoint" && i + 1 < args.size()) {
      spec.s3_endpoint = args[++i];
    } else if (a == "--dry-run") {
      dry_run = true;
    } else {
      return Usage();
    }
  }
  if (spec.url.empty()) return Usage();
  if (!dry_run) {
    std::fprintf(stderr,
                 "ckptfs gc: deleting chunks is not built yet (it must be safe against other nodes'"
                 " concurrent saves, see docs/gc.md); run with --dry-run to see what it would free\n");
    return 2;
  }
  auto backend = OpenBackend(spec);
  if (!backend.ok()) return Error(backend.status().ToString());
  Backend& b = **backend;

  // The records.
  Progress progress;
  std::vector<std::string> keys;
  Status st = b.List("files/", "", [&](const ObjectInfo& o) {
    keys.push_back(o.key);
    progress.Show("listing records: " + std::to_string(keys.size()));
    return true;
  });
  if (!st.ok()) return Error("listing files/ of " + b.Describe() + ": " + st.ToString());

  const char* tmp_root = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp_root && *tmp_root ? tmp_root : "/tmp") + "/ckptfs-gc.XXXXXX";
  if (!::mkdtemp(tmpl.data())) return Error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  const fs::path spill_dir = tmpl;
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{spill_dir};
  std::vector<std::FILE*> spill(256);
  for (int i = 0; i < 256; ++i) {
    spill[i] = std::fopen((spill_dir / std::to_string(i)).c_str(), "w+b");
    if (!spill[i]) return Error("creating a spill file in " + tmpl);
  }

  uint64_t bad_records = 0, references = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    progress.Show("reading records: " + std::to_string(i) + " of " + std::to_string(keys.size()));
    auto bytes = b.GetObject(keys[i]);
    if (!bytes.ok() && bytes.status().code() == Code::kNotFound) continue;  // deleted meanwhile
    auto rec = bytes.ok() ? FileRecord::Decode(*bytes) : Result<FileRecord>(bytes.status());
    if (!rec.ok()) {
      ++bad_records;
      progress.Done();
      std::fprintf(stderr, "ckptfs gc: %s: %s\n", keys[i].c_str(), rec.status().ToString().c_str());
      continue;
    }
    for (const Extent& e : rec->manifest.extents()) {
      if (e.hole()) continue;
      uint8_t raw[16];
      e.id.ToBytes(raw);
      if (std::fwrite(raw, 1, sizeof(raw), spill[raw[0]]) != sizeof(raw)) {
        return Error("writing a spill file in " + tmpl + ": " + std::strerror(errno));
      }
      ++references;
    }
  }

  // One prefix at a time: the references that start with it, against the chunks listed there.
  uint64_t chunks = 0, chunk_bytes = 0, unreferenced = 0, unreferenced_bytes = 0;
  size_t peak_ids = 0;
  for (int p = 0; p < 256; ++p) {
    progress.Show("comparing chunks/: prefix " + std::to_string(p + 1) + " of 256");
    std::vector<ChunkId> ids;
    // A reference lost in a spill file would make its chunk look unreferenced: any error stops.
    if (std::fflush(spill[p]) != 0 || std::ferror(spill[p])) {
      return Error("writing a spill file in " + tmpl + ": " + std::strerror(errno));
    }
    std::rewind(spill[p]);
    uint8_t raw[16];
    while (std::fread(raw, 1, sizeof(raw), spill[p]) == sizeof(raw)) {
      ids.push_back(ChunkId::FromBytes(raw));
    }
    if (std::ferror(spill[p])) return Error("reading a spill file in " + tmpl);
    std::fclose(spill[p]);
    spill[p] = nullptr;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    peak_ids = std::max(peak_ids, ids.size());
    char prefix[16];
    std::snprintf(prefix, sizeof(prefix), "chunks/%02x/", p);
    st = b.List(prefix, "", [&](const ObjectInfo& o) {
      auto id = ChunkId::FromHex(std::string_view(o.key).substr(std::strlen(prefix)));
      if (!id) return true;  // not a chunk object
      ++chunks;
      chunk_bytes += o.size;
      if (!std::binary_search(ids.begin(), ids.end(), *id)) {
        ++unreferenced;
        unreferenced_bytes += o.size;
      }
      return true;
    });
    if (!st.ok()) return Error("listing " + std::string(prefix) + ": " + st.ToString());
  }
  progress.Done();
  std::printf("backend          %s\n", b.Describe().c_str());
  std::printf("records          %zu (%lu unreadable)\n", keys.size(),
              static_cast<unsigned long>(bad_records));
  std::printf("chunks           %lu (%s)\n", static_cast<unsigned long>(chunks),
              HumanBytes(static_cast<double>(chunk_bytes)).c_str());
  std::printf("unreferenced     %lu (%s): what a gc would free\n",
              static_cast<unsigned long>(unreferenced),
              HumanBytes(static_cast<double>(unreferenced_bytes)).c_str());
  std::printf("references read  %lu; at most %zu chunk ids in memory at once\n",
              static_cast<unsigned long>(references), peak_ids);
  // This process's own high-water mark (getrusage would count the process it was forked from).
  if (std::FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), status)) {
      long kib;
      if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) std::printf("peak_rss_kib     %ld\n", kib);
    }
    std::fclose(status);
  }
  if (bad_records) {
    std::printf("%lu records could not be read: a gc would delete nothing until they are fixed\n",
                static_cast<unsigned long>(bad_records));
    return 1;
  }
  return 0;
}

}  // namespace ckptfs
