/* safetensors.h - reading and writing safetensors files: parameters loaded by
 * name, inputs, and checkpoints of parameters and optimizer state.
 *
 * The subset, the checks made on open, the conversions and the atomic-write
 * protocol are described in docs/design/checkpoints.md. In short:
 * - A file is an 8-byte little-endian header length N, N bytes of JSON
 *   (tensor name -> dtype, shape, data_offsets; an optional "__metadata__"
 *   object of strings), then the data area: little-endian, row-major.
 * - st_open checks the whole header before returning, so that every tensor
 *   it hands out lies inside the data area and is exactly as long as its
 *   shape and dtype say. The file is mapped read-only; an st_file stays valid
 *   when the file is replaced by st_write (which renames a new file over it).
 * - Errors are returned as "PATH: reason" (or "PATH: tensor 'NAME': reason")
 *   in a caller's buffer, never printed. Out of memory calls weft_oom().
 * - An st_file is read-only after st_open: several threads may read tensors
 *   from one at once. A writer is used by one thread.
 *
 * Test hook: when the environment variable WEFT_TEST_SAVE_PAUSE holds a
 * number of milliseconds, st_write sleeps that long after writing half of
 * the data bytes to its temporary file (before fsync and rename), so that a
 * test can kill the writer in the middle of a save. */
#ifndef WEFT_SAFETENSORS_H
#define WEFT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The dtypes read and written; others (I16, U32, F8_*, ...) are rejected on
 * open as unsupported. */
typedef enum {
  ST_F32, ST_F16, ST_BF16, ST_F64, ST_I32, ST_I64, ST_U8, ST_I8, ST_BOOL,
  ST_DTYPE_COUNT
} st_dtype;

enum { ST_MAX_DIMS = 8 };

/* One tensor of an open file. */
typedef struct st_tensor {
  const char *name;          /* UTF-8, NUL-terminated, owned by the st_file */
  st_dtype dtype;
  int ndims;                 /* 0 for a scalar, at most ST_MAX_DIMS */
  int64_t shape[ST_MAX_DIMS];/* first ndims entries, each >= 0 */
  uint64_t begin, end;       /* byte range in the data area (after the header) */
} st_tensor;

/* An open file: its mapping and its parsed, checked header. */
typedef struct st_file st_file;

/* The name in headers ("F32", "BF16", ...). */
const char *st_dtype_name(st_dtype dt);
/* Bytes per element (BOOL: 1). */
int st_dtype_size(st_dtype dt);

/* Opens and checks a file: a regular file only (a FIFO or a device is
 * refused without blocking). NULL and "PATH: reason" in err on failure. */
st_file *st_open(const char *path, char *err, size_t errlen);
/* Number of tensors, and tensor i (0 <= i < st_count) in header order. */
int st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, int i);
/* The tensor called name, or NULL (binary search). */
const st_tensor *st_find(const st_file *f, const char *name);
/* The "__metadata__" value of key, or NULL if absent. */
const char *st_meta(const st_file *f, const char *key);
/* Number of metadata entries, and entry i (sorted by key). */
int st_meta_count(const st_file *f);
const char *st_meta_key(const st_file *f, int i);
/* Product of the shape (1 for a scalar). */
int64_t st_numel(const st_tensor *t);
/* The tensor's raw little-endian bytes (t->end - t->begin of them), as they
 * are in the file; not aligned to anything. */
const void *st_data(const st_file *f, const st_tensor *t);
/* Converts F32, F16, BF16, F64 to float into out[st_numel(t)]: exact for the
 * first three, rounded to nearest for F64 (out of range: +-inf). False and a
 * message for other dtypes. */
bool st_read_f32(const st_file *f, const st_tensor *t, float *out,
                 char *err, size_t errlen);
/* Converts I32, I64, U8, I8 and BOOL to int32 into out[st_numel(t)]. False
 * and a message naming the element for an I64 value outside int32 or a BOOL
 * byte other than 0 or 1, and for the float dtypes. */
bool st_read_i32(const st_file *f, const st_tensor *t, int32_t *out,
                 char *err, size_t errlen);
