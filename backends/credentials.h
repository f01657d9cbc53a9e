// Where S3 credentials and the region come from, in the order the AWS tools use:
// the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; AWS_REGION,
// AWS_DEFAULT_REGION), then the shared files ~/.aws/credentials and ~/.aws/config (or
// AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE), profile AWS_PROFILE or "default".
//
// Secrets read here are never logged and never appear in a Status message.
#pragma once

#include <string>

#include "backends/sigv4.h"
#include "common/status.h"

namespace ckptfs {

// The credentials for `profile` (empty: AWS_PROFILE, else "default"). An explicit profile skips
// the environment's keys, as the AWS CLI does with --profile. kPermission when none are found,
// naming the places looked at; kInvalid when a profile has one key without the other.
Result<AwsCredentials> LoadAwsCredentials(const std::string& profile);

// The region: AWS_REGION, AWS_DEFAULT_REGION, the profile's "region" in the config file, else
// "us-east-1".
std::string LoadAwsRegion(const std::string& profile);

// Reads `key` of section `section` from an INI-style AWS file; empty when absent. Exposed for
// tests. Sections are matched by exact name ("default", "profile dev").
std::string ReadAwsIniValue(const std::string& path, const std::string& section,
                            const std::string& key);

}  // namespace ckptfs
