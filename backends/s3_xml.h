// A small XML reader for S3's answers (ListBucketResult, InitiateMultipartUploadResult,
// CompleteMultipartUploadResult, Error). Not a general XML parser: no DTDs (a DOCTYPE is
// refused, so no entity can expand), attributes are skipped, namespace prefixes are dropped from
// element names. It never trusts its input: malformed documents come back as kCorrupt.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ckptfs {

struct XmlElement {
  std::string name;  // local name, without any "prefix:"
  std::string text;  // character data directly inside, entities and CDATA decoded
  std::vector<XmlElement> children;

  // The first child named `name`, or nullptr.
  const XmlElement* Child(std::string_view name) const;
  // That child's text, or "" when there is no such child.
  std::string ChildText(std::string_view name) const;
};

// Parses a whole document with one root element. kCorrupt, with the byte offset, when it is not
// well formed, nests deeper than 64 elements, or uses an entity other than the five predefined
// ones and numeric character references.
Result<XmlElement> ParseXml(std::string_view doc);

// Escapes & < > " ' for element text.
std::string XmlEscape(std::string_view s);

}  // namespace ckptfs
