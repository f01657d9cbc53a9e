// Retention: which checkpoints of a run directory stay. Shared by `ckptfs retain` (deletes
// through the mount), the daemon's passes of user.ckptfs.retain and the remote tiers' keep=
// policies (drop files from a nearer tier).
//
// The checkpoints of a directory ROOT are its subdirectories of the layouts ckptfs recognizes:
// Megatron-LM's iter_NNNNNNN, DeepSpeed's global_stepN, and directories holding a DCP .metadata
// (their step: the last number in the name). Where ROOT has none of these, every subdirectory is
// one, ordered by modification time. Pure functions: the callers list the directories.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ckptfs {

struct CheckpointDir {
  std::string name;
  bool dcp_metadata = false;  // holds a .metadata file
  int64_t mtime_ns = 0;
  uint64_t ino = 0;  // the caller's handle for it, carried into its decision
};

struct RetentionPolicy {
  uint64_t keep_last = 0;   // the newest N stay
  uint64_t keep_every = 0;  // and every K-th step (0: none)
};

struct RetentionDecision {
  std::string name;
  uint64_t ino = 0;  // CheckpointDir::ino
  std::optional<uint64_t> step;
  std::string keep;  // why it stays; empty: it may go
};

// Whether `name` (with or without a DCP .metadata in it) is a checkpoint of a layout ckptfs
// recognizes, rather than a plain directory.
bool IsRecognizedCheckpoint(const CheckpointDir& d);

// The trimmed contents of ROOT's tracker files ("" when absent).
struct Trackers {
  std::string megatron;   // latest_checkpointed_iteration.txt: an iteration or "release"
  std::string deepspeed;  // latest: a tag
  std::string universal;  // latest_universal: a tag
};

// The policy a run directory's user.ckptfs.retain attribute names: "keep_last=N[,keep_every=K]"
// (items separated by commas or spaces, N >= 1). kInvalid, saying what is wrong, otherwise.
Result<RetentionPolicy> ParseRetainXattr(std::string_view value);

// The checkpoints among `dirs`, oldest first, each with the reason it stays (the newest
// keep_last, every keep_every-th step, the one a tracker names) or none.
std::vector<RetentionDecision> DecideRetention(const std::vector<CheckpointDir>& dirs,
                                               const Trackers& trackers,
                                               const RetentionPolicy& policy);

}  // namespace ckptfs
