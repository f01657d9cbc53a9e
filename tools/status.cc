// ckptfs status [MOUNTPOINT|PATH] [--json]: the daemon's state, read from user.ckptfs.status on
// the mount's root (fs/status.cc builds it).
#include <sys/xattr.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "formats/json.h"
#include "tools/commands.h"
#include "tools/mount_table.h"

namespace ckptfs {
namespace {

// The ckptfs mount that holds `path`: itself or the nearest parent that is one.
std::optional<MountEntry> EnclosingMount(std::string path) {
  while (true) {
    if (auto m = FindMount(path)) return m;
    if (path == "/") return std::nullopt;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
}

int64_t Int(const json::Value& v, std::string_view key) {
  const json::Value* f = v.Find(key);
  return f && f->is_int() ? f->as_int() : 0;
}

std::string Str(const json::Value& v, std::string_view key) {
  const json::Value* f = v.Find(key);
  return f && f->is_string() ? f->as_string() : "";
}

std::string Duration(int64_t s) {
  char out[64];
  if (s >= 86400) {
    std::snprintf(out, sizeof(out), "%lldd %lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  } else if (s >= 3600) {
    std::snprintf(out, sizeof(out), "%lldh %lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else {
    std::snprintf(out, sizeof(out), "%lldm %llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return out;
}

void PrintHuman(const json::Value& st) {
  const json::Value& local = *st.Find("local_tier");
  const json::Value& ram = *st.Find("ram_tier");
  const json::Value& queue = *st.Find("write_queue");
  std::printf("ckptfs %s on %s (cache %s), daemon pid %lld, up %s\n", Str(st, "version").c_str(),
              Str(st, "mountpoint").c_str(), Str(st, "cache_dir").c_str(),
              static_cast<long long>(Int(st, "pid")), Duration(Int(st, "uptime_s")).c_str());
  std::printf("passthrough: %s\n", Str(st, "passthrough").c_str());
  const int64_t limit = Int(local, "limit");
  std::printf("local tier: %s used%s, %s not on a remote tier yet\n",
              HumanBytes(static_cast<double>(Int(local, "bytes"))).c_str(),
              limit ? (" of " + HumanBytes(static_cast<double>(limit))).c_str() : " (no limit)",
              HumanBytes(static_cast<double>(Int(local, "not_uploaded"))).c_str());
  std::printf("RAM tier: %s of %s; write queue: %s of %s; open files: %lld\n",
              HumanBytes(static_cast<double>(Int(ram, "bytes"))).c_str(),
              HumanBytes(static_cast<double>(Int(ram, "limit"))).c_str(),
              HumanBytes(static_cast<double>(Int(queue, "bytes"))).c_str(),
              HumanBytes(static_cast<double>(Int(queue, "limit"))).c_str(),
              static_cast<long long>(Int(st, "open_files")));
  std::printf("files closed without fsync and not yet durable: %lld\n",
              static_cast<long long>(Int(st, "files_not_yet_durable")));
  const json::Value* tiers = st.Find("tiers");
  const json::Array none;
  const json::Array& tier_list = tiers && tiers->is_array() ? tiers->as_array() : none;
  if (tier_list.empty()) std::printf("remote tiers: none\n");
  for (const json::Value& t : tier_list) {
    const json::Value* failing = t.Find("failing");
    const bool bad = failing && failing->is_bool() && failing->as_bool();
    std::printf("tier %lld %s: %s, %lld files and changes waiting to be published\n",
                static_cast<long long>(Int(t, "tier")), Str(t, "url").c_str(),
                bad ? ("retrying after: " + Str(t, "last_error")).c_str() : "ok",
                static_cast<long long>(Int(t, "waiting")));
  }
  if (const json::Value* ns = st.Find("namespace_sync"); ns && !tier_list.empty()) {
    const std::string mode = Str(*ns, "mode");
    if (mode == "journal") {
      std::printf("namespace sync: the change journal, read up to entry %lld\n",
                  static_cast<long long>(Int(*ns, "journal_entry")));
    } else if (mode == "listing") {
      std::printf("namespace sync: a full listing every pass\n");
    } else {
      std::printf("namespace sync: no pass yet\n");
    }
  }
  if (const json::Value* o = st.Find("options"); o && o->is_object()) {
    std::string line;
    for (const auto& [k, v] : o->as_object()) {
      line.append(" ").append(k).append("=");
      if (v.is_array()) {  // FUSE's own options
        for (size_t i = 0; i < v.as_array().size(); ++i) {
          const json::Value& f = v.as_array()[i];
          line.append(i ? "," : "").append(f.is_string() ? f.as_string() : "?");
        }
      } else {
        line.append(v.is_string() ? v.as_string()
                    : v.is_bool() ? (v.as_bool() ? "1" : "0")
                    : v.is_int()  ? std::to_string(v.as_int())
                    : v.is_number() ? std::to_string(v.as_double())
                                    : "-");
      }
    }
    std::printf("options:%s\n", line.c_str());
  }
  const json::Value* errors = st.Find("recent_errors");
  if (errors && errors->is_array() && !errors->as_array().empty()) {
    std::printf("recent errors and warnings (newest last):\n");
    for (const json::Value& e : errors->as_array()) {
      std::printf("  %s\n", e.is_string() ? e.as_string().c_str() : "?");
    }
  } else {
    std::printf("recent errors and warnings: none\n");
  }
}

}  // namespace

int ShowStatus(const std::vector<std::string>& args) {
  std::string path = ".";
  bool as_json = false, have_path = false;
  for (const std::string& a : args) {
    if (a == "--json") {
      as_json = true;
    } else if (!a.empty() && a[0] == '-') {
      Fail("status: unknown option " + a + " (usage: ckptfs status [MOUNTPOINT|PATH] [--json])");
      return kExitUsage;
    } else if (have_path) {
      Fail("status: one MOUNTPOINT only");
      return kExitUsage;
    } else {
      path = a;
      have_path = true;
    }
  }
  // Symlinks resolved where the path exists (not on a dead mount: lexically then).
  char* real = ::realpath(path.c_str(), nullptr);
  const std::string resolved = real ? std::string(real) : AbsolutePath(path);
  std::free(real);
  auto mount = EnclosingMount(resolved);
  if (!mount) return Fail(path + " is in no ckptfs mount");
  std::string value(kMaxXattrValue, '\0');
  const ssize_t n =
      ::getxattr(mount->mountpoint.c_str(), "user.ckptfs.status", value.data(), value.size());
  if (n < 0) {
    const int err = errno;
    return Fail(mount->mountpoint + ": " +
                (err == ENOTCONN ? std::string("the daemon is gone (a dead mount): run `ckptfs "
                                               "umount ") + mount->mountpoint + "`"
                 : err == ENODATA ? std::string("its daemon is too old to report its status")
                                  : std::string(std::strerror(err))));
  }
  value.resize(static_cast<size_t>(n));
  if (as_json) {
    std::printf("%s\n", value.c_str());
    return std::fflush(stdout) == 0 && !std::ferror(stdout) ? 0 : Fail("status: cannot write");
  }
  auto st = json::Parse(value);
  auto object = [&](const char* k) { return st->Find(k) && st->Find(k)->is_object(); };
  if (!st.ok() || !st->is_object() || !object("local_tier") || !object("ram_tier") ||
      !object("write_queue")) {
    return Fail("the daemon's status is not what this ckptfs reads: " + value);
  }
  PrintHuman(*st);
  return 0;
}

}  // namespace ckptfs
