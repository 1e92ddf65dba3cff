{
  "targets": [
    {
      "target_name": "custody",
      "sources": [
        "native/addon.cc",
        "native/pidfd.cc",
        "native/procfs.cc",
        "native/identity.cc",
        "native/scan.cc",
        "native/statedir.cc",
        "native/bytes.cc",
        "native/spawn.cc",
        "native/child.cc",
        "native/notify.cc"
      ],
      "dependencies": [
        "<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"
      ],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_DEPRECATED",
        "_GNU_SOURCE"
      ],
      "cflags": [
        "-fvisibility=hidden",
        "-fstack-protector-strong",
        "-Wall",
        "-Wextra",
        "-Werror"
      ],
      "cflags_cc": [
        "-std=c++17",
        "-fvisibility=hidden",
        "-fstack-protector-strong",
        "-Wall",
        "-Wextra",
        "-Werror"
      ],
      "conditions": [
        ["OS != 'linux'", {
          "sources!": [
            "native/addon.cc",
            "native/pidfd.cc",
            "native/procfs.cc",
            "native/identity.cc",
            "native/scan.cc",
            "native/statedir.cc",
            "native/bytes.cc",
            "native/spawn.cc",
            "native/child.cc",
            "native/notify.cc"
          ],
          "sources": ["native/unsupported.cc"]
        }]
      ]
    }
  ]
}
