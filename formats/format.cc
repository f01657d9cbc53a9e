#include "formats/format.h"

#include <cstring>

namespace ckptfs {

std::string_view FormatName(FileFormat f) {
  switch (f) {
    case FileFormat::kUnknown:
      return "unknown";
    case FileFormat::kTorchZip:
      return "torch-zip";
    case FileFormat::kTorchLegacy:
      return "torch-legacy";
    case FileFormat::kSafetensors:
      return "safetensors";
    case FileFormat::kDcpMetadata:
      return "dcp-metadata";
    case FileFormat::kDcpData:
      return "dcp-data";
  }
  return "unknown";
}

FileFormat SniffFormat(const uint8_t* head, size_t len, std::string_view file_name) {
  auto ends_with = [&](std::string_view suffix) {
    return file_name.size() >= suffix.size() &&
           file_name.substr(file_name.size() - suffix.size()) == suffix;
  };
  if (file_name == ".metadata" || ends_with("/.metadata")) {
    if (len >= 2 && head[0] == 0x80) return FileFormat::kDcpMetadata;
  }
  // Without a name (the mount describes files by content): the pickle names its class early.
  const std::string_view text(reinterpret_cast<const char*>(head), len);
  if (len >= 2 && head[0] == 0x80 && text.find("torch.distributed.checkpoint.metadata") !=
                                          std::string_view::npos &&
      text.find("Metadata") != std::string_view::npos) {
    return FileFormat::kDcpMetadata;
  }
  if (len >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) {
    return ends_with(".distcp") ? FileFormat::kDcpData : FileFormat::kTorchZip;
  }
  // safetensors: a little-endian u64 header length, then a JSON object (writers may pad in front
  // of it with spaces to align the buffer).
  if (len >= 9 && (head[8] == '{' || head[8] == ' ')) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | head[i];
    if (n >= 2 && n < (uint64_t{1} << 32)) return FileFormat::kSafetensors;
  }
  // Legacy torch.save: a protocol-2 pickle of the magic number 0x1950a86a20f9469cfc6c.
  static constexpr uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9};
  if (len >= sizeof(kLegacyMagic) && std::memcmp(head, kLegacyMagic, sizeof(kLegacyMagic)) == 0) {
    return FileFormat::kTorchLegacy;
  }
  if (ends_with(".distcp")) return FileFormat::kDcpData;
  return FileFormat::kUnknown;
}

}  // namespace ckptfs
