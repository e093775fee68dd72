// Strict JSON (RFC 8259) for tritonforge's C++ backends: the parser the byte table, a model's config and the
// replay engine's token file are read with. Objects keep their members in file order. Header-only, no Triton.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tritonforge {

namespace json {

class ParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A parsed JSON value. Objects keep their members in file order; `Find` gives the last of a repeated key, as
// Python's json does.
struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // a string's UTF-8, or a number's literal as written
  std::vector<Value> items;  // an array's items, or an object's values
  std::vector<std::string> keys;  // an object's keys, one per item

  const Value* Find(std::string_view key) const {
    for (size_t i = keys.size(); i-- > 0;)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
};

// RFC 8259 JSON, as strict as Python's `json.loads` or stricter: no NaN or Infinity, no lone surrogate escapes.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value ParseDocument() {
    Value value = ParseValue(0);
    SkipSpace();
    if (at_ != text_.size()) Fail("extra data after the JSON value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 256;  // a guard against a stack overflow on a hostile file

  [[noreturn]] void Fail(const std::string& what) const {
    throw ParseError(what + " at byte " + std::to_string(at_));
  }

  void SkipSpace() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' ||
                                  text_[at_] == '\r'))
      ++at_;
  }

  bool Consume(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  // After an object's or array's item: true at its `close`, false at a ',' (another item follows).
  bool EndOfList(char close) {
    SkipSpace();
    if (Consume(",")) return false;
    if (Consume(std::string_view(&close, 1))) return true;
    Fail(std::string("expected ',' or '") + close + "'");
  }

  Value ParseValue(int depth) {
    if (depth > kMaxDepth) Fail("nesting deeper than " + std::to_string(kMaxDepth));
    SkipSpace();
    if (at_ >= text_.size()) Fail("unexpected end of the document");
    Value value;
    const char c = text_[at_];
    if (c == '{') {
      value.kind = Value::Kind::kObject;
      ++at_;
      SkipSpace();
      if (Consume("}")) return value;
      for (;;) {
        SkipSpace();
        if (at_ >= text_.size() || text_[at_] != '"') Fail("expected a string key");
        value.keys.push_back(ParseString());
        SkipSpace();
        if (!Consume(":")) Fail("expected ':'");
        value.items.push_back(ParseValue(depth + 1));
        if (EndOfList('}')) return value;
      }
    }
    if (c == '[') {
      value.kind = Value::Kind::kArray;
      ++at_;
      SkipSpace();
      if (Consume("]")) return value;
      for (;;) {
        value.items.push_back(ParseValue(depth + 1));
        if (EndOfList(']')) return value;
      }
    }
    if (c == '"') {
      value.kind = Value::Kind::kString;
      value.text = ParseString();
      return value;
    }
    if (Consume("true") || Consume("false")) {
      value.kind = Value::Kind::kBool;
      value.boolean = c == 't';
      return value;
    }
    if (Consume("null")) return value;
    if (c == '-' || (c >= '0' && c <= '9')) {
      value.kind = Value::Kind::kNumber;
      value.text = ParseNumber();
      return value;
    }
    Fail("unexpected character");
  }

  static bool Digit(char c) { return c >= '0' && c <= '9'; }

  std::string ParseNumber() {
    const size_t start = at_;
    if (text_[at_] == '-') ++at_;
    if (at_ < text_.size() && text_[at_] == '0') {
      ++at_;
    } else if (at_ < text_.size() && Digit(text_[at_])) {
      while (at_ < text_.size() && Digit(text_[at_])) ++at_;
    } else {
      Fail("a number needs digits");
    }
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      if (at_ >= text_.size() || !Digit(text_[at_])) Fail("a fraction needs digits");
      while (at_ < text_.size() && Digit(text_[at_])) ++at_;
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (at_ >= text_.size() || !Digit(text_[at_])) Fail("an exponent needs digits");
      while (at_ < text_.size() && Digit(text_[at_])) ++at_;
    }
    return std::string(text_.substr(start, at_ - start));
  }

  unsigned Hex4() {
    if (text_.size() - at_ < 4) Fail("a \\u escape needs 4 hex digits");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[at_++];
      code <<= 4;
      if (c >= '0' && c <= '9') code |= c - '0';
      else if (c >= 'a' && c <= 'f') code |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') code |= c - 'A' + 10;
      else Fail("a \\u escape needs 4 hex digits");
    }
    return code;
  }

  static void AppendUtf8(unsigned code, std::string* out) {
    if (code < 0x80) {
      out->push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code >> 6)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  std::string ParseString() {
    ++at_;  // the opening quote
    std::string out;
    for (;;) {
      if (at_ >= text_.size()) Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(text_[at_++]);
      if (c == '"') return out;
      if (c < 0x20) Fail("a control character inside a string");
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        continue;
      }
      if (at_ >= text_.size()) Fail("unterminated escape");
      const char escape = text_[at_++];
      switch (escape) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          unsigned code = Hex4();
          if (code >= 0xDC00 && code <= 0xDFFF) Fail("a lone low surrogate escape");
          if (code >= 0xD800 && code <= 0xDBFF) {
            if (!Consume("\\u")) Fail("a lone high surrogate escape");
            const unsigned low = Hex4();
            if (low < 0xDC00 || low > 0xDFFF) Fail("a lone high surrogate escape");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(code, &out);
          break;
        }
        default:
          Fail("an unknown escape");
      }
    }
  }

  std::string_view text_;
  size_t at_ = 0;
};

inline Value Parse(std::string_view text) { return Parser(text).ParseDocument(); }

}  // namespace json

}  // namespace tritonforge
