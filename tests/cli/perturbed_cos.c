/* A host whose math library rounds otherwise, for one rank (LD_PRELOAD): cos one part in a million off, which moves
   the transformer's initial weights (drawn with Box-Muller from --seed) by some float ulps on that rank alone. */
#define _GNU_SOURCE
#include <dlfcn.h>

double cos(double x) {
  static double (*libm_cos)(double);
  if (!libm_cos) libm_cos = (double (*)(double))dlsym(RTLD_NEXT, "cos");
  return libm_cos(x) * (1 + 1e-6);
}
