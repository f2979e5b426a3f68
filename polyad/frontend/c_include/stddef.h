/* polyad's stand-in for <stddef.h>. */
#ifndef POLYAD_FAKE_STDDEF_H
#define POLYAD_FAKE_STDDEF_H
typedef long size_t;
typedef long ptrdiff_t;
#define NULL ((void *)0)
#endif
