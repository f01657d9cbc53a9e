#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/xattr.h"
#include "formats/dcp.h"
#include "formats/describe.h"
#include "formats/json.h"
#include "formats/layout.h"
#include "tools/commands.h"
#include "tools/mount_table.h"

namespace ckptfs {
namespace {

// A computed attribute of the file at `path`; errors carry the daemon's errno.
Result<std::string> Attr(const std::string& path, std::string_view name) {
  return ReadXattr(path, std::string(name));
}

// All tensors, as JSON values, reading the pages when one attribute cannot hold the list.
Result<json::Array> Tensors(const std::string& path) {
  ASSIGN_OR_RETURN(std::string pages, Attr(path, kXattrTensorPages));
  json::Array all;
  const int n = std::atoi(pages.c_str());
  for (int i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(std::string page, Attr(path, std::string(kXattrTensors) + "." + std::to_string(i)));
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

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::FromErrno(errno, "open " + path);
  std::stringstream s;
  s << f.rdbuf();
  if (f.bad()) return Status::FromErrno(errno, "read " + path);
  return s.str();
}

// A DCP data file names its tensors only through the checkpoint's .metadata: with it beside the
// file, the tensors come with their state-dict names and places in the global tensors.
Result<json::Array> DcpTensors(const std::string& path, uint64_t size) {
  const std::filesystem::path p(path);
  ASSIGN_OR_RETURN(std::string meta, ReadFile((p.parent_path() / ".metadata").string()));
  ASSIGN_OR_RETURN(dcp::Metadata md, dcp::ParseMetadata(meta));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  auto read_at = [fd](uint64_t off, size_t len) -> Result<std::string> {
    std::string out(len, '\0');
    size_t got = 0;
    while (got < len) {
      ssize_t n = ::pread(fd, out.data() + got, len - got, static_cast<off_t>(off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::FromErrno(errno, "read");
      if (n == 0) return Corrupt("file shorter than its metadata says");
      got += static_cast<size_t>(n);
    }
    return out;
  };
  auto d = dcp::DescribeDataFile(md, p.filename().string(), size, read_at);
  ::close(fd);
  if (!d.ok()) return d.status();
  size_t next = 0;
  ASSIGN_OR_RETURN(json::Value v, json::Parse(TensorsJson(d->tensors, 0, SIZE_MAX, &next)));
  return v.as_array();
}

// A DCP .metadata: what the checkpoint holds and where, and whether its data files are there.
int InspectDcpMetadata(const std::string& path, bool as_json) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return Fail(bytes.status().ToString());
  auto md = dcp::ParseMetadata(*bytes);
  if (!md.ok()) return Fail(path + ": " + md.status().ToString());
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::vector<std::string> problems;
  for (const std::string& f : md->Files()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(dir / f, ec)) problems.push_back(f + " is missing");
  }
  if (as_json) {
    json::Array tensors;
    for (const dcp::TensorEntry& t : md->tensors) {
      json::Object o;
      o.emplace_back("name", json::Value::String(t.fqn));
      o.emplace_back("dtype", json::Value::String(t.dtype));
      json::Array shape;
      for (int64_t d : t.size) shape.push_back(json::Value::Int(d));
      o.emplace_back("shape", json::Value::MakeArray(std::move(shape)));
      o.emplace_back("chunks", json::Value::Int(static_cast<int64_t>(t.chunks.size())));
      tensors.push_back(json::Value::MakeObject(std::move(o)));
    }
    json::Array missing;
    for (const std::string& p : problems) missing.push_back(json::Value::String(p));
    json::Object o;
    o.emplace_back("file", json::Value::String(path));
    o.emplace_back("format", json::Value::String("dcp-metadata"));
    o.emplace_back("tensors", json::Value::MakeArray(std::move(tensors)));
    o.emplace_back("bytes_items", json::Value::Int(static_cast<int64_t>(md->bytes.size())));
    o.emplace_back("problems", json::Value::MakeArray(std::move(missing)));
    auto text = json::Write(json::Value::MakeObject(std::move(o)));
    if (!text.ok()) return Fail(text.status().ToString());
    std::printf("%s\n", text->c_str());
    return problems.empty() ? 0 : 1;
  }
  std::printf("file     %s\nformat   dcp-metadata%s\n", path.c_str(),
              md->version.empty() ? "" : (" (version " + md->version + ")").c_str());
  std::printf("tensors  %zu (%llu bytes) in %zu files; %zu non-tensor items\n",
              md->tensors.size(), static_cast<unsigned long long>(md->TensorBytes()),
              md->Files().size(), md->bytes.size());
  std::printf("\n%-10s %-20s %7s  %s\n", "dtype", "shape", "chunks", "name");
  for (const dcp::TensorEntry& t : md->tensors) {
    std::string shape = "[";
    for (size_t i = 0; i < t.size.size(); ++i) shape += (i ? "," : "") + std::to_string(t.size[i]);
    std::printf("%-10s %-20s %7zu  %s\n", t.dtype.c_str(), (shape + "]").c_str(), t.chunks.size(),
                t.fqn.c_str());
  }
  for (const std::string& p : problems) std::printf("problem: %s\n", p.c_str());
  return problems.empty() ? 0 : 1;
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
    if (it->path().filename() == ".views") {  // ckptfs's virtual views are not the checkpoint
      it.disable_recursion_pending();
      continue;
    }
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
  const std::string text = layout::Describe(*found) + DescribeTorchDist(path);
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

// Whether `path` lies under a ckptfs mount.
bool OnCkptfsMount(const std::string& path) {
  for (std::filesystem::path p = AbsolutePath(path);; p = p.parent_path()) {
    if (FindMount(p.string())) return true;
    if (p == p.parent_path()) return false;
  }
}

// `inspect ROOT --view SPEC`: the view's files and sizes, or why the daemon refused it; off a
// mount, planned here (tools/convert.cc).
int InspectView(const std::string& root, const std::string& spec) {
  if (!OnCkptfsMount(root)) return InspectViewOffline(root, spec);
  const std::string views = root + "/.views";
  const std::string dir = views + "/" + spec;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    auto why = Attr(views, "user.ckptfs.view_errors");
    if (why.ok()) {
      std::istringstream lines(*why);
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind(spec + ": ", 0) == 0) return Fail("view " + line);
      }
    }
    return Fail(dir + ": " + std::strerror(err));
  }
  std::error_code ec;
  uint64_t files = 0, bytes = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const uint64_t size = it->file_size();
    std::printf("%12llu  %s\n", static_cast<unsigned long long>(size),
                it->path().lexically_relative(dir).c_str());
    ++files;
    bytes += size;
  }
  if (ec) return Fail(dir + ": " + ec.message());
  std::printf("view %s: %llu files, %llu bytes\n", spec.c_str(),
              static_cast<unsigned long long>(files), static_cast<unsigned long long>(bytes));
  return 0;
}

}  // namespace

