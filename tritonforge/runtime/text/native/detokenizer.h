// Byte-exact detokenization in C++: the twin of `TokenBytes` (tritonforge/runtime/text/detokenization.py) and
// of `Postprocessor` (postprocess.py), held to the same bytes by tests/unit/runtime/text/test_native_detokenizer.py. Plain
// functions with no Triton in them: postprocessing_backend.cc serves them, detokenizer_capi.cc tests them.
//
// The byte table is the JSON file the build saves beside the tokenizer (`tritonforge_token_bytes.json`):
//   {"digest": <sha256 hex>, "family": "byte_level" | "sentencepiece" | "other",
//    "bos_token_id": <int> | null, "table": [<hex of the bytes of token 0>, <token 1>, ...]}
// Decoding is what Python does: each id's bytes concatenated (ids outside the table, such as -1 padding, add
// nothing; special tokens are empty entries, so they are always skipped, as in Python, which has no other mode);
// a SentencePiece row that starts with BOS is a whole text and loses its first space; then every maximal
// invalid UTF-8 subpart becomes one U+FFFD, as CPython's `bytes.decode("utf-8", "replace")`.
//
// The digest is not recomputed here. Python's is sha256 over detokenization.py's own source followed by the
// tokenizer's files, so that a change of its rules also retires old tables; that source is not part of a model
// repository, so no C++ reader can recompute it. The C++ reader checks the table's integrity instead (strict
// JSON, a digest of 64 hex digits present, a known family, an integer or null BOS, every entry hex) and refuses
// anything else, where Python would rebuild the table from the tokenizer; it also refuses a few values the
// build never writes that Python would accept (an unknown family, a BOS that is not an integer). What this
// leaves unchecked: tokenizer files replaced by hand after the build (build the repository again), and rules
// that change on one side only (the differential test's business).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "contract.h"
#include "json.h"

namespace tritonforge {
namespace text {

inline constexpr char kTableFile[] = "tritonforge_token_bytes.json";  // detokenization.TABLE_FILE
using contract::kPostSequenceLength;  // postprocessing's inputs (facts/contract.py, through contract.h)
using contract::kPostTokensBatch;

// A byte table that cannot be used; the message names the file and what is wrong with it.
class TableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How many bytes of `data` from `at` form one well-formed UTF-8 character (0: they do not), and, when they do
// not, how many bytes make its maximal invalid subpart (the bytes one U+FFFD replaces).
inline size_t Utf8Char(const unsigned char* data, size_t size, size_t at, size_t* invalid) {
  const unsigned char lead = data[at];
  if (lead < 0x80) return 1;
  size_t length;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range: narrower after some leads (Table 3-7)
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;  // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    *invalid = 1;  // a continuation byte, C0, C1 or F5..FF cannot start a character
    return 0;
  }
  size_t valid = 1;
  if (at + 1 < size && data[at + 1] >= low && data[at + 1] <= high) {
    valid = 2;
    while (valid < length && at + valid < size && data[at + valid] >= 0x80 && data[at + valid] <= 0xBF) ++valid;
  }
  if (valid == length) return length;
  *invalid = valid;
  return 0;
}

// Appends `size` bytes of `data` with every maximal invalid subpart replaced by U+FFFD: the bytes of
// `data.decode("utf-8", errors="replace").encode("utf-8")` in CPython.
inline void AppendUtf8Replacing(const char* data, size_t size, std::string* out) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  size_t at = 0, run = 0;  // [run, at): valid bytes not yet appended
  while (at < size) {
    if (bytes[at] < 0x80) {
      ++at;
      continue;
    }
    size_t invalid = 0;
    const size_t length = Utf8Char(bytes, size, at, &invalid);
    if (length != 0) {
      at += length;
      continue;
    }
    out->append(data + run, at - run);
    out->append("\xEF\xBF\xBD");
    at += invalid;
    run = at;
  }
  out->append(data + run, size - run);
}

enum class Family { kByteLevel, kSentencePiece, kOther };

// The bytes of every token id of one tokenizer, read from the table the build saved. Immutable once made,
// so one table serves every thread of every instance of a model without a lock.
class TokenBytes {
 public:
  // The table saved in `tokenizer_dir`; throws TableError when it is missing or damaged.
  static TokenBytes Load(const std::string& tokenizer_dir) {
    const std::string path = tokenizer_dir + "/" + kTableFile;
    std::ifstream file(path, std::ios::binary);
    if (!file) {
      throw TableError(path + ": cannot be read (" + std::strerror(errno) + "); the C++ postprocessing reads the " +
                       "byte table the build saves beside the tokenizer and cannot make one: build the " +
                       "repository again (tritonforge build)");
    }
    std::ostringstream text;
    text << file.rdbuf();
    return FromJson(text.str(), path);
  }

