/* polyad's stand-in for <stdio.h>: kernels do no I/O; the header parses. */
#ifndef POLYAD_FAKE_STDIO_H
#define POLYAD_FAKE_STDIO_H
#include <stddef.h>
#endif
