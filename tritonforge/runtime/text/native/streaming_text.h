// Streamed text in C++: the twins of `IncrementalDetokenizer` (tritonforge/runtime/text/detokenization.py) and
// `StopPhraseFilter` (stop_phrases.py), held to the same bytes by
// tests/unit/runtime/text/test_native_streaming_text.py. Plain classes with no Triton in them: the C++ BLS
// (runtime/bls/native/bls_backend.cc) runs one of each per row, streaming_text_capi.cc tests them.
//
// Text here is UTF-8 bytes where Python has str. The rules carry over exactly: every chunk the detokenizer
// gives is whole characters, so a stop phrase (itself whole characters) can only match, or be held back as
// a partial match, at character boundaries, and the byte offsets order matches as the character offsets do.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detokenizer.h"

namespace tritonforge {
namespace text {

// CPython's incremental UTF-8 decoder with errors="replace" (`codecs.getincrementaldecoder("utf-8")`), on
// bytes out: every maximal invalid subpart becomes one U+FFFD as soon as it is known to be invalid; the
// bytes at the end that may still become a character wait for the next call, or become one U+FFFD at the
// final one.
class Utf8StreamDecoder {
 public:
  void Decode(const char* data, size_t size, bool final, std::string* out) {
    std::string joined;
    if (!pending_.empty()) {  // at most 3 bytes: the start of one character
      joined.reserve(pending_.size() + size);
      joined.append(pending_).append(data, size);
      pending_.clear();
      data = joined.data();
      size = joined.size();
    }
    size_t keep = size;
    if (!final) {
      // The last character's start: a lead byte 1 to 3 bytes from the end whose bytes so far are valid.
      for (size_t back = 1; back <= 3 && back <= size; ++back) {
        const auto lead = static_cast<unsigned char>(data[size - back]);
        if (lead < 0x80) break;  // ASCII: complete
        if (lead < 0xC0) continue;  // a continuation byte: its lead is further back
        size_t invalid = 0;
        const size_t length =
            Utf8Char(reinterpret_cast<const unsigned char*>(data), size, size - back, &invalid);
        // Incomplete but valid so far (a lead that may start a character, every byte after it accepted).
        if (length == 0 && lead >= 0xC2 && lead <= 0xF4 && invalid == back) keep = size - back;
        // CPython also waits on the first two bytes of a surrogate (ED A0..BF), for error handlers that
        // accept surrogates; with "replace" they become the same two U+FFFD a call later.
        const auto second = back == 2 ? static_cast<unsigned char>(data[size - 1]) : 0;
        if (lead == 0xED && second >= 0xA0 && second <= 0xBF) keep = size - back;
        break;
      }
    }
    AppendUtf8Replacing(data, keep, out);
    pending_.assign(data + keep, size - keep);
  }

  void Reset() { pending_.clear(); }

 private:
  std::string pending_;
};

// `IncrementalDetokenizer`: token ids in, text out that is always whole UTF-8 characters. Per request; not
// thread-safe (its owner says which thread runs it).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const TokenBytes& table) : table_(&table) {}

  // `push`: the text that the new ids complete, appended to `out`.
  void Push(const int32_t* ids, size_t count, std::string* out) {
    bytes_.clear();
    table_->AppendDecode(ids, count, &bytes_);
    utf8_.Decode(bytes_.data(), bytes_.size(), false, out);
  }

  // `flush`: the end of the stream; an incomplete character left over becomes U+FFFD.
  void Flush(std::string* out) { utf8_.Decode("", 0, true, out); }

 private:
  const TokenBytes* table_;
  Utf8StreamDecoder utf8_;
  std::string bytes_;  // reused: one allocation per stream, not per token
};

// `StopPhraseFilter`: text that could still become the start of a stop phrase is held back until decided;
// the phrase and everything after it are never emitted. Per request; not thread-safe.
class StopPhraseFilter {
 public:
  explicit StopPhraseFilter(std::vector<std::string> phrases) {
    for (auto& phrase : phrases)
      if (!phrase.empty()) phrases_.push_back(std::move(phrase));
  }

  // `push`: feed new text, get what can be emitted now ("" for ever after a stop).
  std::string Push(std::string_view text) {
    if (stopped_) return "";
    std::string buffer = std::move(pending_);
    pending_.clear();
    buffer.append(text);
    // The phrase that completes first wins, as if the text had arrived one character at a time; of two that
    // end together, the one that starts first.
    size_t best_end = std::string::npos, best_start = std::string::npos;
    for (const std::string& phrase : phrases_) {
      const size_t start = buffer.find(phrase);
      if (start == std::string::npos) continue;
      const size_t end = start + phrase.size();
      if (end < best_end || (end == best_end && start < best_start)) {
        best_end = end;
        best_start = start;
      }
    }
    if (best_start != std::string::npos) {
      stopped_ = true;
      buffer.resize(best_start);
      return buffer;
    }
    const size_t held = HeldSuffix(buffer);
    pending_.assign(buffer, buffer.size() - held, held);
    buffer.resize(buffer.size() - held);
    return buffer;
  }

  // `flush`: the stream ended without a stop; what was held back.
  std::string Flush() {
    std::string out = stopped_ ? std::string() : std::move(pending_);
    pending_.clear();
    return out;
  }

  bool stopped() const { return stopped_; }

 private:
  // The length of the longest end of `buffer` that is a proper prefix of some phrase.
  size_t HeldSuffix(const std::string& buffer) const {
    size_t longest = 0;
    for (const std::string& phrase : phrases_) {
      const size_t most = std::min(phrase.size() - 1, buffer.size());
      for (size_t size = most; size > longest; --size) {
        if (buffer.compare(buffer.size() - size, size, phrase, 0, size) == 0) {
          longest = size;
          break;
        }
      }
    }
    return longest;
  }

  std::vector<std::string> phrases_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace text
}  // namespace tritonforge