  // The table from the text of its file; `origin` names the file in errors.
  static TokenBytes FromJson(std::string_view text, const std::string& origin) {
    auto refuse = [&origin](const std::string& what) {
      return TableError(origin + ": " + what + "; build the repository again (tritonforge build) to write it");
    };
    std::string invalid_at;
    if (!ValidUtf8(text, &invalid_at)) throw refuse("not UTF-8 text (" + invalid_at + ")");
    json::Value record;
    try {
      record = json::Parse(text);
    } catch (const json::ParseError& error) {
      throw refuse(std::string("not JSON: ") + error.what());
    }
    if (record.kind != json::Value::Kind::kObject) throw refuse("not a JSON object");

    const json::Value* digest = record.Find("digest");
    if (digest == nullptr || digest->kind != json::Value::Kind::kString || digest->text.size() != 64 ||
        digest->text.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw refuse("no \"digest\" of 64 hex digits (the sha256 the build records)");

    TokenBytes table;
    const json::Value* family = record.Find("family");
    if (family == nullptr || family->kind != json::Value::Kind::kString) throw refuse("no \"family\" string");
    if (family->text == "byte_level") table.family_ = Family::kByteLevel;
    else if (family->text == "sentencepiece") table.family_ = Family::kSentencePiece;
    else if (family->text == "other") table.family_ = Family::kOther;
    else throw refuse("unknown \"family\" \"" + family->text + "\" (byte_level, sentencepiece or other)");

    const json::Value* bos = record.Find("bos_token_id");
    if (bos == nullptr) throw refuse("no \"bos_token_id\"");
    if (bos->kind == json::Value::Kind::kNumber) {
      table.bos_token_id_ = ParseInteger(bos->text);
      if (!table.bos_token_id_) throw refuse("\"bos_token_id\" " + bos->text + " is not a 64-bit integer");
    } else if (bos->kind != json::Value::Kind::kNull) {
      throw refuse("\"bos_token_id\" is neither an integer nor null");
    }

    const json::Value* entries = record.Find("table");
    if (entries == nullptr || entries->kind != json::Value::Kind::kArray) throw refuse("no \"table\" list");
    table.offsets_.reserve(entries->items.size() + 1);
    table.offsets_.push_back(0);
    for (size_t i = 0; i < entries->items.size(); ++i) {
      const json::Value& entry = entries->items[i];
      if (entry.kind != json::Value::Kind::kString || !AppendFromHex(entry.text, &table.bytes_))
        throw refuse("\"table\"[" + std::to_string(i) + "] is not a hex string");
      table.offsets_.push_back(table.bytes_.size());
    }
    return table;
  }

  size_t size() const { return offsets_.size() - 1; }
  Family family() const { return family_; }
  const std::optional<int64_t>& bos_token_id() const { return bos_token_id_; }

  // `TokenBytes.decode`: the bytes of a run of tokens; ids outside the table (padding) add nothing.
  void AppendDecode(const int32_t* ids, size_t count, std::string* out) const {
    const size_t entries = size();
    for (size_t i = 0; i < count; ++i) {
      if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= entries) continue;
      const size_t begin = offsets_[ids[i]], end = offsets_[ids[i] + 1];
      out->append(bytes_, begin, end - begin);
    }
  }

  // `TokenBytes.decode_sequence`: a SentencePiece row that starts with BOS is a whole text, which the
  // tokenizer's decode gives without the space it put before the first word.
  void AppendDecodeSequence(const int32_t* ids, size_t count, std::string* out) const {
    const size_t start = out->size();
    AppendDecode(ids, count, out);
    if (StripsFirstSpace(ids, count) && out->size() > start && (*out)[start] == ' ') out->erase(start, 1);
  }

  // `TokenBytes.decode_text(...).encode("utf-8")`: what the postprocessing model answers for one row.
  void AppendDecodeText(const int32_t* ids, size_t count, std::string* out) const {
    std::string raw;
    AppendDecode(ids, count, &raw);
    const size_t skip = StripsFirstSpace(ids, count) && !raw.empty() && raw[0] == ' ' ? 1 : 0;
    AppendUtf8Replacing(raw.data() + skip, raw.size() - skip, out);
  }

 private:
  TokenBytes() = default;

  bool StripsFirstSpace(const int32_t* ids, size_t count) const {
    return family_ == Family::kSentencePiece && count > 0 && bos_token_id_ && ids[0] == *bos_token_id_;
  }

