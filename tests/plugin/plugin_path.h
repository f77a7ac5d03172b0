// The plugin a test loads: OPTIREDUCE_PLUGIN_PATH when set (one suite run against another
// build of the plugin, a sanitized one say), else the one this build made, which each test
// target's meson.build names in PLUGIN_PATH. One definition for every test that dlopens it.
#pragma once

#include <cstdlib>

#ifndef PLUGIN_PATH
#error "PLUGIN_PATH is unset: add -DPLUGIN_PATH=<the built plugin> to this target's cpp_args"
#endif

namespace optireduce::testing {

inline const char* plugin_path() {
  const char* p = std::getenv("OPTIREDUCE_PLUGIN_PATH");
  return p != nullptr ? p : PLUGIN_PATH;
}

}  // namespace optireduce::testing
