// Predictive prefetch: a job that opens one file of a checkpoint is about to read the rest of it
// (its sibling ranks, the optimizer shards next to the model), so the first open of a checkpoint
// whose chunks are off the local tier warms the whole checkpoint in the background. Which
// directory holds "the checkpoint" is read from the names the frameworks write (formats/layout.h
// documents them); anything else warms only the file's siblings.
#include <spdlog/spdlog.h>

#include <cctype>
#include <string>
#include <string_view>

#include "fs/fs_ops.h"

namespace ckptfs::fs {
namespace {

bool Digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Megatron-LM's rank directory: mp_rank_TT, mp_rank_TT_PPP or mp_rank_TT_PPP_EEE.
bool IsMegatronRankDir(std::string_view name) {
  if (name.substr(0, 8) != "mp_rank_") return false;
  name.remove_prefix(8);
  for (size_t part = 0; part < 3 && !name.empty(); ++part) {
    const size_t end = name.find('_');
    if (!Digits(name.substr(0, end))) return false;
    name = end == std::string_view::npos ? std::string_view() : name.substr(end + 1);
    if (end != std::string_view::npos && name.empty()) return false;
  }
  return name.empty();
}

// A directory that holds one whole checkpoint: Megatron's iter_NNNNNNN or release, DeepSpeed's
// global_stepN tag.
bool IsCheckpointDir(std::string_view name) {
  return (name.substr(0, 5) == "iter_" && Digits(name.substr(5))) || name == "release" ||
         (name.substr(0, 11) == "global_step" && Digits(name.substr(11)));
}

// Names that torch.save, safetensors and DCP files carry.
bool IsCheckpointFile(std::string_view name) {
  for (std::string_view ext : {".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".distcp"}) {
    if (name.size() > ext.size() && name.substr(name.size() - ext.size()) == ext) return true;
  }
  return name == ".metadata";
}

}  // namespace

void WarmOnOpen(Context& ctx, fuse_ino_t ino) {
  Store* store = ctx.store;
  if (!store->remote() || ctx.cfg.warm == "off") return;  // every chunk is local, or asked not to
  if (ctx.cfg.warm == "file") {
    Status st = store->WarmCheckpoint(ino, ino, false);
    if (!st.ok() && st.code() != Code::kNotFound) {
      ctx.log->warn("inode {}: warming it: {}", ino, st.ToString());
    }
    return;
  }
  auto parent = store->ParentOf(ino);
  if (!parent.ok()) return;
  const auto& [dir, name] = *parent;
  auto dir_entry = store->ParentOf(dir);  // kNotFound for the root
  const std::string dir_name = dir_entry.ok() ? dir_entry->second : std::string();
  uint64_t target = 0;
  bool recursive = true;
  if (IsMegatronRankDir(dir_name)) {
    // iter_NNNNNNN/mp_rank_TT/...: every rank of the iteration; a rank directory found
    // elsewhere: only itself.
    const uint64_t iteration = dir_entry->first;
    auto above = store->ParentOf(iteration);
    target = above.ok() && IsCheckpointDir(above->second) ? iteration : dir;
  } else if (IsCheckpointDir(dir_name) || store->Lookup(dir, ".metadata").ok()) {
    target = dir;  // a DeepSpeed tag, Megatron without rank directories, a DCP directory
  } else if (IsCheckpointFile(name)) {
    target = dir;  // siblings only
    recursive = false;
  } else {
    return;
  }
  Status st = store->WarmCheckpoint(ino, target, recursive);
  if (!st.ok() && st.code() != Code::kNotFound) {
    ctx.log->warn("inode {}: warming its checkpoint: {}", ino, st.ToString());
  }
}

}  // namespace ckptfs::fs
