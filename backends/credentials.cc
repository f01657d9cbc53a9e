#include "backends/credentials.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace ckptfs {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::string HomeDir() {
  std::string home = Env("HOME");
  if (!home.empty()) return home;
  if (const passwd* pw = ::getpwuid(::getuid())) return pw->pw_dir;
  return "";
}

std::string AwsFile(const char* env, const char* name) {
  std::string path = Env(env);
  if (!path.empty()) return path;
  std::string home = HomeDir();
  return home.empty() ? "" : home + "/.aws/" + name;
}

std::string ProfileName(const std::string& profile) {
  if (!profile.empty()) return profile;
  std::string env = Env("AWS_PROFILE");
  return env.empty() ? "default" : env;
}

}  // namespace

std::string ReadAwsIniValue(const std::string& path, const std::string& section,
                            const std::string& key) {
  std::ifstream in(path);
  std::string line, current;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = Trim(line.substr(1, line.size() - 2));
      continue;
    }
    if (current != section) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    if (Trim(line.substr(0, eq)) == key) return Trim(line.substr(eq + 1));
  }
  return "";
}

Result<AwsCredentials> LoadAwsCredentials(const std::string& profile) {
  AwsCredentials c;
  if (profile.empty()) {
    c.access_key_id = Env("AWS_ACCESS_KEY_ID");
    c.secret_access_key = Env("AWS_SECRET_ACCESS_KEY");
    c.session_token = Env("AWS_SESSION_TOKEN");
    if (!c.access_key_id.empty() && !c.secret_access_key.empty()) return c;
    if (!c.access_key_id.empty() || !c.secret_access_key.empty()) {
      return Invalid("only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set");
    }
  }
  std::string name = ProfileName(profile);
  std::string creds_file = AwsFile("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  c = AwsCredentials{};
  if (!creds_file.empty()) {
    c.access_key_id = ReadAwsIniValue(creds_file, name, "aws_access_key_id");
    c.secret_access_key = ReadAwsIniValue(creds_file, name, "aws_secret_access_key");
    c.session_token = ReadAwsIniValue(creds_file, name, "aws_session_token");
  }
  if (c.access_key_id.empty() && c.secret_access_key.empty()) {
    // The AWS CLI also accepts keys in the config file's profile section.
    std::string config_file = AwsFile("AWS_CONFIG_FILE", "config");
    std::string section = name == "default" ? name : "profile " + name;
    if (!config_file.empty()) {
      c.access_key_id = ReadAwsIniValue(config_file, section, "aws_access_key_id");
      c.secret_access_key = ReadAwsIniValue(config_file, section, "aws_secret_access_key");
      c.session_token = ReadAwsIniValue(config_file, section, "aws_session_token");
    }
  }
  if (c.access_key_id.empty() && c.secret_access_key.empty()) {
    return Status(Code::kPermission,
                  "no S3 credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and "
                  "profile '" +
                      name + "' has none in " +
                      (creds_file.empty() ? std::string("~/.aws/credentials") : creds_file));
  }
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return Invalid("profile '" + name + "' has only one of aws_access_key_id and " +
                   "aws_secret_access_key");
  }
  return c;
}

std::string LoadAwsRegion(const std::string& profile) {
  for (const char* var : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
    std::string v = Env(var);
    if (!v.empty()) return v;
  }
  std::string name = ProfileName(profile);
  std::string config_file = AwsFile("AWS_CONFIG_FILE", "config");
  if (!config_file.empty()) {
    std::string v =
        ReadAwsIniValue(config_file, name == "default" ? name : "profile " + name, "region");
    if (!v.empty()) return v;
  }
  return "us-east-1";
}

}  // namespace ckptfs
