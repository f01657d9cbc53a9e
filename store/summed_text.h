// Small text objects of the bucket that carry their own sum (journal entries, snapshot
// manifests): "<magic>\n" then "name=value" lines, and last "sum=<XXH3-128 hex of the bytes
// before it>". A reader trusts nothing of one whose sum does not check.
#pragma once

#include <string>
#include <string_view>

namespace ckptfs {

// body (which ends with a newline) followed by its sum line.
std::string WithSum(std::string body);
// The body without its sum line when that line is there and right and the body begins with
// `magic`; empty otherwise (bytes damaged in the bucket or on the way).
std::string_view VerifiedBody(std::string_view text, std::string_view magic);
// The value of the first line "name=value" in body; empty when absent.
std::string TextField(std::string_view body, std::string_view name);

}  // namespace ckptfs
