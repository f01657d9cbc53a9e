// ckptfs gc --backend URL [--s3-endpoint URL] (--dry-run | --grace DURATION): makes a backend's
// chunk space match what its file records name (store/gc.h; the protocol and why it is safe
// while other nodes save: docs/gc.md).
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/open.h"
#include "store/gc.h"
#include "store/journal.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The check could not run: exit status 2.
int Error(const std::string& msg) {
  Fail(msg);
  return 2;
}

constexpr char kUsage[] =
    "usage: ckptfs gc --backend URL [--s3-endpoint URL] (--dry-run | --grace DURATION)\n"
    "                 [--deadline DURATION] [--journal-keep N]\n";

int Usage() {
  std::fprintf(stderr, "%s", kUsage);
  return 2;
}

// "90", "90s", "15m", "2h": seconds; negative when malformed.
double ParseDuration(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return -1;
  const std::string unit(end);
  if (unit.empty() || unit == "s") return v;
  if (unit == "m") return v * 60;
  if (unit == "h") return v * 3600;
  return -1;
}

}  // namespace

int Gc(const std::vector<std::string>& args) {
  BackendSpec spec;
  GcOptions opts;
  bool dry_run = false, grace_given = false;
  uint64_t journal_keep = 100000;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "%s"
          "Deletes the chunks of a backend (file:///PATH or s3://BUCKET[/PREFIX]) that no file\n"
          "record names, safely while other nodes keep saving (docs/gc.md): it condemns them\n"
          "(gc/round), waits DURATION (--grace: longer than every mount's gc_window, 300 s by\n"
          "default; e.g. 15m), reads every record again and deletes the condemned chunks none\n"
          "names. Nothing is deleted later than --deadline after condemning (default: grace + 2h).\n"
          "One collector at a time per backend. --dry-run only counts what a round would free.\n"
          "Memory is bounded by a 256th of the references (the rest waits in temporary files\n"
          "under $TMPDIR) plus 16 bytes per condemned chunk.\n"
          "The namespace's change journal (docs/journal.md) is cut to its newest N entries\n"
          "(--journal-keep, default 100000); a mount that has read less than that lists the\n"
          "bucket once instead. After a round it writes a record snapshot for new mounts\n"
          "(as `ckptfs snapshot` does) and keeps every journal entry after it.\n"
          "Exit status: 0 done, 1 a record could not be read (nothing was deleted), some\n"
          "condemned chunks were left for the next round or the snapshot was not written,\n"
          "2 bad arguments or a backend error.\n",
          kUsage);
      return 0;
    }
    if (a == "--backend" && i + 1 < args.size()) {
      spec.url = args[++i];
    } else if (a == "--s3-endpoint" && i + 1 < args.size()) {
      spec.s3_endpoint = args[++i];
    } else if (a == "--dry-run") {
      dry_run = true;
    } else if (a == "--journal-keep" && i + 1 < args.size()) {
      char* end = nullptr;
      journal_keep = std::strtoull(args[++i].c_str(), &end, 10);
      if (!end || *end != '\0' || journal_keep == 0) return Usage();
    } else if ((a == "--grace" || a == "--deadline") && i + 1 < args.size()) {
      const double v = ParseDuration(args[++i]);
      if (v <= 0) return Usage();
      (a == "--grace" ? opts.grace_s : opts.deadline_s) = v;
      grace_given |= a == "--grace";
    } else {
      return Usage();
    }
  }
  if (spec.url.empty() || dry_run == grace_given) {
    if (!dry_run && !grace_given) {
      std::fprintf(stderr, "ckptfs gc: give --grace (longer than every mount's gc_window) or "
                           "--dry-run\n");
    }
    return Usage();
  }
  opts.dry_run = dry_run;
  auto backend = OpenBackend(spec);
  if (!backend.ok()) return Error(backend.status().ToString());
  Backend& b = **backend;

  const char* tmp_root = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp_root && *tmp_root ? tmp_root : "/tmp") + "/ckptfs-gc.XXXXXX";
  if (!::mkdtemp(tmpl.data())) return Error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{tmpl};
  opts.spill_dir = tmpl;
  Progress progress;
  opts.progress = [&](const std::string& line) { progress.Show(line); };
  const auto started = Clock::now();
  auto report = CollectGarbage(b, opts);
  progress.Done();
  if (!report.ok()) return Error(report.status().ToString());
  const GcReport& r = *report;
  auto n = [](uint64_t v) { return static_cast<unsigned long>(v); };
  std::printf("backend          %s\n", b.Describe().c_str());
  std::printf("records          %lu (%lu unreadable)\n", n(r.records), n(r.bad_records));
  std::printf("chunks           %lu (%s)\n", n(r.chunks),
              HumanBytes(static_cast<double>(r.chunk_bytes)).c_str());
  std::printf("unreferenced     %lu (%s)%s\n", n(r.unreferenced),
              HumanBytes(static_cast<double>(r.unreferenced_bytes)).c_str(),
              dry_run ? ": what a gc would free" : "");
  if (r.epoch > 0) {
    std::printf("round            %lu\n", n(r.epoch));
    std::printf("named again      %lu (saved during the grace: kept)\n", n(r.rereferenced));
    std::printf("deleted          %lu (%s)\n", n(r.deleted),
                HumanBytes(static_cast<double>(r.deleted_bytes)).c_str());
    std::printf("left             %lu\n", n(r.left));
  }
  std::printf("references read  %lu; at most %zu chunk ids in memory at once\n", n(r.references),
              r.peak_ids);
  int snapshot_failed = 0;
  if (!dry_run) {
    // A record snapshot for new mounts first, then the journal cut: never past the snapshot's
    // entry, since a mount reads the entries after it.
    uint64_t snapshot_journal = UINT64_MAX;
    if (Status st = WriteSnapshot(b, 2, uint64_t{8} << 20, &snapshot_journal); !st.ok()) {
      std::printf("snapshot         not written: %s\n", st.ToString().c_str());
      snapshot_failed = 1;
      snapshot_journal = UINT64_MAX;
    }
    NamespaceJournal journal(&b, "gc");
    auto dropped = journal.Truncate(journal_keep, snapshot_journal);
    if (!dropped.ok()) return Error("cutting the journal: " + dropped.status().ToString());
    std::printf("journal entries  %lu dropped (the newest %lu kept)\n", n(*dropped),
                n(journal_keep));
  }
  std::printf("seconds          %.1f\n",
              std::chrono::duration<double>(Clock::now() - started).count());
  // This process's own high-water mark (getrusage would count the process it was forked from).
  if (std::FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), status)) {
      long kib;
      if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) std::printf("peak_rss_kib     %ld\n", kib);
    }
    std::fclose(status);
  }
  if (r.bad_records) {
    std::printf("%lu records could not be read: nothing was deleted\n", n(r.bad_records));
    return 1;
  }
  if (!r.error.empty()) {
    std::printf("%s\n", r.error.c_str());
    return 1;
  }
  return snapshot_failed;
}

}  // namespace ckptfs
