// A C API over detokenizer.h, for the differential tests (ctypes) that hold the C++ detokenizer to the bytes
// of its Python twin. Not used by the server. Returned buffers are malloc'd: free them with tf_free. Errors
// return nonzero (or NULL) and leave their message for tf_last_error, per thread.

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "detokenizer.h"

namespace {

thread_local std::string last_error;

using tritonforge::text::TokenBytes;

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

}  // namespace

extern "C" {

enum {
  TF_DECODE_SEQUENCE = 1,  // decode_sequence: a SentencePiece row that starts with BOS loses its first space
  TF_DECODE_TEXT = 2,  // decode_text: invalid UTF-8 becomes U+FFFD (implies TF_DECODE_SEQUENCE, as in Python)
};

const char* tf_last_error(void) { return last_error.c_str(); }

void tf_free(void* buffer) { std::free(buffer); }

// The table saved in `tokenizer_dir`, or NULL (tf_last_error says why).
TokenBytes* tf_token_bytes_open(const char* tokenizer_dir) {
  try {
    return new TokenBytes(TokenBytes::Load(tokenizer_dir));
  } catch (const std::exception& error) {
    last_error = error.what();
    return nullptr;
  }
}

void tf_token_bytes_close(TokenBytes* table) { delete table; }

size_t tf_token_bytes_size(const TokenBytes* table) { return table->size(); }

// decode (flags 0), decode_sequence (TF_DECODE_SEQUENCE) or decode_text (TF_DECODE_TEXT) of `count` ids.
int tf_token_bytes_decode(const TokenBytes* table, const int32_t* ids, size_t count, int flags, char** out,
                          size_t* out_size) {
  try {
    std::string bytes;
    if (flags & TF_DECODE_TEXT) table->AppendDecodeText(ids, count, &bytes);
    else if (flags & TF_DECODE_SEQUENCE) table->AppendDecodeSequence(ids, count, &bytes);
    else table->AppendDecode(ids, count, &bytes);
    return Hand(bytes, out, out_size);
  } catch (const std::exception& error) {
    last_error = error.what();
    return -1;
  }
}

// The postprocessing model's answer to one request: OUTPUT as a BYTES tensor's buffer of `*elements` items.
// Returns 1 for a request the model refuses (tf_last_error is its INVALID_ARG message), -1 for a failure.
int tf_postprocess(const TokenBytes* table, const int32_t* tokens, const int64_t* shape, size_t rank,
                   const int32_t* lengths, size_t lengths_count, char** out, size_t* out_size, size_t* elements) {
  try {
    std::string serialized;
    const auto problem = tritonforge::text::DecodeBatch(*table, tokens, std::vector<int64_t>(shape, shape + rank),
                                                        lengths, lengths_count, &serialized, elements);
    if (problem) {
      last_error = problem->message();
      return 1;
    }
    return Hand(serialized, out, out_size);
  } catch (const std::exception& error) {
    last_error = error.what();
    return -1;
  }
}

// `data.decode("utf-8", errors="replace").encode("utf-8")`.
int tf_utf8_replace(const char* data, size_t size, char** out, size_t* out_size) {
  try {
    std::string bytes;
    tritonforge::text::AppendUtf8Replacing(data, size, &bytes);
    return Hand(bytes, out, out_size);
  } catch (const std::exception& error) {
    last_error = error.what();
    return -1;
  }
}

}  // extern "C"
