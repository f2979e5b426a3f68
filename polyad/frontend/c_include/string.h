/* polyad's stand-in for <string.h>: no string functions in kernels. */
#ifndef POLYAD_FAKE_STRING_H
#define POLYAD_FAKE_STRING_H
#include <stddef.h>
#endif
