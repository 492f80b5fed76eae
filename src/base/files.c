/* files.c - opening, reading and writing files that weft does not trust
 * (files.h): regular files only, never a blocking open, outputs through a
 * temporary that a failure or a signal removes. */
#include "base/files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "weft/arena.h"

static void say(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *buf, size_t n, const char *fmt, ...) {
  if (!buf || !n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, n, fmt, ap);
  va_end(ap);
}

const char *file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a file";
}

/* "16 MiB" for the limits in messages. */
static const char *human(char *buf, size_t n, int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) snprintf(buf, n, "%" PRId64 " MiB", bytes >> 20);
  else snprintf(buf, n, "%" PRId64 " bytes", bytes);
  return buf;
}

int file_open_read(const char *path, int64_t max_bytes, int64_t *size, char *why, size_t whylen) {
  /* O_NONBLOCK: the open of a FIFO without a writer, or of some devices,
   * would otherwise wait forever before fstat could tell what it is */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    say(why, whylen, "%s", strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    say(why, whylen, "cannot stat: %s", strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    say(why, whylen, "%s, not a regular file", file_kind(st.st_mode));
    close(fd);
    errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    return -1;
  }
  if (max_bytes > 0 && st.st_size > max_bytes) {
    char b[32];
    say(why, whylen, "%lld bytes, over the limit of %s", (long long)st.st_size, human(b, sizeof b, max_bytes));
    close(fd);
    errno = EFBIG;
    return -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  if (size) *size = (int64_t)st.st_size;
  return fd;
}

char *file_read_all(const char *path, int64_t max_bytes, size_t *len, char *why, size_t whylen) {
  int64_t size = 0;
  int fd = file_open_read(path, max_bytes, &size, why, whylen);
  if (fd < 0) return NULL;
  size_t cap = (size_t)size + 1, n = 0;
  char *buf = malloc(cap);
  if (!buf) weft_oom();
  for (;;) {
    if (n + 1 >= cap) {
      /* the file grew since fstat */
      if (max_bytes > 0 && (int64_t)n >= max_bytes) {
        char b[32];
        say(why, whylen, "over the limit of %s", human(b, sizeof b, max_bytes));
        free(buf);
        close(fd);
        errno = EFBIG;
        return NULL;
      }
      cap = cap * 2 + 4096;
      char *nb = realloc(buf, cap);
      if (!nb) weft_oom();
      buf = nb;
    }
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      say(why, whylen, "%s", strerror(e));
      free(buf);
      close(fd);
      errno = e;
      return NULL;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (max_bytes > 0 && (int64_t)n > max_bytes) {
    char b[32];
    say(why, whylen, "over the limit of %s", human(b, sizeof b, max_bytes));
    free(buf);
    errno = EFBIG;
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

/* The directory part of path ("." when it has none), malloc'd. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = malloc(n + 1);
  if (!d) weft_oom();
  memcpy(d, path, n);
  d[n] = 0;
  return d;
}

bool file_check_output(const char *path, char *why, size_t whylen) {
  if (!*path || path[strlen(path) - 1] == '/') {
    say(why, whylen, "not a file name");
    return false;
  }
  struct stat ls, st;
  if (lstat(path, &ls) == 0) {
    if (S_ISLNK(ls.st_mode)) {
      if (stat(path, &st) != 0) {
        say(why, whylen, "a symbolic link to nothing (%s)", strerror(errno));
        return false;
      }
      if (!S_ISREG(st.st_mode)) {
        say(why, whylen, "a symbolic link to %s, not to a regular file", file_kind(st.st_mode));
        return false;
      }
    } else if (!S_ISREG(ls.st_mode)) {
      say(why, whylen, "%s, not a regular file", file_kind(ls.st_mode));
      return false;
    }
  } else if (errno != ENOENT) {
    say(why, whylen, "%s", strerror(errno));
    return false;
  }
  char *dir = dir_of(path);
  bool ok = true;
  int sr = stat(dir, &st);
  if (sr != 0 || !S_ISDIR(st.st_mode)) {
    say(why, whylen, "its directory %s: %s", dir, strerror(sr != 0 ? errno : ENOTDIR));
    ok = false;
  } else if (access(dir, W_OK | X_OK) != 0) {
    say(why, whylen, "cannot write in its directory %s: %s", dir, strerror(errno));
    ok = false;
  }
  free(dir);
  return ok;
}

bool file_same(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* ---- temporaries removed by a signal ---------------------------------------
 * The one process-wide table of weft: a signal handler cannot reach any
 * other state. Slots are filled before they are marked used, and the
 * handler only calls unlink, which is async-signal-safe. */

enum { TMP_SLOTS = 8 };

static struct {
  volatile sig_atomic_t used;
  char path[PATH_MAX + 96];
} tmp_slots[TMP_SLOTS];

static volatile sig_atomic_t handlers_set;

static void on_signal(int sig) {
  for (int i = 0; i < TMP_SLOTS; i++)
    if (tmp_slots[i].used) unlink(tmp_slots[i].path);
  signal(sig, SIG_DFL);
  raise(sig);
}

static void set_handlers(void) {
  if (handlers_set) return;
  handlers_set = 1;
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    /* a signal someone ignores (nohup) or handles stays theirs */
    if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

static int tmp_register(const char *path) {
  set_handlers();
  for (int i = 0; i < TMP_SLOTS; i++)
    if (!tmp_slots[i].used && strlen(path) < sizeof tmp_slots[i].path) {
      strcpy(tmp_slots[i].path, path);
      tmp_slots[i].used = 1;
      return i;
    }
  return -1;  /* not removed by a signal, still by errors */
}

static void tmp_forget(int slot) {
  if (slot >= 0) tmp_slots[slot].used = 0;
}

struct file_out {
  char *target;           /* the file to replace: path, or what its link names */
  char *tmp;
  int fd, slot;
  FILE *stream;
};

/* Whether name is ".BASE.PID.N.tmp"; *pid gets PID. */
static bool is_tmp_of(const char *name, const char *base, long *pid) {
  size_t bl = strlen(base);
  if (name[0] != '.' || strncmp(name + 1, base, bl) != 0 || name[1 + bl] != '.') return false;
  const char *p = name + 2 + bl;
  char *end;
  errno = 0;
  long v = strtol(p, &end, 10);
  if (end == p || *end != '.' || v <= 0 || errno) return false;
  const char *q = end + 1;
  strtoul(q, &end, 10);
  if (end == q || strcmp(end, ".tmp") != 0) return false;
  *pid = v;
  return true;
}

/* Removes the temporaries of earlier runs for base in dir: those whose
 * process is gone (a run killed while it saved), owned by this user. */
static void remove_stale(const char *dir, const char *base) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    long pid;
    if (!is_tmp_of(e->d_name, base, &pid) || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    size_t n = strlen(dir) + strlen(e->d_name) + 2;
    char *p = malloc(n);
    if (!p) weft_oom();
    snprintf(p, n, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) unlink(p);
    free(p);
  }
  closedir(d);
}

file_out *file_out_open(const char *path, char *err, size_t errlen) {
  char why[PATH_MAX + 128];
  if (!file_check_output(path, why, sizeof why)) {
    say(err, errlen, "%s: %s", path, why);
    return NULL;
  }
  file_out *o = calloc(1, sizeof *o);
  if (!o) weft_oom();
  o->fd = -1;
  o->slot = -1;
  struct stat ls;
  char *real = lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode) ? realpath(path, NULL) : NULL;
  o->target = real ? real : strdup(path);
  if (!o->target) weft_oom();
  char *dir = dir_of(o->target);
  const char *slash = strrchr(o->target, '/');
  const char *base = slash ? slash + 1 : o->target;
  remove_stale(dir, base);
  size_t n = strlen(o->target) + 64;
  o->tmp = malloc(n);
  if (!o->tmp) weft_oom();
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  unsigned seq = (unsigned)(now.tv_nsec % 1000000);
  for (int tries = 0; tries < 100 && o->fd < 0; tries++, seq++) {
    snprintf(o->tmp, n, "%s%s.%s.%ld.%u.tmp", slash ? dir : "", slash ? (strcmp(dir, "/") ? "/" : "") : "", base,
             (long)getpid(), seq);
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (o->fd < 0 && errno != EEXIST) break;
  }
  free(dir);
  if (o->fd < 0) {
    say(err, errlen, "%s: cannot create the temporary file %s: %s", path, o->tmp, strerror(errno));
    free(o->tmp), free(o->target), free(o);
    return NULL;
  }
  o->slot = tmp_register(o->tmp);
  return o;
}

int file_out_fd(const file_out *o) { return o->fd; }
const char *file_out_tmp(const file_out *o) { return o->tmp; }

FILE *file_out_stream(file_out *o) {
  if (!o->stream) {
    o->stream = fdopen(o->fd, "w");
    if (!o->stream) weft_oom();
  }
  return o->stream;
}

static void out_free(file_out *o) {
  tmp_forget(o->slot);
  free(o->tmp), free(o->target), free(o);
}

void file_out_abort(file_out *o) {
  if (!o) return;
  if (o->stream) fclose(o->stream);
  else if (o->fd >= 0) close(o->fd);
  unlink(o->tmp);
  out_free(o);
}

bool file_out_commit(file_out *o, char *err, size_t errlen) {
  const char *step = NULL;
  int saved = 0;
  if (o->stream && (fflush(o->stream) != 0 || ferror(o->stream))) step = "cannot write";
  else if (fsync(o->fd) != 0) step = "cannot fsync";
  if (step) saved = errno ? errno : EIO;
  int rc = o->stream ? fclose(o->stream) : close(o->fd);
  o->stream = NULL;
  o->fd = -1;
  if (rc != 0 && !step) step = "cannot close", saved = errno;
  if (!step && rename(o->tmp, o->target) != 0) step = "cannot rename", saved = errno;
  if (step) {
    struct stat st;
    say(err, errlen, "%s: %s: %s (%s)", o->target, step, strerror(saved),
        lstat(o->target, &st) == 0 ? "the file is unchanged" : "no file was made");
    unlink(o->tmp);
    out_free(o);
    return false;
  }
  tmp_forget(o->slot);
  o->slot = -1;
  /* The rename is durable once the directory is: some file systems cannot
   * fsync a directory (EINVAL), and have nothing to flush then. */
  char *dir = dir_of(o->target);
  bool ok = true;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP)) {
    say(err, errlen, "%s: the new file is in place, but its directory cannot be fsynced: %s", o->target,
        strerror(errno));
    ok = false;
  }
  if (dfd >= 0) close(dfd);
  free(dir);
  out_free(o);
  return ok;
}

bool file_write_text(const char *path, const char *text, size_t len, char *err, size_t errlen) {
  file_out *o = file_out_open(path, err, errlen);
  if (!o) return false;
  const char *p = text;
  size_t left = len;
  while (left) {
    ssize_t w = write(file_out_fd(o), p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      struct stat st;
      say(err, errlen, "%s: cannot write: %s (%s)", path, strerror(e),
          lstat(path, &st) == 0 ? "the file is unchanged" : "no file was made");
      file_out_abort(o);
      return false;
    }
    p += w;
    left -= (size_t)w;
  }
  return file_out_commit(o, err, errlen);
}
