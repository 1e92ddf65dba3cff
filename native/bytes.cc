// The byte codec: bytes from the kernel (argv, paths) to JavaScript strings
// and back, losslessly (common.h says how), and decodeBytes, its test hook.
#include "common.h"

#include <string>

namespace custody {

namespace {

// Length of the valid UTF-8 sequence at p (RFC 3629: shortest form only,
// no UTF-16 surrogates, nothing above U+10FFFF), with its code point; 0 when
// the bytes there are not one. The same rule as Node's buffer.isUtf8, so the
// js backend decodes every byte string exactly as this addon does.
size_t Utf8Sequence(const unsigned char* p, size_t n, uint32_t* cp) {
  unsigned char b = p[0];
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  size_t len;
  uint32_t min;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2, min = 0x80, *cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3, min = 0x800, *cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4, min = 0x10000, *cp = b & 0x07;
  } else {
    return 0;
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (p[i] & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return len;
}

// decodeBytes(buffer) -> string: the addon's decoding, so tests can check
// that the js backend decodes every byte string identically.
Napi::Value DecodeBytesJs(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsBuffer()) throw Napi::TypeError::New(info.Env(), "bytes must be a Buffer");
  auto b = info[0].As<Napi::Buffer<char>>();
  return DecodeBytes(info.Env(), b.Data(), b.Length());
}

}  // namespace

Napi::String DecodeBytes(const Napi::Env& env, const char* data, size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t cp;
  size_t i = 0;
  while (i < len) {
    size_t n = Utf8Sequence(p + i, len - i, &cp);
    if (n == 0) break;
    i += n;
  }
  // Valid UTF-8, the common case: V8 decodes it directly.
  if (i == len) return Napi::String::New(env, data, len);
  std::u16string out;
  out.reserve(len);
  for (i = 0; i < len;) {
    size_t n = Utf8Sequence(p + i, len - i, &cp);
    if (n == 0) {
      // One undecodable byte (always >= 0x80: ASCII is always valid).
      out.push_back(static_cast<char16_t>(0xDC00 + p[i]));
      i++;
      continue;
    }
    if (cp >= 0x10000) {
      out.push_back(static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(cp));
    }
    i += n;
  }
  return Napi::String::New(env, out.data(), out.size());
}

std::string EncodeBytes(const Napi::Value& v, const char* name) {
  Napi::Env env = v.Env();
  if (v.IsBuffer()) {
    auto b = v.As<Napi::Buffer<char>>();
    return std::string(b.Data(), b.Length());
  }
  if (!v.IsString()) throw Napi::TypeError::New(env, std::string(name) + " must hold strings or Buffers");
  // Short strings (argv words, paths) are copied into this frame with one
  // call; only a longer one pays for the length query and a heap copy. A
  // copy that fills the buffer may have been cut, so it is taken again whole.
  char16_t local[256];
  size_t len = 0;
  napi_status status = napi_get_value_string_utf16(env, v, local, sizeof local / sizeof local[0], &len);
  if (status != napi_ok) throw Napi::Error::New(env);
  std::u16string whole;
  const char16_t* u = local;
  if (len + 1 >= sizeof local / sizeof local[0]) {
    whole = v.As<Napi::String>().Utf16Value();
    u = whole.data();
    len = whole.size();
  }
  std::string out;
  out.reserve(len);
  for (size_t i = 0; i < len; i++) {
    uint32_t c = u[i];
    if (c >= 0xD800 && c <= 0xDBFF && i + 1 < len && u[i + 1] >= 0xDC00 && u[i + 1] <= 0xDFFF) {
      c = 0x10000 + ((c - 0xD800) << 10) + (u[++i] - 0xDC00);
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      // An escaped byte, back to itself.
      out.push_back(static_cast<char>(c - 0xDC00));
      continue;
    } else if (c >= 0xD800 && c <= 0xDFFF) {
      throw Napi::RangeError::New(env, std::string(name) + " holds a lone surrogate that stands for no byte");
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

void InitBytes(Napi::Env env, Napi::Object exports) {
  exports.Set("decodeBytes", Napi::Function::New(env, DecodeBytesJs, "decodeBytes"));
}

}  // namespace custody
