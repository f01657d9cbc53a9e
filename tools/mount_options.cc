#include "tools/mount_options.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <type_traits>

#include "store/meta_store.h"
#include "tools/mount_table.h"

namespace ckptfs {
namespace {

// The options applied so far by key (a default that depends on others must know).
using GivenKeys = std::set<std::string>;
Status ApplyOption(const std::string& opt, Config& cfg, GivenKeys& given, int depth);

// -o config=FILE: the same options, one per line or comma-separated, `#` starting a comment.
// A config file may name another, a few levels deep at most.
Status ApplyConfigFile(const std::string& path, Config& cfg, GivenKeys& given, int depth) {
  if (depth >= 4) return Invalid("config=" + path + ": config files nested too deeply");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Invalid("config=" + path + ": not a readable file");
  }
  std::ifstream in(path);
  if (!in) return Invalid("config=" + path + ": cannot read it");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    // A comment starts a line or follows a blank (a URL or path may hold a '#').
    for (size_t hash = line.find('#'); hash != std::string::npos; hash = line.find('#', hash + 1)) {
      if (hash == 0 || line[hash - 1] == ' ' || line[hash - 1] == '\t') {
        line.resize(hash);
        break;
      }
    }
    size_t start = 0;
    while (start <= line.size()) {
      const size_t comma = std::min(line.find(',', start), line.size());
      std::string o = line.substr(start, comma - start);
      o.erase(0, o.find_first_not_of(" \t\r"));
      o.erase(o.find_last_not_of(" \t\r") + 1);
      if (!o.empty()) {
        Status st = ApplyOption(o, cfg, given, depth + 1);
        if (!st.ok()) return Invalid(path + ":" + std::to_string(n) + ": " + st.message());
      }
      start = comma + 1;
    }
  }
  return Status::Ok();
}

// N[+N...]: one count per tier (keep=, keep_every=, durability_tier=).
Result<std::vector<uint64_t>> Counts(const std::string& val, const std::string& opt) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (start <= val.size()) {
    const size_t plus = std::min(val.find('+', start), val.size());
    const std::string n = val.substr(start, plus - start);
    if (n.empty() || n.size() > 18 || n.find_first_not_of("0123456789") != std::string::npos) {
      return Invalid("bad count in option '" + opt + "'");
    }
    out.push_back(std::stoull(n));
    start = plus + 1;
  }
  return out;
}

// "HOST:PORT": a host name or IPv4 address, a port of digits.
bool IsHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size() || s.size() - colon > 6) {
    return false;
  }
  return s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") ==
             colon &&
         s.find_first_not_of("0123456789", colon + 1) == std::string::npos;
}

