/* polyad's stand-in for <stdint.h>. */
#ifndef POLYAD_FAKE_STDINT_H
#define POLYAD_FAKE_STDINT_H
typedef int int32_t;
typedef long int64_t;
#endif
