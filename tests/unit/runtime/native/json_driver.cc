// Reads a document on stdin with json.h and prints "ok <value>" in a canonical form, or "error <message>", for
// tests/unit/runtime/test_native_json.py. The form: n, t, f; #<number as written>; s<hex of the UTF-8>;
// [<item>,...]; {<hex of the key>:<value>,...} in file order.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "json.h"

namespace json = tritonforge::json;

std::string Hex(const std::string& text) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string Canonical(const json::Value& value) {
  switch (value.kind) {
    case json::Value::Kind::kNull:
      return "n";
    case json::Value::Kind::kBool:
      return value.boolean ? "t" : "f";
    case json::Value::Kind::kNumber:
      return "#" + value.text;
    case json::Value::Kind::kString:
      return "s" + Hex(value.text);
    case json::Value::Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < value.items.size(); ++i) out += (i ? "," : "") + Canonical(value.items[i]);
      return out + "]";
    }
    case json::Value::Kind::kObject: {
      std::string out = "{";
      for (size_t i = 0; i < value.items.size(); ++i)
        out += (i ? "," : "") + Hex(value.keys[i]) + ":" + Canonical(value.items[i]);
      return out + "}";
    }
  }
  return "?";
}

int main() {
  const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  try {
    std::printf("ok %s\n", Canonical(json::Parse(text)).c_str());
  } catch (const json::ParseError& error) {
    std::printf("error %s\n", error.what());
  }
  return 0;
}