/* Unmaps and frees; the tensors and strings it handed out go with it.
 * NULL is allowed. */
void st_close(st_file *f);

/* A file being put together: tensors and metadata, written by st_write. */
typedef struct st_writer st_writer;

st_writer *st_writer_new(void);
/* Adds a tensor. name and shape are copied; data (native byte order,
 * row-major, st_numel * st_dtype_size bytes; may be NULL when that is 0) is
 * borrowed until st_write returns. Mistakes (a duplicate name, a negative
 * size, more than ST_MAX_DIMS dims, a name that is not UTF-8) are reported
 * by st_write. */
void st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndims,
                   const int64_t *shape, const void *data);
/* Sets a "__metadata__" entry (both copied); a second call with the same key
 * replaces the value. */
void st_writer_meta(st_writer *w, const char *key, const char *value);
/* Writes the file atomically (base/files.h): a temporary file in the same
 * directory (".NAME.PID.N.tmp", removed on failure and by SIGINT, SIGTERM
 * or SIGHUP; those of killed runs are removed by the next save to path),
 * fsync, rename over path, fsync of the directory. A path that is neither
 * a regular file nor a new name (a device, a FIFO, a directory, a link to
 * one) is refused before anything is written.
 * Tensor names are sorted (byte order) in the header and their data laid out
 * in that order, the header padded with spaces to a multiple of 8, so that
 * the same content gives byte-identical files whatever the order of the
 * st_writer_add calls. False and "PATH: reason" on any failure; path is then
 * untouched and the temporary removed. (One exception, said in the message:
 * when the rename succeeded but the directory's fsync failed, path holds the
 * complete new file, which a crash of the machine might still undo.) The
 * writer is unchanged and may be written again. */
bool st_write(st_writer *w, const char *path, char *err, size_t errlen);
/* Frees the writer (not the borrowed data). NULL is allowed. */
void st_writer_free(st_writer *w);

/* ---- the index of a sharded checkpoint ---------------------------------------
 * model.safetensors.index.json, in the manner of Hugging Face's:
 *   {"metadata": {"total_size": BYTES, KEY: "VALUE", ...},
 *    "weight_map": {TENSOR: FILE, ...},
 *    "tensors": {TENSOR: {"shape": [..], "pieces": [{"file": FILE,
 *        "entry": NAME, "start": [..], "stop": [..]}, ...]}, ...}}
 * A tensor is held in pieces, each the box [start, stop) of its whole
 * shape, stored as tensor `entry` of shard FILE; weight_map names the file
 * of its first piece. Files are model-NNNNN-of-NNNNN.safetensors beside
 * the index, never a path. Read with the strict parser of headers; every
 * piece is checked to lie inside its tensor's shape. */
typedef struct st_piece {
  int file;                  /* into st_index.files */
  const char *entry;
  int64_t start[ST_MAX_DIMS], stop[ST_MAX_DIMS];
} st_piece;

typedef struct st_itensor {
  const char *name;
  int ndims;
  int64_t shape[ST_MAX_DIMS];
  int npieces;
  st_piece *pieces;
} st_itensor;

typedef struct st_index {
  int nmeta;
  const char **meta_key, **meta_val;   /* the metadata's strings */
  int64_t total_size;                  /* bytes of tensor data in all shards */
  int nfiles;
  const char **files;
  int ntensors;
  st_itensor *tensors;
  struct st_index_mem *mem;            /* what the strings above live in (read) */
} st_index;

/* Whether name is model-RRRRR-of-NNNNN.safetensors with 1 <= R <= N (both
 * out when not NULL). */
bool st_shard_name_ok(const char *name, int *shard, int *of);
/* Reads and checks an index (a regular file of at most 100 MB). NULL and
 * "PATH: reason" on failure. */
st_index *st_index_read(const char *path, char *err, size_t errlen);
const char *st_index_meta(const st_index *ix, const char *key);
void st_index_free(st_index *ix);
/* Writes ix (filled by the caller; mem unused) atomically (base/files.h). */
bool st_index_write(const st_index *ix, const char *path, char *err, size_t errlen);

#endif
