/* polyad's stand-in for <stdlib.h> (only what kernels may use). */
#ifndef POLYAD_FAKE_STDLIB_H
#define POLYAD_FAKE_STDLIB_H
#include <stddef.h>
int abs(int); long labs(long);
#endif
