/* Loads the built plugin from plain C exactly as NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, then
 * dlsym of each table version) and checks the tables and the C query API are reachable. A
 * missing symbol or a C++-only dependency would fail here before any C++ test could see it. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "plugin/optireduce_net.h"

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "libnccl-net-optireduce.so";
  static const char* const kTables[] = {"ncclNetPlugin_v12", "ncclNetPlugin_v11",
                                        "ncclNetPlugin_v10", "ncclNetPlugin_v9",
                                        "ncclNetPlugin_v8"};
  int round;
  /* Twice: a second load after dlclose must work as well as the first. */
  for (round = 0; round < 2; ++round) {
    size_t i;
    int (*version)(void);
    int (*get_stats)(uint64_t, struct optireduceNetStats*);
    struct optireduceNetStats st;
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
      fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
      return 1;
    }
    for (i = 0; i < sizeof(kTables) / sizeof(kTables[0]); ++i) {
      /* Every table starts with its name (const char*). */
      const char* const* table = (const char* const*)dlsym(lib, kTables[i]);
      if (table == NULL || table[0] == NULL || strcmp(table[0], "OptiReduce") != 0) {
        fprintf(stderr, "%s: missing or misnamed\n", kTables[i]);
        return 1;
      }
    }
    *(void**)&version = dlsym(lib, "optireduceNetStatsVersion");
    *(void**)&get_stats = dlsym(lib, "optireduceNetGetStats");
    if (version == NULL || get_stats == NULL || version() != OPTIREDUCE_NET_STATS_VERSION) {
      fprintf(stderr, "query API missing or of another version\n");
      return 1;
    }
    /* No communicator exists: unknown id (1), and NULL is refused (-1). */
    if (get_stats(42, &st) != 1 || st.version != OPTIREDUCE_NET_STATS_VERSION ||
        get_stats(42, NULL) != -1) {
      fprintf(stderr, "optireduceNetGetStats on an empty process misbehaves\n");
      return 1;
    }
    if (dlclose(lib) != 0) {
      fprintf(stderr, "dlclose: %s\n", dlerror());
      return 1;
    }
  }
  printf("dlopen from C: OK\n");
  return 0;
}
