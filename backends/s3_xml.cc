#include "backends/s3_xml.h"

#include <cstdint>

#include "common/utf8.h"

namespace ckptfs {
namespace {

constexpr int kMaxDepth = 64;

bool IsNameChar(char c) {
  return !(c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '>' || c == '/' || c == '=' ||
           c == '<' || c == '"' || c == '\'');
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

class Parser {
 public:
  explicit Parser(std::string_view doc) : s_(doc) {}

  Result<XmlElement> Document() {
    RETURN_IF_ERROR(SkipMisc());
    if (pos_ >= s_.size() || s_[pos_] != '<') return Error("no root element");
    XmlElement root;
    RETURN_IF_ERROR(Element(&root, 0));
    RETURN_IF_ERROR(SkipMisc());
    if (pos_ != s_.size()) return Error("content after the root element");
    return root;
  }

 private:
  Status Error(const std::string& what) const {
    return Corrupt("malformed XML from the object store at byte " + std::to_string(pos_) + ": " +
                   what);
  }

  bool StartsWith(std::string_view p) const { return s_.substr(pos_, p.size()) == p; }

  // Skips up to and past `end`; false when the document ends first.
  bool SkipPast(std::string_view end) {
    size_t e = s_.find(end, pos_);
    if (e == std::string_view::npos) return false;
    pos_ = e + end.size();
    return true;
  }

  // Whitespace, comments and processing instructions (the prolog) outside the root element.
  Status SkipMisc() {
    while (pos_ < s_.size()) {
      if (IsSpace(s_[pos_])) {
        ++pos_;
      } else if (StartsWith("<?")) {
        if (!SkipPast("?>")) return Error("unterminated processing instruction");
      } else if (StartsWith("<!--")) {
        if (!SkipPast("-->")) return Error("unterminated comment");
      } else if (StartsWith("<!")) {
        return Error("DOCTYPE declarations are not accepted");
      } else {
        break;
      }
    }
    return Status::Ok();
  }

  Status Name(std::string* name) {
    size_t start = pos_;
    while (pos_ < s_.size() && IsNameChar(s_[pos_])) ++pos_;
    if (pos_ == start) return Error("expected a name");
    std::string_view n = s_.substr(start, pos_ - start);
    size_t colon = n.rfind(':');
    *name = std::string(colon == std::string_view::npos ? n : n.substr(colon + 1));
    return Status::Ok();
  }

  // Decodes the entity at pos_ ('&') into out.
  Status Entity(std::string* out) {
    size_t semi = s_.find(';', pos_);
    if (semi == std::string_view::npos || semi - pos_ > 12) return Error("unterminated entity");
    std::string_view ent = s_.substr(pos_ + 1, semi - pos_ - 1);
    if (ent == "amp") {
      out->push_back('&');
    } else if (ent == "lt") {
      out->push_back('<');
    } else if (ent == "gt") {
      out->push_back('>');
    } else if (ent == "quot") {
      out->push_back('"');
    } else if (ent == "apos") {
      out->push_back('\'');
    } else if (ent.size() >= 2 && ent[0] == '#') {
      bool hex = ent[1] == 'x';
      std::string_view digits = ent.substr(hex ? 2 : 1);
      if (digits.empty()) return Error("empty character reference");
      uint32_t cp = 0;
      for (char c : digits) {
        int d = (c >= '0' && c <= '9')          ? c - '0'
                : (hex && c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (hex && c >= 'A' && c <= 'F') ? c - 'A' + 10
                                                : -1;
        if (d < 0) return Error("bad character reference");
        cp = cp * (hex ? 16 : 10) + static_cast<uint32_t>(d);
        if (cp > 0x10FFFF) return Error("character reference out of range");
      }
      if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF)) return Error("invalid character reference");
      AppendUtf8(cp, out);
    } else {
      return Error("unknown entity &" + std::string(ent) + ";");
    }
    pos_ = semi + 1;
    return Status::Ok();
  }

  // Parses from '<' of a start tag through its matching end tag.
  Status Element(XmlElement* el, int depth) {
    if (depth >= kMaxDepth) return Error("elements nested too deep");
    ++pos_;  // '<'
    RETURN_IF_ERROR(Name(&el->name));
    // Attributes: skipped, but their quoted values may hold '>' or '/'.
    while (true) {
      while (pos_ < s_.size() && IsSpace(s_[pos_])) ++pos_;
      if (pos_ >= s_.size()) return Error("unterminated start tag");
      char c = s_[pos_];
      if (c == '/') {
        if (!StartsWith("/>")) return Error("stray '/' in a start tag");
        pos_ += 2;
        return Status::Ok();
      }
      if (c == '>') {
        ++pos_;
        break;
      }
      std::string attr;
      RETURN_IF_ERROR(Name(&attr));
      while (pos_ < s_.size() && IsSpace(s_[pos_])) ++pos_;
      if (pos_ >= s_.size() || s_[pos_] != '=') return Error("attribute without a value");
      ++pos_;
      while (pos_ < s_.size() && IsSpace(s_[pos_])) ++pos_;
      if (pos_ >= s_.size() || (s_[pos_] != '"' && s_[pos_] != '\'')) {
        return Error("unquoted attribute value");
      }
      size_t end = s_.find(s_[pos_], pos_ + 1);
      if (end == std::string_view::npos) return Error("unterminated attribute value");
      pos_ = end + 1;
    }
    // Content: text, entities, CDATA, comments, child elements, then the end tag.
    while (true) {
      if (pos_ >= s_.size()) return Error("element <" + el->name + "> is not closed");
      char c = s_[pos_];
      if (c == '&') {
        RETURN_IF_ERROR(Entity(&el->text));
      } else if (c != '<') {
        size_t next = s_.find_first_of("<&", pos_);
        if (next == std::string_view::npos) next = s_.size();
        el->text.append(s_.substr(pos_, next - pos_));
        pos_ = next;
      } else if (StartsWith("</")) {
        pos_ += 2;
        std::string name;
        RETURN_IF_ERROR(Name(&name));
        while (pos_ < s_.size() && IsSpace(s_[pos_])) ++pos_;
        if (name != el->name) return Error("</" + name + "> closes <" + el->name + ">");
        if (pos_ >= s_.size() || s_[pos_] != '>') return Error("unterminated end tag");
        ++pos_;
        return Status::Ok();
      } else if (StartsWith("<![CDATA[")) {
        size_t start = pos_ + 9;
        if (!SkipPast("]]>")) return Error("unterminated CDATA section");
        el->text.append(s_.substr(start, pos_ - 3 - start));
      } else if (StartsWith("<!--")) {
        if (!SkipPast("-->")) return Error("unterminated comment");
      } else if (StartsWith("<?")) {
        if (!SkipPast("?>")) return Error("unterminated processing instruction");
      } else if (StartsWith("<!")) {
        return Error("declaration inside an element");
      } else {
        el->children.emplace_back();
        RETURN_IF_ERROR(Element(&el->children.back(), depth + 1));
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

const XmlElement* XmlElement::Child(std::string_view n) const {
  for (const XmlElement& c : children) {
    if (c.name == n) return &c;
  }
  return nullptr;
}

std::string XmlElement::ChildText(std::string_view n) const {
  const XmlElement* c = Child(n);
  return c ? c->text : "";
}

Result<XmlElement> ParseXml(std::string_view doc) { return Parser(doc).Document(); }

std::string XmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace ckptfs
