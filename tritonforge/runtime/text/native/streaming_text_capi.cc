// A C API over streaming_text.h, for the differential tests (ctypes) that hold the C++ streamed text to the bytes
// of its Python twins. Not used by the server. Returned buffers are malloc'd: free them with tf_free. Errors
// return nonzero (or NULL) and leave their message for tf_last_error, per thread.

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "streaming_text.h"

namespace {

thread_local std::string last_error;

namespace text = tritonforge::text;

// Copies `bytes` into a malloc'd buffer for the caller (at least one byte, so that NULL means failure).
int Hand(const std::string& bytes, char** out, size_t* out_size) {
  *out = static_cast<char*>(std::malloc(bytes.size() + 1));
  if (*out == nullptr) {
    last_error = "out of memory";
    return -1;
  }
  std::memcpy(*out, bytes.data(), bytes.size());
  *out_size = bytes.size();
  return 0;
}

// A detokenizer with the table it reads: the table must outlive it.
struct Detokenizer {
  explicit Detokenizer(text::TokenBytes loaded) : table(std::move(loaded)), stream(table) {}
  text::TokenBytes table;
  text::IncrementalDetokenizer stream;
};

}  // namespace

extern "C" {

const char* tf_last_error(void) { return last_error.c_str(); }

void tf_free(void* buffer) { std::free(buffer); }

// `codecs.getincrementaldecoder("utf-8")(errors="replace")`.
text::Utf8StreamDecoder* tf_utf8_decoder_new(void) { return new text::Utf8StreamDecoder(); }

void tf_utf8_decoder_delete(text::Utf8StreamDecoder* decoder) { delete decoder; }

// `decoder.decode(data, final)`, as UTF-8 bytes.
int tf_utf8_decoder_decode(text::Utf8StreamDecoder* decoder, const char* data, size_t size, int final, char** out,
                           size_t* out_size) {
  try {
    std::string bytes;
    decoder->Decode(data, size, final != 0, &bytes);
    return Hand(bytes, out, out_size);
  } catch (const std::exception& error) {
    last_error = error.what();
    return -1;
  }
}

// An `IncrementalDetokenizer` over the table saved in `tokenizer_dir`, or NULL (tf_last_error says why).
Detokenizer* tf_detokenizer_open(const char* tokenizer_dir) {
  try {
    return new Detokenizer(text::TokenBytes::Load(tokenizer_dir));
  } catch (const std::exception& error) {
    last_error = error.what();
    return nullptr;
  }
}

void tf_detokenizer_close(Detokenizer* detokenizer) { delete detokenizer; }

// `push(ids)` (final 0) or `flush()` (final 1, ids ignored).
int tf_detokenizer_push(Detokenizer* detokenizer, const int32_t* ids, size_t count, int final, char** out,
                        size_t* out_size) {
  try {
    std::string bytes;
    if (final) detokenizer->stream.Flush(&bytes);
    else detokenizer->stream.Push(ids, count, &bytes);
    return Hand(bytes, out, out_size);
  } catch (const std::exception& error) {
    last_error = error.what();
    return -1;
  }
}

// A `StopPhraseFilter` over `count` phrases, each `sizes[i]` bytes of UTF-8.
text::StopPhraseFilter* tf_stop_filter_new(const char* const* phrases, const size_t* sizes, size_t count) {
  try {
    std::vector<std::string> list;
    for (size_t i = 0; i < count; ++i) list.emplace_back(phrases[i], sizes[i]);
    return new text::StopPhraseFilter(std::move(list));
  } catch (const std::exception& error) {
    last_error = error.what();
    return nullptr;
  }
}

void tf_stop_filter_delete(text::StopPhraseFilter* filter) { delete filter; }

// `push(text)` (final 0) or `flush()` (final 1, text ignored).
int tf_stop_filter_push(text::StopPhraseFilter* filter, const char* data, size_t size, int final, char** out,
                        size_t* out_size) {
  try {
    return Hand(final ? filter->Flush() : filter->Push(std::string_view(data, size)), out, out_size);
  } catch (const std::exception& error) {
    last_error = error.what();
    return -1;
  }
}

int tf_stop_filter_stopped(const text::StopPhraseFilter* filter) { return filter->stopped() ? 1 : 0; }

}  // extern "C"
