// A record snapshot in the bucket (docs/journal.md, "Snapshots"): every files/ record and dirs/
// marker packed into a few large objects, consistent "as of" journal entry J, so that a new mount
// reads a few objects and then the journal after J instead of one GET per record.
//
//   snapshot/<20-digit J>-<16 hex>/part-<6 digits>   records packed, in key order
//   snapshot/<20-digit J>-<16 hex>/manifest          J, and each part's size, count and XXH3-128
//
// The writer reads J (the journal's newest entry) first, then lists files/ and dirs/ and reads
// each record, then puts the parts, and last the manifest: a snapshot without its manifest is
// not one. The snapshot is never a second truth: every change after J is read again from the
// bucket by the reader's journal pass (the argument is in docs/journal.md). Each snapshot has a
// directory of its own (the random suffix), so two writers never overwrite each other's parts.
//
// Nothing read from the bucket is trusted beyond its checks: sizes are bounded before anything
// is read or allocated, each part must match its sum, and every entry is parsed with bounds
// checks; anything else is kCorrupt and the caller lists the bucket instead.
//
// Stateless: every function may run concurrently with any other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "common/status.h"

namespace ckptfs {

// The version a listing reports for an object, as the namespace sync remembers it: the backend's
// version, or its size where the backend has none.
inline std::string ListedVersion(const ObjectInfo& o) {
  return o.version.empty() ? std::to_string(o.size) : o.version;
}

class NamespaceSnapshot {
 public:
  static constexpr std::string_view kPrefix = "snapshot/";
  // What a reader accepts at most (a larger object is refused before it is read).
  static constexpr uint64_t kMaxManifestBytes = 4 << 20;
  static constexpr uint64_t kMaxPartBytes = uint64_t{1} << 30;

  // One key of the namespace: files/<path> with its record's bytes, or dirs/<path> (no bytes),
  // and the version the writer's listing reported for it (ListedVersion).
  struct Entry {
    std::string key;
    std::string version;
    std::string record;
  };

  struct Part {
    std::string key;
    uint64_t size = 0;
    uint64_t count = 0;  // entries
    std::string sum;     // XXH3-128 hex of the part's bytes
  };
  struct Manifest {
    uint64_t journal = 0;  // J: every change announced up to it is in the snapshot, or newer
    std::string dir;       // snapshot/<J>-<suffix>/
    std::vector<Part> parts;
    uint64_t entries() const;
  };

  struct WriteOptions {
    uint64_t part_bytes = 8 << 20;  // a part is closed once it holds this much
    size_t keep = 2;                // complete snapshots kept (older ones are deleted)
    std::function<void(const std::string&)> progress;  // optional: a line now and then
  };
  struct Written {
    Manifest manifest;
    uint64_t files = 0, dirs = 0, bytes = 0;
    uint64_t pruned = 0;  // objects of older snapshots deleted
  };
  // Writes a snapshot of the namespace in `backend`, then deletes the snapshots older than the
  // newest opts.keep complete ones. A record that cannot be read (gone since the listing: left
  // out, its deletion is after J) or decoded (three tries) fails the snapshot: nothing is
  // trusted then, since no manifest is put.
  static Result<Written> Write(Backend& backend, const WriteOptions& opts);

  // The newest complete snapshot's manifest, checked (kCorrupt when it does not check); nullopt
  // when the bucket holds none. One LIST (of snapshot/) and one GET.
  static Result<std::optional<Manifest>> Newest(Backend& backend);
  // Reads part `p` of a snapshot, checks it, and calls fn for each entry in order; stops at fn's
  // first error and returns it. kCorrupt when the part is not what the manifest says.
  static Status ReadPart(Backend& backend, const Part& p, const std::function<Status(Entry&&)>& fn);

  // Deletes every snapshot older than the newest `keep` complete ones (keep >= 1), and parts
  // left by writers that never finished, when older than those. Returns the objects deleted.
  static Result<uint64_t> Prune(Backend& backend, size_t keep);

  // Encodings (for tests).
  static std::string EncodeManifest(const Manifest& m);
  static Result<Manifest> DecodeManifest(std::string_view dir, std::string_view bytes);
  static std::string ManifestKey(std::string_view dir);
};

}  // namespace ckptfs
