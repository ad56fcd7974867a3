/* What the small channel (_small.c) computes: the element kinds it takes, named from a
 * buffer's format, and the element-wise reductions of two buffers of one kind.
 *
 * float32/float64: SUM, PRODUCT, MIN, MAX (MIN and MAX propagate NaN, as NumPy and torch
 * do); integers of 1-8 bytes: all seven reductions, sums and products wrapping
 * (computed unsigned), MIN and MAX comparing signed or unsigned as the type is;
 * complex64/128: SUM, as pairs of reals. K_BYTES (bool, float16) is copied, never
 * reduced. Reductions use torch's numbering (hpccomm.types.RedOpType).
 */
#ifndef HPCCOMM_SHM_REDUCE_H
#define HPCCOMM_SHM_REDUCE_H

#include <Python.h>
#include <stdint.h>

/* Element kinds. K_BYTES: copied only. */
enum { K_BYTES, K_F32, K_F64, K_C64, K_C128, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16,
       K_U32, K_U64, N_KINDS };
static const char *KIND_NAMES[N_KINDS] = {"bytes", "float32", "float64", "complex64",
                                          "complex128", "int8", "int16", "int32", "int64",
                                          "uint8", "uint16", "uint32", "uint64"};

/* torch's reduction numbering (hpccomm.types.RedOpType) */
enum { R_SUM = 0, R_AVG = 1, R_PRODUCT = 2, R_MIN = 3, R_MAX = 4, R_BAND = 5, R_BOR = 6,
       R_BXOR = 7, N_REDOPS = 8 };
static const char *REDOP_NAMES[N_REDOPS] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND",
                                            "BOR", "BXOR"};

/* The kind of a buffer's format (struct syntax, as NumPy exports it), -1 for a type the
 * channel does not take (objects, strings, records...: the general path decides). */
static int kind_of(const char *format, Py_ssize_t itemsize)
{
    if (format == NULL)
        return K_U8;
    if (format[0] == '@' || format[0] == '=' || format[0] == '<')
        format++; /* native order (every platform hpccomm runs on is little-endian) */
    if (format[0] == 'Z' && format[1] && !format[2])
        return format[1] == 'f' ? K_C64 : format[1] == 'd' ? K_C128 : -1;
    if (!format[0] || format[1])
        return -1;
    switch (format[0]) {
    case 'f': return K_F32;
    case 'd': return K_F64;
    case 'b': case 'h': case 'i': case 'l': case 'q':
        return itemsize == 1 ? K_I8 : itemsize == 2 ? K_I16 : itemsize == 4 ? K_I32 :
               itemsize == 8 ? K_I64 : -1;
    case 'B': case 'H': case 'I': case 'L': case 'Q':
        return itemsize == 1 ? K_U8 : itemsize == 2 ? K_U16 : itemsize == 4 ? K_U32 :
               itemsize == 8 ? K_U64 : -1;
    case '?': case 'e': return K_BYTES; /* bool, float16: copied, not reduced here */
    default: return -1;
    }
}

static int reducible(int kind, int redop)
{
    switch (kind) {
    case K_F32: case K_F64:
        return redop == R_SUM || redop == R_PRODUCT || redop == R_MIN || redop == R_MAX;
    case K_C64: case K_C128:
        return redop == R_SUM;
    case K_BYTES:
        return 0;
    default:
        return redop != R_AVG && redop < N_REDOPS;
    }
}

#define NAN_MIN(a, b) (((a) != (a) || (a) <= (b)) ? (a) : (b))
#define NAN_MAX(a, b) (((a) != (a) || (a) >= (b)) ? (a) : (b))
#define LESSER(a, b) ((a) <= (b) ? (a) : (b))
#define GREATER(a, b) ((a) >= (b) ? (a) : (b))

/* out[i] = a[i] op b[i] for n elements of type T (out may be a or b) */
#define FLOAT_LOOP(T)                                                                   \
    do {                                                                                \
        const T *x = (const T *)a, *y = (const T *)b;                                   \
        T *z = (T *)out;                                                                \
        switch (redop) {                                                                \
        case R_SUM: for (i = 0; i < n; i++) z[i] = x[i] + y[i]; break;                  \
        case R_PRODUCT: for (i = 0; i < n; i++) z[i] = x[i] * y[i]; break;              \
        case R_MIN: for (i = 0; i < n; i++) z[i] = NAN_MIN(x[i], y[i]); break;          \
        case R_MAX: for (i = 0; i < n; i++) z[i] = NAN_MAX(x[i], y[i]); break;          \
        }                                                                               \
    } while (0)

/* integers: sums and products wrap, computed unsigned (U); MIN and MAX compare as S */
#define INT_LOOP(S, U)                                                                  \
    do {                                                                                \
        const U *x = (const U *)a, *y = (const U *)b;                                   \
        U *z = (U *)out;                                                                \
        const S *sx = (const S *)a, *sy = (const S *)b;                                 \
        S *sz = (S *)out;                                                               \
        switch (redop) {                                                                \
        case R_SUM: for (i = 0; i < n; i++) z[i] = (U)(x[i] + y[i]); break;             \
        case R_PRODUCT: for (i = 0; i < n; i++) z[i] = (U)(x[i] * y[i]); break;         \
        case R_MIN: for (i = 0; i < n; i++) sz[i] = LESSER(sx[i], sy[i]); break;        \
        case R_MAX: for (i = 0; i < n; i++) sz[i] = GREATER(sx[i], sy[i]); break;       \
        case R_BAND: for (i = 0; i < n; i++) z[i] = x[i] & y[i]; break;                 \
        case R_BOR: for (i = 0; i < n; i++) z[i] = x[i] | y[i]; break;                  \
        case R_BXOR: for (i = 0; i < n; i++) z[i] = x[i] ^ y[i]; break;                 \
        }                                                                               \
    } while (0)

static void combine(int kind, int redop, char *out, const char *a, const char *b,
                    Py_ssize_t nbytes)
{
    Py_ssize_t i, n;
    switch (kind) {
    case K_F32: n = nbytes / 4; FLOAT_LOOP(float); break;
    case K_F64: n = nbytes / 8; FLOAT_LOOP(double); break;
    case K_C64: n = nbytes / 4; FLOAT_LOOP(float); break;   /* SUM only: real pairs */
    case K_C128: n = nbytes / 8; FLOAT_LOOP(double); break;
    case K_I8: n = nbytes; INT_LOOP(int8_t, uint8_t); break;
    case K_U8: n = nbytes; INT_LOOP(uint8_t, uint8_t); break;
    case K_I16: n = nbytes / 2; INT_LOOP(int16_t, uint16_t); break;
    case K_U16: n = nbytes / 2; INT_LOOP(uint16_t, uint16_t); break;
    case K_I32: n = nbytes / 4; INT_LOOP(int32_t, uint32_t); break;
    case K_U32: n = nbytes / 4; INT_LOOP(uint32_t, uint32_t); break;
    case K_I64: n = nbytes / 8; INT_LOOP(int64_t, uint64_t); break;
    case K_U64: n = nbytes / 8; INT_LOOP(uint64_t, uint64_t); break;
    }
}

#endif