// Applies one -o option to cfg; options ckptfs does not know go to FUSE.
Status ApplyOption(const std::string& opt, Config& cfg, GivenKeys& given, int depth) {
  auto eq = opt.find('=');
  std::string key = opt.substr(0, eq);
  given.insert(key);
  std::string val = eq == std::string::npos ? "" : opt.substr(eq + 1);
  auto size = [&](auto& field) -> Status {
    ASSIGN_OR_RETURN(uint64_t v, ParseSize(val));
    field = static_cast<std::remove_reference_t<decltype(field)>>(v);
    return Status::Ok();
  };
  // What mount(8) and fstab lines carry for mount itself, not for the filesystem.
  if (key == "_netdev" || key == "nofail" || key == "auto" || key == "noauto" ||
      key == "user" || key == "users" || key == "nouser" || key == "defaults" ||
      key == "comment" || key.starts_with("x-")) {
    return Status::Ok();
  }
  // The command line's flags, as options (fstab lines, config files).
  if (key == "cache_dir") {
    if (val.empty()) return Invalid("cache_dir= needs a directory");
    return (cfg.cache_dir = AbsolutePath(val)), Status::Ok();
  }
  // peers=A:P,B:P: the -o list's commas split it, so the pieces after the first come here bare.
  if (key == "peers" || (eq == std::string::npos && !cfg.peers.empty() && IsHostPort(opt))) {
    const std::string addr = key == "peers" ? val : opt;
    if (!IsHostPort(addr)) return Invalid("peers takes HOST:PORT[,HOST:PORT...], not '" + addr + "'");
    return cfg.peers.push_back(addr), Status::Ok();
  }
  if (key == "peer_listen") return (cfg.peer_listen = val), Status::Ok();
  if (key == "backend") return cfg.backends.push_back(val), Status::Ok();
  if (key == "s3_endpoint") return (cfg.s3_endpoint = val), Status::Ok();
  if (key == "log_level") return (cfg.log_level = val), Status::Ok();
  if (key == "config") return ApplyConfigFile(AbsolutePath(val), cfg, given, depth);
  try {
    if (key == "ram_cache") return size(cfg.ram_cache_bytes);
    if (key == "reorder_buffer") return size(cfg.reorder_bytes);
    if (key == "write_queue") return size(cfg.write_queue_bytes);
    if (key == "write_memory") return size(cfg.write_memory_bytes);
    if (key == "write_threads") return (cfg.write_threads = std::stoul(val)), Status::Ok();
    if (key == "cut_threads") return (cfg.cut_threads = std::stoul(val)), Status::Ok();
    if (key == "readahead_chunks") return (cfg.readahead_chunks = std::stoul(val)), Status::Ok();
    if (key == "read_threads") return (cfg.read_threads = std::stoul(val)), Status::Ok();
    if (key == "max_readahead") return size(cfg.max_readahead_bytes);
    if (key == "chunk_min") return size(cfg.chunking.min_bytes);
    if (key == "chunk_avg") return size(cfg.chunking.avg_bytes);
    if (key == "chunk_max") return size(cfg.chunking.max_bytes);
    if (key == "tensor_piece") return size(cfg.chunking.piece_bytes);
    if (key == "tensor_chunking") return (cfg.chunking.tensor_boundaries = val != "0"), Status::Ok();
    if (key == "io_engine") return (cfg.io_engine = val), Status::Ok();
    if (key == "view_rules") return (cfg.view_rules = val), Status::Ok();
    if (key == "hf_shard_size") return size(cfg.view_hf_shard_bytes);
    if (key == "views") {
      if (val != "hidden" && val != "visible") return Invalid("views= takes hidden or visible");
      return (cfg.views_visible = val == "visible"), Status::Ok();
    }
    if (key == "durability") return (cfg.durability = val), Status::Ok();
    if (key == "metrics") return (cfg.metrics_address = val), Status::Ok();
    if (key == "keep" || key == "keep_every") {
      ASSIGN_OR_RETURN((key == "keep" ? cfg.tier_keep : cfg.tier_keep_every), Counts(val, opt));
      return Status::Ok();
    }
    if (key == "durability_tier") {
      cfg.durability_tiers.clear();
      if (val == "all") return Status::Ok();
      ASSIGN_OR_RETURN(std::vector<uint64_t> tiers, Counts(val, opt));
      for (uint64_t n : tiers) {
        if (n < 1 || n > kMaxTiers) return Invalid("durability_tier counts tiers from 1");
        cfg.durability_tiers.push_back(static_cast<int>(n - 1));
      }
      return Status::Ok();
    }
    if (key == "cache_size") return size(cfg.cache_bytes);
    if (key == "upload_threads") return (cfg.upload_threads = std::stoul(val)), Status::Ok();
    if (key == "peer_timeout") return (cfg.peer_timeout_s = std::stod(val)), Status::Ok();
    if (key == "peer_heartbeat") return (cfg.peer_heartbeat_s = std::stod(val)), Status::Ok();
    if (key == "peer_discovery") return (cfg.peer_discovery = val != "0"), Status::Ok();
    if (key == "remote_timeout") return (cfg.remote_timeout_s = std::stod(val)), Status::Ok();
    if (key == "sync_interval") return (cfg.sync_interval_s = std::stod(val)), Status::Ok();
    if (key == "settle_interval") return (cfg.settle_interval_s = std::stod(val)), Status::Ok();
    if (key == "warm") {
      if (val != "checkpoint" && val != "file" && val != "off") {
        return Invalid("warm must be checkpoint, file or off");
      }
      return (cfg.warm = val), Status::Ok();
    }
    if (key == "sync_full_interval") {
      return (cfg.sync_full_interval_s = std::stod(val)), Status::Ok();
    }
    if (key == "gc_window") return (cfg.gc_window_s = std::stod(val)), Status::Ok();
    if (key == "mount_timeout") return (cfg.mount_timeout_s = std::stod(val)), Status::Ok();
    if (key == "writeback_cache") return (cfg.writeback_cache = val != "0"), Status::Ok();
    if (key == "passthrough") return (cfg.passthrough = val != "0"), Status::Ok();
    if (key == "packs") return (cfg.packs = val != "0"), Status::Ok();
    if (key == "max_threads") return (cfg.max_threads = std::stoul(val)), Status::Ok();
    if (key == "max_background") return (cfg.max_background = std::stoul(val)), Status::Ok();
    if (key == "attr_timeout") return (cfg.attr_timeout_s = std::stod(val)), Status::Ok();
    if (key == "entry_timeout") return (cfg.entry_timeout_s = std::stod(val)), Status::Ok();
  } catch (const std::exception&) {
    return Invalid("bad value in option '" + opt + "'");
  }
  cfg.fuse_options.push_back(opt);
  return Status::Ok();
}

}  // namespace

