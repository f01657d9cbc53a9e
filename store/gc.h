// Garbage collection of a shared backend's chunk space (docs/gc.md): the objects of the protocol
// between the collector and the nodes, and the collector itself (`ckptfs gc`).
//
// The bucket holds, besides chunks/, files/ and dirs/ (store/remote_tier.h):
//   gc/round            the last round: its epoch, whether it is active (chunks condemned, sweep
//                       pending) or done, and the collector's deadline
//   gc/condemned-<E>    the chunk ids round E may delete: 16 bytes each, ascending
//
// Only durations are compared, each measured by one side on its own steady clock; no two
// machines' clocks are compared.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "common/chunk_id.h"
#include "common/status.h"

namespace ckptfs {

inline constexpr char kGcRoundKey[] = "gc/round";
std::string GcCondemnedKey(uint64_t epoch);

struct GcRound {
  uint64_t epoch = 0;     // 0: no round has ever run on this backend
  bool active = false;    // condemned chunks may still be deleted
  // The collector deletes nothing later than this many seconds after it wrote the round (by its
  // own clock); a node that has seen the round active for longer treats it as over.
  double deadline_s = 0;

  std::string Encode() const;
  static Result<GcRound> Decode(std::string_view text);
};

// gc/round as the backend holds it now; epoch 0 when there is none.
Result<GcRound> ReadGcRound(Backend& backend);
// The condemned ids of round `epoch`, ascending (kNotFound once a later round removed them).
Result<std::vector<ChunkId>> ReadCondemned(Backend& backend, uint64_t epoch);

struct GcOptions {
  bool dry_run = true;
  // How long the collector waits between condemning chunks and deleting them. Must exceed
  // every node's gc_window (the longest it may take from reading gc/round to putting a record).
  double grace_s = 900;
  // How long after writing the round the collector may still delete (see GcRound::deadline_s).
  double deadline_s = 0;  // 0: grace_s + 2 hours
  std::string spill_dir;  // for the reference spill files; must exist and be empty
  uint32_t threads = 8;   // deletes in flight
  // A progress line (called often; the caller throttles); and a sleep the tests may shorten.
  std::function<void(const std::string&)> progress;
};

struct GcReport {
  uint64_t records = 0, bad_records = 0, references = 0;
  uint64_t chunks = 0, chunk_bytes = 0;              // in chunks/ at the first listing
  uint64_t unreferenced = 0, unreferenced_bytes = 0;  // condemned
  size_t peak_ids = 0;                               // chunk ids in memory at once
  uint64_t epoch = 0;                                // the round run (0: none)
  uint64_t rereferenced = 0;    // condemned, then named by a record written during the grace
  uint64_t deleted = 0, deleted_bytes = 0;
  uint64_t left = 0;            // condemned and unreferenced, not deleted (deadline, errors)
  std::string error;            // why the round stopped early ("" when it did not)
};

// One collection. With dry_run, counts what a round would condemn and changes nothing. Otherwise
// condemns (gc/condemned-E, then gc/round active), waits grace_s, reads every record again and
// deletes the condemned chunks that none names, then marks the round done. An unreadable record
// stops it before any deletion (report.bad_records; the round is closed with nothing deleted).
// Errors: the backend could not be listed or written before anything was deleted.
Result<GcReport> CollectGarbage(Backend& backend, const GcOptions& opts);

}  // namespace ckptfs
