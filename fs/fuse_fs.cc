#include "fs/fuse_fs.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fs/fs_ops.h"

namespace ckptfs {
namespace {

// Turns passthrough on where everything allows it; says what was decided, and why not.
const char* PassthroughMode(fs::Context& ctx, fuse_conn_info* conn) {
  const Config& cfg = ctx.cfg;
  if (!cfg.passthrough) return "off (passthrough=0)";
  if (!fs::kFusePassthrough) return "off (this build's libfuse has none: see scripts/libfuse.sh)";
#if defined(FUSE_CAP_PASSTHROUGH)
  if (!(conn->capable & FUSE_CAP_PASSTHROUGH)) return "off (the kernel offers none)";
  if (conn->want & FUSE_CAP_WRITEBACK_CACHE) return "off (writeback_cache is on)";
  if (cfg.durability == "remote") return "off (durability=remote)";
  if (::geteuid() != 0) return "off (registering backing files needs root)";
  conn->want |= FUSE_CAP_PASSTHROUGH;
  conn->max_backing_stack_depth = 1;  // the cache directory may sit on overlayfs
  ctx.passthrough = true;
  return "on (files written by create or O_TRUNC go through staging files)";
#else
  (void)conn;
  return "off";
#endif
}

void Init(void* userdata, fuse_conn_info* conn) {
  auto* ctx = static_cast<fs::Context*>(userdata);
  const Config& cfg = ctx->cfg;
  conn->max_write = cfg.max_write_bytes;
  conn->max_readahead = cfg.max_readahead_bytes;
  conn->max_background = cfg.max_background;
  conn->congestion_threshold = cfg.max_background * 3 / 4;
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  if (cfg.writeback_cache && (conn->capable & FUSE_CAP_WRITEBACK_CACHE)) {
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
  } else {
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  }
  // The kernel leaves clearing set-id bits to the daemon (fs/privs.h) instead of asking for
  // security.capability before every write.
#if defined(FUSE_CAP_HANDLE_KILLPRIV_V2)
  const bool killpriv = conn->capable & FUSE_CAP_HANDLE_KILLPRIV_V2;
  if (killpriv) conn->want |= FUSE_CAP_HANDLE_KILLPRIV_V2;
#else
  const bool killpriv = false;  // libfuse before 3.10
#endif
  const char* passthrough = PassthroughMode(*ctx, conn);
  ctx->passthrough_mode = passthrough;
  ctx->log->info(
      "mounted: max_write {} KiB, readahead {} KiB, writeback cache {}, set-id bits cleared by {}, "
      "passthrough {}",
      conn->max_write >> 10, conn->max_readahead >> 10,
      (conn->want & FUSE_CAP_WRITEBACK_CACHE) ? "on" : "off", killpriv ? "ckptfs" : "the kernel",
      passthrough);
}

// The kernel caps a FUSE mount's readahead at its backing device's read_ahead_kb (128 KiB when
// mounted), whatever max_readahead the init reply asks for: a cold sequential read then has
// about 128 KiB in flight. Raises it to max_readahead (root only; logged otherwise). The device
// number comes from mountinfo: a stat of the mountpoint would wait on this very daemon.
void RaiseKernelReadahead(const Config& cfg, const Logger& log) {
  std::ifstream mi("/proc/self/mountinfo");
  std::string line, dev;
  while (std::getline(mi, line)) {
    std::istringstream in(line);
    std::string id, parent, majmin, root, where;
    if (in >> id >> parent >> majmin >> root >> where && where == cfg.mountpoint) dev = majmin;
  }
  if (dev.empty()) return;
  const std::string path = "/sys/class/bdi/" + dev + "/read_ahead_kb";
  std::ofstream f(path);
  f << (cfg.max_readahead_bytes >> 10) << "\n";
  f.close();
  if (!f) {
    log->info("could not raise {} to {} KiB: the kernel reads ahead at most its default", path,
              cfg.max_readahead_bytes >> 10);
  }
}

// libfuse parses -o options with commas as separators.
std::string EscapeCommas(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

Status ServeMount(Store* store, const Config& cfg, const std::function<void()>& on_mounted) {
  // The views read the store's committed files; the source outlives them (declared first).
  const std::unique_ptr<fs::CheckpointSource> source = fs::NewStoreSource(store);
  auto views = fs::ViewTree::Make(source.get(), GetLogger("views"), cfg.view_rules,
                                  reshard::HfOptions{cfg.view_hf_shard_bytes});
  if (!views.ok()) return views.status();
  fs::Context ctx{store, cfg, GetLogger("fs"), fs::NewFileInfoCache(), *views};
  if (const char* ms = std::getenv("CKPTFS_TEST_RELEASE_DELAY_MS"); ms && *ms) {
    ctx.release_delay = std::chrono::milliseconds(std::atol(ms));
    ctx.log->warn("tests: every release waits {} ms", ctx.release_delay.count());
  }
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  fs::AddEntryOps(&ops);
  fs::AddFileOps(&ops);
  fs::AddDirOps(&ops);
  fs::AddXattrOps(&ops);

  std::string opts = "default_permissions,subtype=ckptfs,fsname=" + EscapeCommas(cfg.cache_dir);
  if (::geteuid() == 0) opts += ",allow_other";  // training jobs often run as other users
  for (const std::string& o : cfg.fuse_options) opts += "," + o;
  std::vector<std::string> argv_s = {"ckptfs", "-o", opts};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());

  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), &ctx);
  if (!se) return Invalid("libfuse rejected the mount options: " + opts);
  ctx.session = se;
  Status result;
  // libfuse installs its SIGINT and SIGTERM handlers only where the signal is at its default:
  // a daemon started from a script's background job (SIGINT ignored there) would then ignore
  // `kill -INT` and never unmount cleanly. The daemon has left that terminal's process group, so
  // these two go back to their defaults first. SIGHUP keeps what it was given (nohup).
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    return Internal("cannot install signal handlers");
  }
  if (fuse_session_mount(se, cfg.mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return IoError("cannot mount on " + cfg.mountpoint +
                   " (does it exist? is a dead mount still there? try `ckptfs umount`)");
  }
  RaiseKernelReadahead(cfg, ctx.log);
  on_mounted();
  // What other nodes publish changes the namespace behind the kernel's back: it must forget the
  // names and attributes it cached (entry_timeout and attr_timeout are long).
  store->SetChangeListener([se](uint64_t parent, const std::string& name, uint64_t ino) {
    fuse_lowlevel_notify_inval_entry(se, parent, name.data(), name.size());
    if (ino) fuse_lowlevel_notify_inval_inode(se, ino, 0, 0);
  });
  store->StartSync();
  fuse_loop_config* lc = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(lc, cfg.max_threads);
  fuse_loop_cfg_set_idle_threads(lc, cfg.max_threads);
  int rc = fuse_session_loop_mt(se, lc);
  fuse_loop_cfg_destroy(lc);
  if (rc != 0 && rc != SIGTERM && rc != SIGINT && rc != SIGHUP) {
    result = IoError("the FUSE loop ended with error " + std::to_string(rc));
  }
  store->StopSync();  // no notification may reach a session that is going away
  // The store is closed (committed, synced, marked clean) while the connection is still up: with
  // a passthrough file held open by another process, this kernel was seen to keep the daemon's
  // exit waiting for about five minutes after the connection is torn down.
  if (Status closed = store->Close(); !closed.ok()) {
    ctx.log->error("closing the store: {}", closed.ToString());
    if (result.ok()) result = closed;
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  ctx.log->info("unmounted {}", cfg.mountpoint);
  return result;
}

}  // namespace ckptfs
