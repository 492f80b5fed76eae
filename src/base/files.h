/* files.h - files weft does not trust: opened without blocking and only
 * when they are regular files, read within a size limit, and written
 * through a temporary beside the target that is renamed into place, or
 * removed on error and on SIGINT, SIGTERM or SIGHUP.
 *
 * Every reader of a plan, checkpoint, input or data file opens it here, so
 * that a FIFO or a device named where a file is expected is refused at once
 * instead of blocking weft forever. Reasons are returned as text ("a FIFO,
 * not a regular file") for the caller to put after the file's name. */
#ifndef WEFT_BASE_FILES_H
#define WEFT_BASE_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* "a FIFO", "a directory", "a character device", ... for a file mode. */
const char *file_kind(mode_t mode);

/* Opens path read-only. The open cannot block (O_NONBLOCK, cleared again
 * once fstat shows a regular file); anything but a regular file, and a file
 * over max_bytes (0: any size), is refused. Returns the descriptor (with
 * FD_CLOEXEC) and its size in *size, or -1 and the reason in why. */
int file_open_read(const char *path, int64_t max_bytes, int64_t *size, char *why, size_t whylen);

/* The whole file, malloc'd and NUL-terminated (*len without the NUL), or
 * NULL and the reason, as file_open_read. */
char *file_read_all(const char *path, int64_t max_bytes, size_t *len, char *why, size_t whylen);

/* Whether weft may write path: an existing regular file (or a symbolic
 * link to one), or a new name in an existing directory. A directory, a
 * device, a FIFO, a socket, or a link to one is refused with the reason. */
bool file_check_output(const char *path, char *why, size_t whylen);

/* Whether a and b name the same existing file (device and inode). */
bool file_same(const char *a, const char *b);

/* A file being written: a temporary ".NAME.PID.N.tmp" in the target's
 * directory (so that rename stays on one file system), created with
 * O_EXCL, registered for removal when a signal ends weft. */
typedef struct file_out file_out;

/* Creates the temporary for path (after checking path with
 * file_check_output). Temporaries that runs which no longer exist left
 * for the same name are removed first. NULL and "PATH: reason" in err. */
file_out *file_out_open(const char *path, char *err, size_t errlen);
/* The temporary's descriptor, and its path (for messages). */
int file_out_fd(const file_out *o);
const char *file_out_tmp(const file_out *o);
/* A stream on the temporary, made on the first call. */
FILE *file_out_stream(file_out *o);
/* Flushes, syncs and renames the temporary over the target (a symbolic
 * link is followed: its target is replaced, the link kept), then syncs the
 * directory. Frees o. False and "PATH: reason": the target is then
 * untouched and the temporary removed, except when only the directory's
 * sync failed, which the message says. */
bool file_out_commit(file_out *o, char *err, size_t errlen);
/* Removes the temporary and frees o; NULL is allowed. */
void file_out_abort(file_out *o);

/* Writes text to path through a file_out; false and "PATH: reason". */
bool file_write_text(const char *path, const char *text, size_t len, char *err, size_t errlen);

#endif
