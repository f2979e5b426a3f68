/* polyad's stand-in for <stdbool.h>. */
#ifndef POLYAD_FAKE_STDBOOL_H
#define POLYAD_FAKE_STDBOOL_H
#define bool int
#define true 1
#define false 0
#endif
