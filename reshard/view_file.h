// A view file: its recipe, and the CRC-32s of its zip records still to be computed.
//
// A torch zip names each record's CRC-32 in two headers, before the data a reader may want first
// (torch reads the central directory, then data.pkl). A record that copies or concatenates whole
// source records gets its CRC from theirs (zlib's crc32_combine); any other needs one pass over
// its source bytes, done once per view file by ComputeCrcs before its first read.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "reshard/recipe.h"

namespace ckptfs::reshard {

// One gather of a record: `rows` rows of the concatenated parts (see Segment); a gather with no
// parts is `zeros` zero bytes (padding a partition); a `mean` gather is one row, the mean of
// its parts as `mean_out` (Recipe::AddMean).
struct Gather {
  uint64_t rows = 1;
  std::vector<Part> parts;
  uint64_t zeros = 0;
  bool mean = false;
  MeanOut mean_out = MeanOut::kFloat32;
};
// The bytes a gather makes.
uint64_t GatherBytes(const Gather& g);

struct CrcTask {
  size_t first_segment = 0, last_segment = 0;  // the record's data segments
  std::vector<std::pair<size_t, size_t>> slots;  // (literal index, byte position) to patch
};

struct ViewFile {
  Recipe recipe;
  std::vector<CrcTask> crc_tasks;  // empty once the CRCs are in place
};

// A file of a view that is a tree of files: its path under the view's directory, and itself.
struct ViewEntry {
  std::string path;
  ViewFile file;
};

// Streams source bytes [offset, offset + len) of `source` to sink, in order, in pieces.
using SourceReadFn = std::function<Status(uint32_t source, uint64_t offset, uint64_t len,
                                          const std::function<void(const uint8_t*, size_t)>& sink)>;
// The CRC-32 of source bytes [offset, offset + len) when known without reading them (a whole
// record of a source zip), else nullopt.
using KnownCrcFn = std::function<std::optional<uint32_t>(uint32_t source, uint64_t offset,
                                                         uint64_t len)>;

// Bytes [offset, offset + len) of mean piece `pc` (Piece::mean), read through `read`, into out.
Status MeanBytes(const Piece& pc, const SourceReadFn& read, uint8_t* out);

// Bytes [offset, offset + len) of a view file.
using ViewBytesFn = std::function<void(uint64_t offset, const uint8_t* data, size_t len)>;

// Computes every pending CRC of `f` and patches its headers; reads through `read` what `known`
// cannot tell. The records are spread over `threads` threads (the caller's included), so `read`,
// `known` and `seen` must be thread-safe when threads > 1. `seen`, when given, gets every byte of
// the records, in pieces of up to 16 MiB that start at multiples of 16 MiB of the file except
// where a record or a known source record starts, so that the caller can keep them for the reads
// that follow; the known source records are then read too (not checksummed): a file opened is
// read whole by torch.load, and the pass reads on several threads where a reader reads on one.
// Errors: those of `read`. On error `f` is unchanged.
Status ComputeCrcs(ViewFile* f, const SourceReadFn& read, const KnownCrcFn& known,
                   size_t threads = 1, const ViewBytesFn& seen = nullptr);

// Writes a torch zip (all records stored, data aligned to 64 bytes, CRCs and sizes in the local
// headers, zip64 where needed) as a ViewFile.
class TorchZipWriter {
 public:
  // `prefix`: the record prefix, e.g. "archive" (records are prefix/data.pkl, prefix/data/0, ...).
  explicit TorchZipWriter(std::string prefix) : prefix_(std::move(prefix)) {}
  // A record of literal bytes; `name` is relative to the prefix.
  void AddBytes(const std::string& name, std::string bytes);
  // A record made of gathers; its CRC is left to ComputeCrcs.
  void AddGathers(const std::string& name, const std::vector<Gather>& gathers);
  // Appends the central directory and returns the file. The writer is spent.
  ViewFile Finish();

 private:
  struct Record {
    std::string name;
    uint64_t size = 0;
    uint32_t crc = 0;
    uint64_t header_offset = 0;
    size_t header_literal = 0;
    bool pending = false;  // CRC left to ComputeCrcs (task index = pending_index)
    size_t pending_index = 0;
  };
  // Appends the local header of a record of `size` bytes; returns its literal index.
  void AddHeader(Record* r);

  std::string prefix_;
  ViewFile file_;
  std::vector<Record> records_;
};

}  // namespace ckptfs::reshard
