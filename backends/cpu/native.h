/* native.h - custom operator kernels in shared libraries, named by an op's
 * `kernel` and `kernel_backward` entries, loaded with dlopen, called through libffi.
 *
 * Calling convention (docs/language.md, "Native kernels"):
 * - Tensors are f32, packed row-major: the buffers of docs/program.md.
 * - sizes: the extent of each idim of the operator's iteration space
 *   (include/weft/plan.h, opspace) in idim order, for the part being computed; a
 *   `b..` group gives one size per dimension it covers.
 * - Forward:  void fn(float *out, const float *in_0, ..., const float *in_{n-1},
 *                     int64_t size_0, ..., int64_t size_{s-1});
 *   Backward: void fn(float *din_0, ..., float *din_{n-1}, const float *dout,
 *                     const float *in_0, ..., const float *in_{n-1},
 *                     int64_t size_0, ...);
 *   out and each non-NULL din_i are overwritten; a NULL din_i is a gradient
 *   that is not wanted. Accumulating (partial sums, micro-batches) is the
 *   caller's work.
 * Loaded kernels live until the process ends (a library is never closed). Every
 * function here is safe to call from several threads at once. */
#ifndef WEFT_NATIVE_H
#define WEFT_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* The most tensor inputs and sizes one call passes. */
enum { NATIVE_MAX_INPUTS = 64, NATIVE_MAX_SIZES = 64 };

typedef struct native_kernel native_kernel;

/* Loads spec "LIB:SYMBOL" (split at its last ':'): dlopen(LIB), relative to
 * dir unless absolute (dir NULL or "": the current directory), then
 * dlsym(SYMBOL). On failure returns NULL and writes "LIB:SYMBOL: reason" to
 * err (errlen bytes at most, NUL included). The same spec and dir give the
 * same object every time; failures are not remembered. */
native_kernel *native_load(const char *spec, const char *dir, char *err, size_t errlen);

/* The spec the kernel was loaded from, and the library path given to dlopen. */
const char *native_spec(const native_kernel *k);
const char *native_path(const native_kernel *k);

/* fn(out, in[0..nin), sizes[0..nsizes)); nin <= NATIVE_MAX_INPUTS,
 * nsizes <= NATIVE_MAX_SIZES (beyond: an abort, a bug of the caller). */
void native_forward(native_kernel *k, float *out, int nin, const float *const *in,
                    int nsizes, const int64_t *sizes);

/* fn(din[0..nin), dout, in[0..nin), sizes[0..nsizes)). */
void native_backward(native_kernel *k, float *const *din, int nin, const float *dout,
                     const float *const *in, int nsizes, const int64_t *sizes);

#endif
