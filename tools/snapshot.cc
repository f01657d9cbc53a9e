// ckptfs snapshot --backend URL [--s3-endpoint URL] [--keep N] [--part-size MIB]: writes a record
// snapshot of a backend's namespace (store/snapshot.h; why a mount may trust it:
// docs/journal.md), so that new mounts read a few objects instead of every record. `ckptfs gc`
// writes one after each round too.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/open.h"
#include "store/snapshot.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ckptfs {
namespace {

constexpr char kUsage[] =
    "usage: ckptfs snapshot --backend URL [--s3-endpoint URL] [--keep N] [--part-size MIB]\n";

int Usage() {
  std::fprintf(stderr, "%s", kUsage);
  return kExitUsage;
}

}  // namespace

Status WriteSnapshot(Backend& b, size_t keep, uint64_t part_bytes, uint64_t* journal) {
  Progress progress;
  NamespaceSnapshot::WriteOptions opts;
  opts.keep = keep;
  opts.part_bytes = part_bytes;
  opts.progress = [&](const std::string& line) { progress.Show(line); };
  auto w = NamespaceSnapshot::Write(b, opts);
  progress.Done();
  if (!w.ok()) return w.status();
  auto n = [](uint64_t v) { return static_cast<unsigned long>(v); };
  std::printf("snapshot         %s (journal entry %lu)\n", w->manifest.dir.c_str(),
              n(w->manifest.journal));
  std::printf("snapshot records %lu files, %lu directories, %zu parts, %s\n", n(w->files),
              n(w->dirs), w->manifest.parts.size(),
              HumanBytes(static_cast<double>(w->bytes)).c_str());
  std::printf("snapshot pruned  %lu objects of older snapshots\n", n(w->pruned));
  if (journal) *journal = w->manifest.journal;
  return Status::Ok();
}

int Snapshot(const std::vector<std::string>& args) {
  BackendSpec spec;
  size_t keep = 2;
  uint64_t part_mib = 8;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "%s"
          "Writes a snapshot of every file record and directory marker of a backend\n"
          "(file:///PATH or s3://BUCKET[/PREFIX]) under snapshot/, packed into parts of about\n"
          "MIB MiB (--part-size, default 8), as of the namespace journal's newest entry. A new\n"
          "mount reads the newest snapshot and the journal after it instead of every record\n"
          "(docs/journal.md). The newest N complete snapshots are kept (--keep, default 2);\n"
          "older ones are deleted. Safe while other nodes save; run it from one place at a time\n"
          "or from several (each snapshot has a directory of its own). `ckptfs gc` writes one\n"
          "after its round.\n"
          "Exit status: 0 written, 1 a record could not be read (nothing written), 2 bad\n"
          "arguments or a backend error.\n",
          kUsage);
      return 0;
    }
    if ((a == "--keep" || a == "--part-size") && i + 1 < args.size()) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(args[++i].c_str(), &end, 10);
      if (!end || *end != '\0' || v == 0 || v > 1024) return Usage();
      (a == "--keep" ? keep : part_mib) = v;
    } else if (a == "--backend" && i + 1 < args.size()) {
      spec.url = args[++i];
    } else if (a == "--s3-endpoint" && i + 1 < args.size()) {
      spec.s3_endpoint = args[++i];
    } else {
      return Usage();
    }
  }
  if (spec.url.empty()) return Usage();
  auto backend = OpenBackend(spec);
  if (!backend.ok()) {
    Fail(backend.status().ToString());
    return 2;
  }
  Status st = WriteSnapshot(**backend, keep, part_mib << 20, nullptr);
  if (!st.ok()) {
    Fail("writing a snapshot of " + (*backend)->Describe() + ": " + st.ToString());
    return st.code() == Code::kCorrupt ? 1 : 2;
  }
  return 0;
}

}  // namespace ckptfs
