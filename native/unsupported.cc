// Non-Linux platforms have no pidfds and no /proc: the addon builds as an
// empty module whose load tells the TypeScript layer to use the js backend.
#include <napi.h>

namespace {
Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("unsupported", Napi::String::New(env, "custody's native layer needs Linux"));
  return exports;
}
}  // namespace

NODE_API_MODULE(custody, Init)
