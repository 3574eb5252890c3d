#ifndef TL_NVTX_H
#define TL_NVTX_H
#include <stdint.h>
/* External-correlation hooks installed by the CUPTI side: push returns 0 on success. */
typedef int (*tl_ext_push_fn)(uint64_t id);
typedef void (*tl_ext_pop_fn)(void);
extern tl_ext_push_fn tl_ext_push;
extern tl_ext_pop_fn tl_ext_pop;
#endif
