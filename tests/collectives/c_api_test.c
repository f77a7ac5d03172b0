/* optireduce.h compiles as C11 and its API works from C: a one-rank host communicator through
 * the file store, an allreduce, statistics and error strings. Exit code 0 = pass. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/optireduce.h"

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: %s failed [%s]\n", __FILE__, __LINE__, #cond,      \
              optiGetLastError());                                               \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main(void) {
  char dir[] = "/tmp/optireduce-c-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  optiOptions_t opts;
  CHECK(optiOptionsDefault(&opts) == optiSuccess);
  CHECK(opts.hadamardBlock >= 2);
  optiComm_t comm = NULL;
  CHECK(optiHostCommInitFile(&comm, dir, 0, 1, &opts) == optiSuccess);
  float x[3] = {1.0f, -2.0f, 3.5f};
  float y[3] = {0, 0, 0};
  CHECK(optiAllReduce(x, y, 3, optiFloat32, optiAvg, comm, NULL) == optiSuccess);
  CHECK(y[0] == 1.0f && y[1] == -2.0f && y[2] == 3.5f);
  optiStats_t last, total;
  CHECK(optiGetStats(comm, &last, &total) == optiSuccess);
  CHECK(total.calls == 1);
  CHECK(optiAllReduce(x, y, 3, (optiDataType_t)42, optiSum, comm, NULL) == optiInvalidArgument);
  CHECK(strlen(optiGetLastError()) > 0);
  CHECK(strcmp(optiGetErrorString(optiInvalidArgument), "invalid argument") == 0);
  CHECK(optiCommDestroy(comm) == optiSuccess);
  printf("C API ok\n");
  return 0;
}