Status ParseMountArgs(const std::vector<std::string>& args, Config& cfg) {
  GivenKeys given;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> Result<std::string> {
      if (i + 1 >= args.size()) return Invalid(a + " needs a value");
      return args[++i];
    };
    if (a == "--foreground" || a == "-f") {
      cfg.foreground = true;
    } else if (a == "--cache-dir") {
      ASSIGN_OR_RETURN(cfg.cache_dir, next());
      cfg.cache_dir = AbsolutePath(cfg.cache_dir);
    } else if (a == "--backend") {
      ASSIGN_OR_RETURN(std::string url, next());
      cfg.backends.push_back(std::move(url));
    } else if (a == "--s3-endpoint") {
      ASSIGN_OR_RETURN(cfg.s3_endpoint, next());
    } else if (a == "--backend-faults") {  // tests; its own flag: a spec has commas
      ASSIGN_OR_RETURN(cfg.backend_faults, next());
    } else if (a == "--cache-faults") {  // tests
      ASSIGN_OR_RETURN(cfg.cache_faults, next());
    } else if (a == "--log-level") {
      ASSIGN_OR_RETURN(cfg.log_level, next());
    } else if (a == "-o") {
      ASSIGN_OR_RETURN(std::string opts, next());
      size_t start = 0;
      while (start <= opts.size()) {
        size_t comma = opts.find(',', start);
        std::string o = opts.substr(start, comma == std::string::npos ? comma : comma - start);
        if (!o.empty()) RETURN_IF_ERROR(ApplyOption(o, cfg, given, 0));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (!a.empty() && a[0] == '-') {
      return Invalid("unknown option " + a);
    } else if (cfg.mountpoint.empty()) {
      cfg.mountpoint = AbsolutePath(a);
    } else {
      return Invalid("unexpected argument " + a);
    }
  }
  // A chunk missing locally costs a round trip to the backend: read further ahead, on more
  // threads, unless told otherwise.
  if (!cfg.backends.empty()) {
    if (!given.count("readahead_chunks")) cfg.readahead_chunks = 16;
    if (!given.count("read_threads")) cfg.read_threads = 8;
  }
  return cfg.Validate();
}


std::vector<std::string> MountHelperArgs(const std::vector<std::string>& args, bool helper) {
  if (args.size() < 2 || args[0].empty() || args[0][0] == '-') return {};
  // Run by name (mount.fuse3's way), SOURCE must say it is ours: a mistyped command
  // (`ckptfs stat DIR`) is not a mount.
  const bool url = args[0].find("://") != std::string::npos;
  if (!helper && !url && args[0] != "ckptfs") return {};
  struct stat st;
  if (::stat(args[1].c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return {};
  std::vector<std::string> out = {args[1]};
  out.insert(out.end(), args.begin() + 2, args.end());
  if (url) {  // the shared tier: after any backend= among the options
    out.push_back("--backend");
    out.push_back(args[0]);
  }
  return out;
}

}  // namespace ckptfs
