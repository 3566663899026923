/* An OpenBLAS older than the CPU (LD_PRELOAD): it names its kernels Prescott (SSE3) unless OPENBLAS_CORETYPE chose
   them, as Debian's 0.3.21 does on an Emerald Rapids Xeon. Only the name is changed; the kernels stay the ones the
   library loaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

char* openblas_get_corename(void) {
  static char* (*own)(void);
  if (!own) own = (char* (*)(void))dlsym(RTLD_NEXT, "openblas_get_corename");
  return getenv("OPENBLAS_CORETYPE") ? own() : "Prescott";
}
