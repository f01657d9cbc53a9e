// The zip container as torch.save writes it, read two ways:
//
// - Front to back, one header at a time (the streaming scanner in torch_scanner.h uses this while a
//   file is being written): torch.save writes each record as a local header with a data descriptor
//   (the sizes follow the data), so a record's length is not in its header. Zip64 records (large,
//   or past 4 GiB) carry a zip64 extra field and a 24-byte descriptor.
// - From the end (a finished file): the end-of-central-directory record, zip64 when needed, then
//   the central directory, then each record's local header for where its data starts.
//
// Only stored (uncompressed) records have a data range in the file; torch never compresses.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace ckptfs::zip {

constexpr uint32_t kLocalSig = 0x04034b50;       // PK\3\4
constexpr uint32_t kDescriptorSig = 0x08074b50;  // PK\7\8
constexpr uint32_t kCentralSig = 0x02014b50;     // PK\1\2
constexpr uint32_t kEocdSig = 0x06054b50;        // PK\5\6
constexpr uint32_t kEocd64Sig = 0x06064b50;      // PK\6\6
constexpr uint32_t kLocator64Sig = 0x07064b50;   // PK\6\7
constexpr size_t kLocalFixed = 30;
constexpr size_t kCentralFixed = 46;
constexpr size_t kEocdFixed = 22;

uint16_t Le16(const uint8_t* p);
uint32_t Le32(const uint8_t* p);
uint64_t Le64(const uint8_t* p);

struct LocalHeader {
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;  // from the zip64 extra field when the 32-bit field is 0xffffffff
  uint64_t size = 0;
  std::string name;
  bool zip64 = false;     // a zip64 extra field: the data descriptor has 64-bit sizes
  size_t header_len = 0;  // 30 + name + extra: the data starts this far after the header
  bool has_descriptor() const { return flags & 0x8; }
  // The size written in the header, or nullopt when it follows the data (a data descriptor).
  std::optional<uint64_t> known_size() const;
};

// Parses a local header from p[0..len). Returns nullopt when more bytes are needed (*need gets how
// many in all), an error when the bytes are not a local header.
Result<std::optional<LocalHeader>> ParseLocalHeader(const uint8_t* p, size_t len, size_t* need);

// Length of the data descriptor that follows a record's data (signature included).
inline size_t DescriptorLen(bool zip64) { return zip64 ? 24 : 16; }
// Checks that p (DescriptorLen bytes) is a data descriptor for a stored record of `size` bytes.
bool IsDescriptorFor(const uint8_t* p, bool zip64, uint64_t size);

// A record of a finished archive, found through its central directory.
struct Entry {
  std::string name;
  uint16_t method = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t header_offset = 0;  // of the local header
  uint64_t data_offset = 0;    // of the data: header_offset + the local header's length
};

// Random access to a finished file: returns exactly `len` bytes at `offset`, or an error.
using ReadAtFn = std::function<Result<std::string>(uint64_t offset, size_t len)>;

struct Directory {
  std::vector<Entry> entries;  // in central-directory order; offsets are in the file
  uint64_t archive_end = 0;    // one past the end-of-central-directory record
  // Where the archive starts: 0 for a torch.save file; later archives of a file that holds
  // several back to back (DCP .distcp) count their offsets from their own start.
  uint64_t archive_start = 0;
  const Entry* Find(const std::string& name) const;
};

// Reads the directory of the archive that ends at `file_size`, and each record's local header.
// The archive may start after other bytes: its start is found from where its central directory
// really lies (the end record says where it lies relative to the archive's start).
// Errors (kCorrupt, naming what is wrong): no end record, offsets outside the file, a central entry
// and its local header that disagree, entries that overlap.
Result<Directory> ReadDirectory(uint64_t file_size, const ReadAtFn& read_at);

}  // namespace ckptfs::zip
