// The ckptfs command: mount, umount, stats, inspect, prefetch.
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "backends/open.h"
#include "peers/peer_backend.h"
#include "peers/peer_server.h"
#include "common/config.h"
#include "common/log.h"
#include "formats/payload_scan.h"
#include "fs/fuse_fs.h"
#include "metrics/exporter.h"
#include "store/meta_store.h"
#include "store/store.h"
#include "tools/commands.h"
#include "tools/mount_options.h"
#include "tools/mount_table.h"

namespace ckptfs {
namespace {

// How the daemon's progress lines start on the start-up pipe (the verdict, "ok" or the error,
// comes last).
constexpr std::string_view kProgressPrefix = "progress: ";

constexpr const char* kUsage = R"(usage:
  ckptfs mount MOUNTPOINT [--cache-dir DIR] [--backend URL]... [--s3-endpoint URL] [--foreground]
               [--log-level LEVEL] [-o OPT[,OPT...]]
  ckptfs umount MOUNTPOINT [--lazy]
  ckptfs status [MOUNTPOINT|PATH] [--json]
  ckptfs stats [MOUNTPOINT|PATH|CACHE_DIR]
  ckptfs inspect [--json] FILE|DIR
  ckptfs inspect ROOT --view SPEC [--cache-dir DIR [--backend URL]...]
  ckptfs convert SRC DST --view SPEC [--cache-dir DIR [--backend URL]...] [--rules FILE]
  ckptfs prefetch PATH [--wait]
  ckptfs fsck [PATH] [--deep] [--repair] [--json]
  ckptfs retain ROOT --keep-last N [--keep-every K] [--dry-run]
  ckptfs gc --backend URL [--s3-endpoint URL] --dry-run
  ckptfs snapshot --backend URL [--s3-endpoint URL] [--keep N] [--part-size MIB]

mount options (-o): ram_cache=SIZE, write_queue=SIZE, write_memory=SIZE, write_threads=N,
  cut_threads=N, reorder_buffer=SIZE,
  readahead_chunks=N, read_threads=N, io_engine=uring|pread, packs[=0|1],
  writeback_cache[=0|1], passthrough[=0|1], max_threads=N, max_background=N, max_readahead=SIZE,
  attr_timeout=SECONDS, entry_timeout=SECONDS, chunk_min=SIZE, chunk_avg=SIZE, chunk_max=SIZE,
  tensor_chunking[=0|1], tensor_piece=SIZE, durability=local|remote, durability_tier=N[+M..]|all,
  keep=N[+N..], keep_every=K[+K..] (per nearer tier), cache_size=SIZE,
  upload_threads=N, remote_timeout=SECONDS, sync_interval=SECONDS, gc_window=SECONDS, mount_timeout=SECONDS,
  view_rules=FILE, hf_shard_size=SIZE (the hf view's shards, default 5000000000),
  views=hidden|visible, metrics=ADDRESS:PORT (Prometheus exporter, e.g. 127.0.0.1:9567),
  peer_listen=IPV4:PORT, peers=HOST:PORT[,HOST:PORT...], peer_timeout=SECONDS,
  peer_discovery=0|1, peer_heartbeat=SECONDS (chunks served node to node; s3:// only),
  config=FILE (more options, one per line), and the flags as options: cache_dir=DIR,
  backend=URL, s3_endpoint=URL, log_level=LEVEL;
  any other option goes to FUSE (e.g. ro, allow_other).
--backend-faults SPEC (tests) injects backend faults, e.g. fail=0.1,seed=7,ops=put+get.
--cache-faults SPEC (tests) fails chunk file I/O, e.g. ops=write,error=enospc,after=8M,count=10.
--backend: file:///PATH or s3://BUCKET[/PREFIX]; given more than once, a chain of tiers, nearest
  first: every file is written to each, reads take the nearest that has a chunk, and the last is
  the namespace shared with other nodes (endpoint: --s3-endpoint or AWS_ENDPOINT_URL;
  credentials and region: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION
  or ~/.aws/credentials).
prefetch: pulls PATH (a file or a directory tree) from the backend onto the local tier in the
  background; --wait draws progress on stderr and returns once it is all there.
The cache directory defaults to /var/cache/ckptfs/<mountpoint> (root) or ~/.cache/ckptfs/...
)";


// Tells the waiting parent how the start went: "ok" or an error message.
// A line for the waiting `ckptfs mount` to print while the daemon starts (the pipe stays open).
void Progress(int fd, const std::string& msg) {
  if (fd < 0) return;
  const std::string line = std::string(kProgressPrefix) + msg + "\n";
  [[maybe_unused]] ssize_t n = ::write(fd, line.data(), line.size());
}

void Report(int fd, const std::string& msg) {
  if (fd < 0) return;
  [[maybe_unused]] ssize_t n = ::write(fd, msg.data(), msg.size());
  ::close(fd);
}

void Detach() {
  int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(null, 2);
    if (null > 2) ::close(null);
  }
  [[maybe_unused]] int rc = ::chdir("/");
}

// The daemon allocates and frees chunk buffers (about a MiB each) at its read and write rates.
// With glibc's defaults each new buffer faults its pages in afresh: freed heap tops past a few
// MiB go back to the kernel, and with one arena per busy thread a buffer freed in one arena
// does not serve the next allocation in another. A cold read of a view through a fresh mount
// spent more CPU on those faults than on checksumming its bytes. So the daemon uses one arena
// (small allocations stay in glibc's per-thread caches, so the lock is rarely taken) and keeps
// up to the RAM cache's size of freed memory for reuse, on top of the buffers in use (measured:
// peak RSS fell, since one arena fragments less than many). Buffers above 32 MiB (glibc's
// ceiling for this threshold) are still mapped on their own.
void KeepFreedBuffers(const Config& cfg) {
  constexpr uint64_t kMinKeep = 32ull << 20;
  (void)::mallopt(M_ARENA_MAX, 1);
  (void)::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  (void)::mallopt(M_TRIM_THRESHOLD,
                  static_cast<int>(std::min<uint64_t>(std::max(cfg.ram_cache_bytes, kMinKeep),
                                                      1ull << 30)));
}

int RunDaemon(const Config& cfg, int notify_fd) {
  KeepFreedBuffers(cfg);
  Logger log = GetLogger("main");
  std::vector<std::unique_ptr<Backend>> tiers;
  for (const std::string& url : cfg.backends) {
    auto b = OpenBackend({url, cfg.s3_endpoint, cfg.backend_faults});
    if (!b.ok()) {
      const std::string msg = "backend " + url + ": " + b.status().ToString();
      log->error("{}", msg);
      Report(notify_fd, msg);
      if (notify_fd < 0) std::fprintf(stderr, "ckptfs: %s\n", msg.c_str());
      return 1;
    }
    tiers.push_back(std::move(*b));
  }
  auto fail = [&](const std::string& msg) {
    log->error("{}", msg);
    Report(notify_fd, msg);
    if (notify_fd < 0) std::fprintf(stderr, "ckptfs: %s\n", msg.c_str());
    return 1;
  };
  // Chunks served node to node: the farthest tier asks a chunk's owner first.
  PeerBackend* peers = nullptr;
  std::unique_ptr<PeerMetrics> peer_metrics;  // outlives the store, the endpoint and the exporter
  if (!cfg.peer_listen.empty() || !cfg.peers.empty()) {
    auto key = PeerKeyOf(cfg.backends.back(), cfg.s3_endpoint);
    if (!key.ok()) return fail(key.status().ToString());
    peer_metrics = std::make_unique<PeerMetrics>();
    auto wrapped = std::make_unique<PeerBackend>(
        std::move(tiers.back()),
        PeerOptions{.self = cfg.peer_listen, .peers = cfg.peers, .key = std::move(*key),
                    .timeout_s = cfg.peer_timeout_s, .discover = cfg.peer_discovery,
                    .heartbeat_s = cfg.peer_heartbeat_s},
        peer_metrics.get());
    peers = wrapped.get();
    tiers.back() = std::move(wrapped);
  }
  auto store = Store::Open(cfg, [] { return NewPayloadScanner(PayloadScanOptions{}); },
                           std::move(tiers));
  if (!store.ok()) return fail("cannot open the store: " + store.status().ToString());
  std::unique_ptr<PeerServer> peer_server;
  if (!cfg.peer_listen.empty()) {
    Store* st = store->get();
    auto started = PeerServer::Start(
        cfg.peer_listen, peers->options().key, kMaxChunkBytes,
        [st, peers](const ChunkId& id, uint64_t len) -> Result<PeerServer::Chunk> {
          ASSIGN_OR_RETURN(ChunkRef c, st->PeerChunk(id, len, peers->OwnedHere(id)));
          return PeerServer::Chunk{.bytes = c->bytes.get(), .keep = c};
        },
        /*any_port=*/false, PeerServer::kThreads, peer_metrics.get());
    if (!started.ok()) {
      (void)(*store)->Close();
      return fail(started.status().ToString());
    }
    peer_server = std::move(*started);
    log->info("serving chunks to peers at {} ({} peers given)", cfg.peer_listen, cfg.peers.size());
  }
  if (cfg.sync_interval_s > 0) {
    // Serve only a namespace that holds what the backend held at the start: a job started
    // right after the mount must not find an empty checkpoint directory.
    auto last = std::chrono::steady_clock::now();
    Status synced = (*store)->InitialSync(cfg.mount_timeout_s, [&](size_t done, size_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last < std::chrono::seconds(2)) return;
      last = now;
      const std::string msg = "first sync from " + cfg.backends.back() + ": " + std::to_string(done) +
                              " of " + std::to_string(total) + " entries";
      log->info("{}", msg);
      Progress(notify_fd, msg);
    });
    if (!synced.ok()) {
      log->error("{}", synced.ToString());
      Report(notify_fd, synced.ToString());
      if (notify_fd < 0) std::fprintf(stderr, "ckptfs: %s\n", synced.ToString().c_str());
      (void)(*store)->Close();
      return 1;
    }
  }
  std::unique_ptr<MetricsServer> exporter;
  if (!cfg.metrics_address.empty()) {
    auto started = MetricsServer::Start(cfg.metrics_address, store->get(), peer_metrics.get());
    if (!started.ok()) {
      log->error("{}", started.status().ToString());
      Report(notify_fd, started.status().ToString());
      if (notify_fd < 0) std::fprintf(stderr, "ckptfs: %s\n", started.status().ToString().c_str());
      (void)(*store)->Close();
      return 1;
    }
    exporter = std::move(*started);
    log->info("metrics at http://{}/metrics (port {})", cfg.metrics_address, exporter->port());
  }
  log->info("ckptfs {} serving {} from {}", CKPTFS_VERSION, cfg.mountpoint, cfg.cache_dir);
  bool reported = false;
  Status st = ServeMount(store->get(), cfg, [&] {
    reported = true;
    Report(notify_fd, "ok");
    if (notify_fd >= 0) Detach();
  });
  if (!st.ok()) {
    log->error("{}", st.ToString());
    if (!reported) Report(notify_fd, st.ToString());
    if (notify_fd < 0) std::fprintf(stderr, "ckptfs: %s\n", st.ToString().c_str());
  }
  if (peer_server) peer_server->Stop();
  // ServeMount closed the store; scrapes meanwhile read state that stays valid until reset.
  exporter.reset();
  Status closed = (*store)->Close();
  if (!closed.ok()) log->error("closing the store: {}", closed.ToString());
  store->reset();
  log->info("stopped");
  FlushLogs();
  return st.ok() && closed.ok() ? 0 : 1;
}

int Mount(const std::vector<std::string>& args) {
  Config cfg;
  Status st = ParseMountArgs(args, cfg);
  if (!st.ok()) {
    Fail(st.message() + "\n" + kUsage);
    return kExitUsage;
  }
  struct stat sb;
  if (::stat(cfg.mountpoint.c_str(), &sb) != 0) {
    if (errno == ENOTCONN) {
      return Fail(cfg.mountpoint + " is a dead mount (its daemon died): run `ckptfs umount " +
                  cfg.mountpoint + "` first");
    }
    return Fail("mountpoint " + cfg.mountpoint + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(sb.st_mode)) return Fail("mountpoint " + cfg.mountpoint + " is not a directory");
  if (FindMount(cfg.mountpoint)) return Fail(cfg.mountpoint + " is already a ckptfs mount");
  for (size_t i = 1; i <= cfg.cache_dir.size(); ++i) {
    if (i == cfg.cache_dir.size() || cfg.cache_dir[i] == '/') {
      ::mkdir(cfg.cache_dir.substr(0, i).c_str(), 0755);
    }
  }
  if (cfg.foreground) {
    st = InitLogging(cfg.log_level, "");
    if (!st.ok()) return Fail(st.ToString());
    return RunDaemon(cfg, -1);
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Fail(std::string("pipe: ") + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) return Fail(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    ::setsid();
    st = InitLogging(cfg.log_level, cfg.cache_dir + "/ckptfs.log");
    if (!st.ok()) {
      Report(fds[1], st.ToString());
      ::_exit(1);
    }
    ::_exit(RunDaemon(cfg, fds[1]));
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    msg.append(buf, static_cast<size_t>(n));
    // Progress lines go to stderr as they come; what is left at the end is the verdict.
    for (size_t nl; msg.starts_with(kProgressPrefix) && (nl = msg.find('\n')) != std::string::npos;
         msg.erase(0, nl + 1)) {
      const std::string line = msg.substr(kProgressPrefix.size(), nl - kProgressPrefix.size());
      std::fprintf(stderr, "ckptfs: %s\n", line.c_str());
    }
  }
  ::close(fds[0]);
  if (msg != "ok") {
    if (msg.empty()) msg = "the daemon died during start-up; see " + cfg.cache_dir + "/ckptfs.log";
    return Fail(msg);
  }
  std::printf("ckptfs: mounted %s (cache %s, daemon pid %d)\n", cfg.mountpoint.c_str(),
              cfg.cache_dir.c_str(), pid);
  return 0;
}

pid_t DaemonPid(const std::string& cache_dir) {
  std::ifstream in(cache_dir + "/lock");
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

int Umount(const std::vector<std::string>& args) {
  std::string mnt;
  bool lazy = false;
  for (const auto& a : args) {
    if (a == "--lazy" || a == "-z") {
      lazy = true;
    } else if (mnt.empty()) {
      mnt = AbsolutePath(a);
    } else {
      Fail(std::string("unexpected argument ") + a + "\n" + kUsage);
      return kExitUsage;
    }
  }
  if (mnt.empty()) {
    Fail(std::string("no mountpoint given\n") + kUsage);
    return kExitUsage;
  }
  auto entry = FindMount(mnt);
  if (!entry) return Fail(mnt + " is not a ckptfs mount");
  pid_t pid = DaemonPid(entry->cache_dir);
  if (::umount2(mnt.c_str(), lazy ? MNT_DETACH : 0) != 0) {
    int err = errno;
    if (err == EPERM) {  // not root: the setuid helper may unmount our own mounts
      std::string cmd = std::string("fusermount3 -u ") + (lazy ? "-z " : "") + "'" + mnt + "'";
      if (std::system(cmd.c_str()) != 0) return Fail("fusermount3 could not unmount " + mnt);
    } else if (err == EBUSY) {
      return Fail(mnt + " is busy (files or directories in use); `--lazy` detaches it now");
    } else {
      return Fail("umount " + mnt + ": " + std::strerror(err));
    }
  }
  // Wait for the daemon to commit, sync and let go of its cache directory.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (pid > 0 && ::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    comm >> name;
    if (name != "ckptfs") break;  // the pid was reused by something else
    // A zombie has exited and let go of everything; its reaper (init) may take its time.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    size_t paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() &&
        (line[paren + 2] == 'Z' || line[paren + 2] == 'X')) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

// The usage of one command (what `ckptfs CMD --help` prints); "" for an unknown one.
std::string CommandHelp(const std::string& cmd) {
  const std::string usage = kUsage;
  if (cmd == "mount") {
    // Everything from the mount line to the end: its options are most of the text.
    return "usage:\n" + usage.substr(usage.find("  ckptfs mount")) +
           "Exit status: 0 mounted, 1 the mount failed (the reason is printed), 2 bad usage.\n";
  }
  static constexpr std::pair<const char*, const char*> kHelp[] = {
      {"umount",
       "usage: ckptfs umount MOUNTPOINT [--lazy]\n"
       "Unmounts a ckptfs mount and waits until its daemon has committed, synced and let go of\n"
       "its cache directory. --lazy (-z) detaches a busy mount now; the daemon finishes when\n"
       "the last file on it is closed.\n"
       "Exit status: 0 unmounted, 1 it could not be (busy, not a ckptfs mount), 2 bad usage.\n"},
      {"status",
       "usage: ckptfs status [MOUNTPOINT|PATH] [--json]\n"
       "The state of the daemon serving the mount that holds PATH (default: the working\n"
       "directory): pid, version, uptime, passthrough, options in force, local and RAM tier use,\n"
       "each remote tier's health and what waits to be published to it, recent errors and\n"
       "warnings. --json prints it as the daemon reports it.\n"
       "Exit status: 0, 1 when PATH is in no ckptfs mount or its daemon is gone, 2 bad usage.\n"},
      {"stats",
       "usage: ckptfs stats [MOUNTPOINT|PATH|CACHE_DIR]\n"
       "What the files under PATH (default: the working directory) take: logical bytes, the\n"
       "bytes of their chunks, the deduplication ratio, per checkpoint directory.\n"
       "Exit status: 0, or 1 when PATH is in no ckptfs mount or cache directory.\n"},
      {"inspect",
       "usage: ckptfs inspect [--json] FILE|DIR\n"
       "       ckptfs inspect ROOT --view SPEC [--cache-dir DIR [--backend URL]...]\n"
       "Describes a checkpoint file or directory: its format, tensors (names, dtypes, shapes,\n"
       "byte ranges) and parallel layout; with --view, the files the view SPEC of ROOT serves\n"
       "(off a mount: planned here, with the source files each reads; with --cache-dir, ROOT is\n"
       "a directory of that unmounted cache directory's namespace; --backend as for convert).\n"
       "Exit status: 0, or 1 when the file cannot be read or recognized.\n"},
      {"convert",
       "usage: ckptfs convert SRC DST --view SPEC [--cache-dir DIR [--backend URL]...\n"
       "                      [--s3-endpoint URL]] [--rules FILE]\n"
       "Writes view SPEC (docs/views.md: tpT-ppP, tpT-ppP-epE, hf, dpD, tpT-dpD, universal,\n"
       "consolidated) of the checkpoint in directory SRC into the new directory DST, without a\n"
       "mount: the files the mount's SRC/.views/SPEC serves, bit for bit. SRC is a plain\n"
       "directory or a path in a mount. DST appears whole once every file is synced, or not at\n"
       "all. --cache-dir: SRC is a directory of that unmounted cache directory's namespace\n"
       "(its metadata read-only, its chunks from the local tier, verified); --backend: the\n"
       "remote tiers its evicted chunks are read from (as the mount's, nearest first; verified,\n"
       "not kept). --rules: a view\n"
       "rules file, as the mount option view_rules=.\n"
       "Exit status: 0, 1 when the view is refused (with the reason) or cannot be written.\n"},
      {"prefetch",
       "usage: ckptfs prefetch PATH [--wait]\n"
       "Pulls PATH (a file or a directory tree) from the remote tiers onto the local tier in\n"
       "the background; --wait draws progress on a terminal and returns once it is all there.\n"
       "Exit status: 0, 1 when the prefetch failed, 2 bad usage.\n"},
  };
  for (const auto& [name, text] : kHelp) {
    if (cmd == name) return text;
  }
  return "";
}

}  // namespace

int Fail(const std::string& msg) {
  std::fprintf(stderr, "ckptfs: %s\n", msg.c_str());
  return 1;
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char out[32];
  std::snprintf(out, sizeof(out), u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return out;
}

}  // namespace ckptfs

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // Run as /sbin/mount.fuse.ckptfs (a link cmake --install makes), by mount(8) for `-t
  // fuse.ckptfs` and fstab lines: `mount.fuse.ckptfs SOURCE MOUNTPOINT [-n] [-v] -o OPTIONS`.
  const std::string self = argv[0];
  if (self.substr(self.rfind('/') + 1).starts_with("mount.")) {
    // -f: a fake mount (mount(8) records it, nothing mounts); -n, -v, -s: nothing to do here.
    if (std::find(args.begin(), args.end(), "-f") != args.end()) return 0;
    std::erase_if(args, [](const std::string& a) { return a == "-n" || a == "-v" || a == "-s"; });
    auto helper = ckptfs::MountHelperArgs(args, true);
    if (helper.empty()) {
      ckptfs::Fail("usage: mount.fuse.ckptfs SOURCE MOUNTPOINT [-o OPTIONS]");
      return ckptfs::kExitUsage;
    }
    // mount -a again: mount(8) does not see the line as mounted (the mount's source is the
    // cache directory), and an existing mount of this mountpoint is what it asks for.
    if (ckptfs::FindMount(ckptfs::AbsolutePath(helper[0]))) return 0;
    return ckptfs::Mount(helper);
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(ckptfs::kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::puts("ckptfs " CKPTFS_VERSION);
    return 0;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  // `ckptfs CMD --help`: the commands that do not answer it themselves (fsck, retain, gc and
  // snapshot do).
  const bool help = std::find_if(args.begin(), args.end(), [](const std::string& a) {
                      return a == "--help" || a == "-h";
                    }) != args.end();
  if (help && cmd != "fsck" && cmd != "retain" && cmd != "gc" &&
      cmd != "snapshot") {
    const std::string text = ckptfs::CommandHelp(cmd);
    if (text.empty()) {
      ckptfs::Fail("unknown command '" + cmd + "'\n" + ckptfs::kUsage);
      return ckptfs::kExitUsage;
    }
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  if (cmd == "mount") return ckptfs::Mount(args);
  if (cmd == "umount" || cmd == "unmount") return ckptfs::Umount(args);
  if (cmd == "stats") return ckptfs::Stats(args);
  if (cmd == "status") return ckptfs::ShowStatus(args);
  if (cmd == "inspect") return ckptfs::Inspect(args);
  if (cmd == "convert") return ckptfs::Convert(args);
  if (cmd == "prefetch") return ckptfs::Prefetch(args);
  if (cmd == "fsck") return ckptfs::Fsck(args);
  if (cmd == "retain") return ckptfs::Retain(args);
  if (cmd == "gc") return ckptfs::Gc(args);
  if (cmd == "snapshot") return ckptfs::Snapshot(args);
  // mount(8) with an fstab line of type fuse.ckptfs runs mount.fuse3, which runs
  // `ckptfs SOURCE MOUNTPOINT -o OPTIONS`.
  args.insert(args.begin(), cmd);
  if (auto helper = ckptfs::MountHelperArgs(args, false); !helper.empty()) {
    return ckptfs::Mount(helper);
  }
  ckptfs::Fail("unknown command '" + cmd + "'\n" + ckptfs::kUsage);
  return ckptfs::kExitUsage;
}
