/* Minimal MessagePack encoders writing through a byte cursor. The caller guarantees space
 * (tl_reserve() hands out a region at least as large as the record's worst case). */
#ifndef TL_MSGPACK_H
#define TL_MSGPACK_H
#include <stdint.h>
#include <string.h>

static inline void mp_be16(uint8_t **c, uint16_t v) { (*c)[0] = (uint8_t)(v >> 8); (*c)[1] = (uint8_t)v; *c += 2; }
static inline void mp_be32(uint8_t **c, uint32_t v) {
    (*c)[0] = (uint8_t)(v >> 24); (*c)[1] = (uint8_t)(v >> 16); (*c)[2] = (uint8_t)(v >> 8); (*c)[3] = (uint8_t)v; *c += 4;
}
static inline void mp_be64(uint8_t **c, uint64_t v) { mp_be32(c, (uint32_t)(v >> 32)); mp_be32(c, (uint32_t)v); }

/* worst case 9 bytes */
static inline void mp_uint(uint8_t **c, uint64_t v) {
    if (v < 128) { *(*c)++ = (uint8_t)v; }
    else if (v <= 0xff) { *(*c)++ = 0xcc; *(*c)++ = (uint8_t)v; }
    else if (v <= 0xffff) { *(*c)++ = 0xcd; mp_be16(c, (uint16_t)v); }
    else if (v <= 0xffffffffu) { *(*c)++ = 0xce; mp_be32(c, (uint32_t)v); }
    else { *(*c)++ = 0xcf; mp_be64(c, v); }
}
static inline void mp_int(uint8_t **c, int64_t v) {
    if (v >= 0) { mp_uint(c, (uint64_t)v); return; }
    if (v >= -32) { *(*c)++ = (uint8_t)(0xe0 | (v + 32)); }
    else if (v >= -128) { *(*c)++ = 0xd0; *(*c)++ = (uint8_t)(int8_t)v; }
    else if (v >= -32768) { *(*c)++ = 0xd1; mp_be16(c, (uint16_t)(int16_t)v); }
    else if (v >= -2147483648LL) { *(*c)++ = 0xd2; mp_be32(c, (uint32_t)(int32_t)v); }
    else { *(*c)++ = 0xd3; mp_be64(c, (uint64_t)v); }
}
static inline void mp_f64(uint8_t **c, double d) { uint64_t u; memcpy(&u, &d, 8); *(*c)++ = 0xcb; mp_be64(c, u); }
static inline void mp_nil(uint8_t **c) { *(*c)++ = 0xc0; }
/* worst case 5 + len bytes */
static inline void mp_str(uint8_t **c, const char *s, size_t len) {
    if (len < 32) { *(*c)++ = (uint8_t)(0xa0 | len); }
    else if (len <= 0xff) { *(*c)++ = 0xd9; *(*c)++ = (uint8_t)len; }
    else if (len <= 0xffff) { *(*c)++ = 0xda; mp_be16(c, (uint16_t)len); }
    else { *(*c)++ = 0xdb; mp_be32(c, (uint32_t)len); }
    memcpy(*c, s, len); *c += len;
}
static inline void mp_cstr(uint8_t **c, const char *s) { mp_str(c, s, strlen(s)); }
static inline void mp_map(uint8_t **c, uint32_t n) {
    if (n < 16) *(*c)++ = (uint8_t)(0x80 | n); else { *(*c)++ = 0xde; mp_be16(c, (uint16_t)n); }
}
static inline void mp_arr(uint8_t **c, uint32_t n) {
    if (n < 16) *(*c)++ = (uint8_t)(0x90 | n);
    else if (n <= 0xffff) { *(*c)++ = 0xdc; mp_be16(c, (uint16_t)n); }
    else { *(*c)++ = 0xdd; mp_be32(c, n); }
}
#endif
