// What kind of file a checkpoint file is. formats/ is pure: bytes in, descriptions out; no I/O,
// no FUSE, no store. That keeps every parser fast to test and easy to fuzz.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ckptfs {

enum class FileFormat : uint8_t {
  kUnknown,      // stored generically (content-defined chunks)
  kTorchZip,     // torch.save since torch 1.6: a zip of data.pkl + one record per storage
  kTorchLegacy,  // torch.save before 1.6: pickles back to back; recognized, stored generically
  kSafetensors,  // 8-byte header length, JSON header, tensor bytes
  kDcpMetadata,  // torch.distributed.checkpoint `.metadata`: a pickle of Metadata
  kDcpData,      // a DCP `__R_N.distcp` file: torch.save archives and raw bytes back to back
};

std::string_view FormatName(FileFormat f);

// Guesses the format from a file's first bytes (at least 8 where the file has them, 128 to
// recognize a DCP .metadata without its name) and its name.
// Only a cheap look: the parsers decide for real.
FileFormat SniffFormat(const uint8_t* head, size_t len, std::string_view file_name);

}  // namespace ckptfs
