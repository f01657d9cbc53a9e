#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/json.h"
#include "formats/layout.h"
#include "tools/commands.h"

namespace ckptfs {
namespace {

// A computed attribute of the file at `path`; errors carry the daemon's errno.
Result<std::string> Attr(const std::string& path, const std::string& name) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    ssize_t n = ::getxattr(path.c_str(), name.c_str(), nullptr, 0);
    if (n < 0) return Status::FromErrno(errno, name);
    std::string v(static_cast<size_t>(n), '\0');
    ssize_t got = ::getxattr(path.c_str(), name.c_str(), v.data(), v.size());
    if (got < 0 && errno == ERANGE) continue;  // the file changed between the calls
    if (got < 0) return Status::FromErrno(errno, name);
    v.resize(static_cast<size_t>(got));
    return v;
  }
  return Status(Code::kBusy, name + " keeps changing");
}

// All tensors, as JSON values, reading the pages when one attribute cannot hold the list.
Result<json::Array> Tensors(const std::string& path) {
  ASSIGN_OR_RETURN(std::string pages, Attr(path, "user.ckptfs.tensors.pages"));
  json::Array all;
  const int n = std::atoi(pages.c_str());
  for (int i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(std::string page, Attr(path, "user.ckptfs.tensors." + std::to_string(i)));
    ASSIGN_OR_RETURN(json::Value v, json::Parse(page));
    if (!v.is_array()) return Corrupt("tensor page " + std::to_string(i) + " is not a list");
    for (const json::Value& t : v.as_array()) all.push_back(t);
  }
  return all;
}

std::string Shape(const json::Value* shape) {
  std::string s = "[";
  if (shape && shape->is_array()) {
    for (const json::Value& d : shape->as_array()) {
      if (s.size() > 1) s += ",";
      s += d.is_int() ? std::to_string(d.as_int()) : "?";
    }
  }
  return s + "]";
}

int64_t IntOf(const json::Value& obj, const char* key) {
  const json::Value* v = obj.Find(key);
  return v && v->is_int() ? v->as_int() : 0;
}

// A directory: which checkpoint layout it holds (Megatron-LM, DeepSpeed, DCP, safetensors shards),
// from its names and its small tracker files. Works on any directory, mounted or not.
int InspectDir(const std::string& path, bool as_json) {
  namespace fs = std::filesystem;
  std::vector<layout::Entry> listing;
  std::error_code ec;
  constexpr size_t kMaxEntries = 1'000'000;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (listing.size() == kMaxEntries) return Fail(path + ": more than a million entries");
    layout::Entry e;
    e.path = fs::relative(it->path(), path, ec).generic_string();
    e.is_dir = it->is_directory(ec);
    if (!e.is_dir) e.size = it->is_regular_file(ec) ? it->file_size(ec) : 0;
    if (!e.is_dir && layout::WantsContent(e.path) && e.size < (1 << 20)) {
      std::ifstream f(it->path(), std::ios::binary);
      std::stringstream s;
      s << f.rdbuf();
      e.content = s.str();
    }
    listing.push_back(std::move(e));
  }
  if (ec) return Fail(path + ": " + ec.message());
  auto found = layout::Detect(listing);
  if (!found.ok()) return Fail(path + ": " + found.status().ToString());
  const std::string text = layout::Describe(*found);
  if (as_json) {
    json::Object o;
    o.emplace_back("directory", json::Value::String(path));
    o.emplace_back("layout", json::Value::String(std::string(layout::KindName(found->kind))));
    o.emplace_back("description", json::Value::String(text));
    auto out = json::Write(json::Value::MakeObject(std::move(o)));
    if (!out.ok()) return Fail(out.status().ToString());
    std::printf("%s\n", out->c_str());
    return 0;
  }
  std::printf("directory %s\nlayout    %s\n\n%s", path.c_str(),
              std::string(layout::KindName(found->kind)).c_str(), text.c_str());
  return 0;
}

}  // namespace

int Inspect(const std::vector<std::string>& args) {
  bool as_json = false;
  std::string path;
  for (const std::string& a : args) {
    if (a == "--json") {
      as_json = true;
    } else if (path.empty()) {
      path = a;
    } else {
      return Fail("inspect takes one file");
    }
  }
  if (path.empty()) return Fail("inspect takes one path: ckptfs inspect [--json] FILE|DIR");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Fail(path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return InspectDir(path, as_json);
  if (!S_ISREG(st.st_mode)) return Fail(path + ": not a regular file or directory");
  auto format = Attr(path, "user.ckptfs.format");
  if (!format.ok()) {
    return Fail(path + ": not on a ckptfs mount (" + format.status().ToString() + ")");
  }
  auto chunks_text = Attr(path, "user.ckptfs.chunks");
  if (!chunks_text.ok()) return Fail(path + ": " + chunks_text.status().ToString());
  auto chunks = json::Parse(*chunks_text);
  if (!chunks.ok()) return Fail(path + ": " + chunks.status().ToString());
  auto tensors = Tensors(path);
  if (!tensors.ok()) return Fail(path + ": " + tensors.status().ToString());

  if (as_json) {
    json::Object o;
    o.emplace_back("file", json::Value::String(path));
    o.emplace_back("format", json::Value::String(*format));
    o.emplace_back("size", json::Value::Int(st.st_size));
    o.emplace_back("chunks", *chunks);
    o.emplace_back("tensors", json::Value::MakeArray(*tensors));
    auto text = json::Write(json::Value::MakeObject(std::move(o)));
    if (!text.ok()) return Fail(text.status().ToString());
    std::printf("%s\n", text->c_str());
    return 0;
  }
  uint64_t tensor_bytes = 0;
  for (const json::Value& t : *tensors) tensor_bytes += IntOf(t, "length");
  const int64_t bytes = IntOf(*chunks, "bytes"), shared = IntOf(*chunks, "shared_bytes");
  std::printf("file     %s\n", path.c_str());
  std::printf("format   %s\n", format->c_str());
  std::printf("size     %lld\n", static_cast<long long>(st.st_size));
  std::printf("tensors  %zu (%llu bytes)\n", tensors->size(),
              static_cast<unsigned long long>(tensor_bytes));
  std::printf(
      "chunks   %lld (%lld bytes); shared with other files or places: %lld chunks, "
      "%lld bytes (%.1f%%)\n",
      static_cast<long long>(IntOf(*chunks, "chunks")), static_cast<long long>(bytes),
      static_cast<long long>(IntOf(*chunks, "shared_chunks")), static_cast<long long>(shared),
      bytes ? 100.0 * shared / bytes : 0.0);
  if (!tensors->empty()) {
    std::printf("\n%-10s %-20s %14s %14s  %s\n", "dtype", "shape", "offset", "bytes", "name");
  }
  for (const json::Value& t : *tensors) {
    const json::Value* name = t.Find("name");
    const json::Value* dtype = t.Find("dtype");
    std::printf("%-10s %-20s %14lld %14lld  %s\n",
                dtype && dtype->is_string() ? dtype->as_string().c_str() : "?",
                Shape(t.Find("shape")).c_str(), static_cast<long long>(IntOf(t, "offset")),
                static_cast<long long>(IntOf(t, "length")),
                name && name->is_string() ? name->as_string().c_str() : "?");
  }
  return 0;
}

}  // namespace ckptfs