  static std::optional<int64_t> ParseInteger(const std::string& literal) {
    if (literal.find_first_of(".eE") != std::string::npos) return std::nullopt;  // JSON's float forms
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(literal.c_str(), &end, 10);
    if (errno == ERANGE || end != literal.c_str() + literal.size()) return std::nullopt;
    return static_cast<int64_t>(value);
  }

  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // As Python's `bytes.fromhex`: pairs of hex digits, ASCII whitespace allowed between pairs.
  static bool AppendFromHex(const std::string& hex, std::string* out) {
    for (size_t i = 0; i < hex.size();) {
      if (hex[i] == ' ' || (hex[i] >= '\t' && hex[i] <= '\r')) {  // Python's ASCII whitespace
        ++i;
        continue;
      }
      if (i + 1 >= hex.size()) return false;
      const int high = HexDigit(hex[i]), low = HexDigit(hex[i + 1]);
      if (high < 0 || low < 0) return false;
      out->push_back(static_cast<char>(high * 16 + low));
      i += 2;
    }
    return true;
  }

  static bool ValidUtf8(std::string_view text, std::string* where) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t at = 0; at < text.size();) {
      size_t invalid = 0;
      const size_t length = Utf8Char(bytes, text.size(), at, &invalid);
      if (length == 0) {
        *where = "byte " + std::to_string(at);
        return false;
      }
      at += length;
    }
    return true;
  }

  Family family_ = Family::kOther;
  std::optional<int64_t> bos_token_id_;
  std::string bytes_;  // every token's bytes, back to back
  std::vector<size_t> offsets_;  // token i is bytes_[offsets_[i], offsets_[i + 1])
};

// A request the postprocessing model answers with INVALID_ARG: "<field>: <problem>", as `RequestError`.
struct RequestProblem {
  std::string field;
  std::string problem;
  std::string message() const { return field + ": " + problem; }
};

// Appends one element of a Triton BYTES tensor: its length as 4 bytes little-endian, then the bytes.
inline void AppendBytesElement(std::string_view element, std::string* out) {
  const auto length = static_cast<uint32_t>(element.size());
  const char prefix[4] = {static_cast<char>(length & 0xFF), static_cast<char>((length >> 8) & 0xFF),
                          static_cast<char>((length >> 16) & 0xFF), static_cast<char>((length >> 24) & 0xFF)};
  out->append(prefix, 4);
  out->append(element);
}

// `Postprocessor.__call__`: TOKENS_BATCH [B, beams, T] (or [B, T], one beam) and the `lengths_count` values of
// SEQUENCE_LENGTH ([B, beams]) → OUTPUT, B * beams elements, flat, appended to `serialized` as a BYTES tensor's
// buffer. Returns the problem of a request it refuses (nothing is appended then). Each row is decoded alone:
// a character whose bytes straddle two responses shows as U+FFFD in each, as in Python.
inline std::optional<RequestProblem> DecodeBatch(const TokenBytes& table, const int32_t* tokens,
                                                 const std::vector<int64_t>& tokens_shape, const int32_t* lengths,
                                                 size_t lengths_count, std::string* serialized, size_t* elements) {
  std::string shape_text = "[";
  for (size_t i = 0; i < tokens_shape.size(); ++i) shape_text += (i ? ", " : "") + std::to_string(tokens_shape[i]);
  shape_text += "]";
  if (tokens_shape.size() != 2 && tokens_shape.size() != 3)
    return RequestProblem{kPostTokensBatch, "must be [batch, beams, tokens], got shape " + shape_text};
  for (int64_t dim : tokens_shape)
    if (dim < 0) return RequestProblem{kPostTokensBatch, "has a negative dimension in shape " + shape_text};
  const int64_t rows = tokens_shape[0];
  const int64_t beams = tokens_shape.size() == 3 ? tokens_shape[1] : 1;
  const int64_t width = tokens_shape.back();
  // Python refuses these with an internal error (numpy's reshape); they are the client's, so named here.
  if (rows == 0) return RequestProblem{kPostTokensBatch, "has no rows (shape " + shape_text + ")"};
  if (lengths_count % static_cast<size_t>(rows) != 0)
    return RequestProblem{kPostSequenceLength, "has " + std::to_string(lengths_count) + " values for " +
                                               std::to_string(rows) + " rows"};
  const int64_t length_beams = static_cast<int64_t>(lengths_count) / rows;
  if (length_beams != beams)
    return RequestProblem{kPostSequenceLength, "has " + std::to_string(length_beams) + " beams, " + kPostTokensBatch +
                                               " has " + std::to_string(beams)};
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t beam = 0; beam < beams; ++beam) {
      const int64_t index = row * beams + beam;
      const int64_t length = lengths[index];
      const size_t take = static_cast<size_t>(length <= 0 ? 0 : (length < width ? length : width));
      std::string text;
      table.AppendDecodeText(tokens + index * width, take, &text);
      AppendBytesElement(text, serialized);
    }
  }
  *elements = static_cast<size_t>(rows * beams);
  return std::nullopt;
}

}  // namespace text
}  // namespace tritonforge