int Inspect(const std::vector<std::string>& args) {
  bool as_json = false;
  std::string path, view;
  OfflineFrom from;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      as_json = true;
    } else if (a == "--view" && i + 1 < args.size()) {
      view = args[++i];
    } else if (from.Parse(args, &i)) {
    } else if (path.empty()) {
      path = a;
    } else {
      return Fail("inspect takes one file");
    }
  }
  if (path.empty()) return Fail("inspect takes one path: ckptfs inspect [--json] FILE|DIR");
  if (!view.empty() && !from.cache_dir.empty()) return InspectViewOffline(path, view, from);
  if (!from.cache_dir.empty() || !from.backends.empty()) {
    return Fail("--cache-dir and --backend go with --view (and --backend with --cache-dir)");
  }
  if (!view.empty()) return InspectView(path, view);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Fail(path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return InspectDir(path, as_json);
  if (!S_ISREG(st.st_mode)) return Fail(path + ": not a regular file or directory");
  auto format = Attr(path, kXattrFormat);
  if (!format.ok()) {
    return Fail(path + ": not on a ckptfs mount (" + format.status().ToString() + ")");
  }
  auto chunks_text = Attr(path, "user.ckptfs.chunks");
  if (!chunks_text.ok()) return Fail(path + ": " + chunks_text.status().ToString());
  auto chunks = json::Parse(*chunks_text);
  if (!chunks.ok()) return Fail(path + ": " + chunks.status().ToString());
  if (*format == "dcp-metadata") return InspectDcpMetadata(path, as_json);
  // A DCP data file without its .metadata beside it: the archives in it, by number.
  auto tensors = *format == "dcp-data" ? DcpTensors(path, static_cast<uint64_t>(st.st_size))
                                       : Tensors(path);
  if (!tensors.ok() && tensors.status().code() == Code::kNotFound) tensors = Tensors(path);
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
