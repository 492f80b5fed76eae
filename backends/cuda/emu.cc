/* emu.cc - the CUDA execution model on the CPU (emu.h): blocks of fibers,
 * barriers and shuffles, streams that run their queued work in a random
 * order the events allow. Built only into the emulated backend. */
#include "emu.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include <cstdio>
#include <ctime>
#include <map>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
extern "C" void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

emu_thread *emu_self;
uint64_t emu_block_serial;
dim3 emu_block_idx, emu_block_dim, emu_grid_dim;
unsigned char *emu_dyn_smem;

/* The first error of the emulation (a deadlock at barriers); reported by
 * the runtime's next check (runtime.cu). */
std::string emu_error;

/* The emulated GPU (WEFT_CUDA_EMU_CC): a compute capability and the most
 * dynamic shared memory a block of it may have (CUDA's table of them). */
static const emu_gpu emu_gpus[] = {{7, 0, 96 << 10, true},  {7, 5, 64 << 10, true},   {8, 0, 163 << 10, true},
                                   {8, 6, 99 << 10, true},  {8, 7, 163 << 10, true},  {8, 9, 99 << 10, true},
                                   {9, 0, 227 << 10, true}, {10, 0, 227 << 10, true}, {12, 0, 99 << 10, true}};
static const emu_gpu &emu_hopper = emu_gpus[6];

emu_gpu emu_device() {
  static const emu_gpu gpu = [] {
    const char *e = getenv("WEFT_CUDA_EMU_CC");
    if (!e || !*e) return emu_hopper;
    for (const emu_gpu &g : emu_gpus) {
      char name[16];
      snprintf(name, sizeof name, "%d.%d", g.major, g.minor);
      if (strcmp(e, name) == 0) return g;
    }
    emu_gpu unknown = emu_hopper;
    unknown.known = false;
    return unknown;
  }();
  return gpu;
}

std::string emu_device_names() {
  std::string all;
  for (const emu_gpu &g : emu_gpus) all += (all.empty() ? "" : ", ") + std::to_string(g.major) + "." + std::to_string(g.minor);
  return all;
}

void emu_report(const char *what) {
  if (emu_error.empty()) emu_error = what;
}

/* ---- fibers ------------------------------------------------------------------------ */

enum { STACK_BYTES = 256 << 10 };

#if defined(__x86_64__)
/* Saves the callee-saved registers on this stack, stores the stack pointer
 * in *from and continues on `to` (the kernels leave the floating-point
 * control words as they are). */
extern "C" void emu_swap(void **from, void *to);
asm(".text\n"
    ".globl emu_swap\n"
    ".type emu_swap,@function\n"
    "emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_swap, .-emu_swap\n");
#endif

struct fiber {
  emu_thread t;
  char *stack;
  bool done;
  int wait;               /* 0 running; 1 at the block's barrier, 2 at its warp's */
  unsigned wgen;          /* the barrier's generation it waits to pass */
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t ctx;
#endif
#ifdef EMU_ASAN
  void *fake;
#endif
};

struct warp_state {
  int alive, arrived;
  unsigned gen;
  uint64_t slot[2][32];   /* shuffles and ballots alternate: one barrier each */
  int parity[32];
};

static struct block_state {
  std::vector<fiber> f;
  std::vector<warp_state> w;
  int n, alive, arrived;
  unsigned gen;
  const std::function<void()> *body;
  fiber *cur;
#if defined(__x86_64__)
  void *sched_sp;
#else
  ucontext_t sched;
#endif
#ifdef EMU_ASAN
  void *sched_fake;
  const void *sched_bottom;
  size_t sched_size;
  bool from_sched;
#endif
} B;

static std::vector<char *> stacks;

static char *stack_for(int i) {
  while ((int)stacks.size() <= i) {
    void *p = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fprintf(stderr, "weft: the CUDA emulation cannot map a stack\n");
      abort();
    }
    stacks.push_back((char *)p);
  }
  return stacks[i];
}

/* Fibers switch to one another directly, round robin: one that waits at a
 * barrier or ends passes to the next that may run, and the scheduler is
 * resumed only when the block is done or its threads are stuck. */
static void to_scheduler(bool exiting) {
  fiber *me = B.cur;
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? NULL : &me->fake, B.sched_bottom, B.sched_size);
#else
  (void)exiting;
#endif
#if defined(__x86_64__)
  emu_swap(&me->sp, B.sched_sp);
#else
  swapcontext(&me->ctx, &B.sched);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(me->fake, NULL, NULL);
#endif
}

static inline bool runnable(const fiber *f) {
  if (f->done) return false;
  if (f->wait == 1) return B.gen != f->wgen;
  if (f->wait == 2) return B.w[f->t.warp].gen != f->wgen;
  return true;
}

/* The first fiber after `from` in index order, wrapping, that may run. */
static fiber *next_runnable(fiber *from) {
  int n = B.n, i = (int)(from - B.f.data());
  for (int k = 1; k <= n; k++) {
    if (++i == n) i = 0;
    if (runnable(&B.f[i])) return &B.f[i];
  }
  return NULL;
}

/* From this fiber to the next that may run, or to the scheduler where none
 * may (the block done, or its threads stuck). */
static void pass_on(bool exiting) {
  fiber *me = B.cur, *to = next_runnable(me);
  if (!to) {
    to_scheduler(exiting);
    return;
  }
  B.cur = to;
  emu_self = &to->t;
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? NULL : &me->fake, to->stack, STACK_BYTES);
#endif
#if defined(__x86_64__)
  emu_swap(&me->sp, to->sp);
#else
  swapcontext(&me->ctx, &to->ctx);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(me->fake, NULL, NULL);
#endif
}

static void fiber_exit();

static void fiber_entry() {
#ifdef EMU_ASAN
  /* the first fiber of a block starts from the scheduler: its stack is
   * where the last fiber returns */
  static const void *bottom;
  static size_t size;
  __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
  if (B.from_sched) B.sched_bottom = bottom, B.sched_size = size, B.from_sched = false;
#endif
  (*B.body)();
  fiber_exit();
}

static void release_warp(warp_state *w) {
  if (w->arrived > 0 && w->arrived == w->alive) {
    w->arrived = 0;
    w->gen++;
  }
}

static void fiber_exit() {
  fiber *me = B.cur;
  me->done = true;
  B.alive--;
  warp_state *w = &B.w[me->t.warp];
  w->alive--;
  release_warp(w);
  if (B.arrived > 0 && B.arrived == B.alive) {
    B.arrived = 0;
    B.gen++;
  }
  pass_on(true);
  abort();  /* never resumed */
}

static void fiber_start(fiber *f, int i) {
  f->stack = stack_for(i);
#ifdef EMU_ASAN
  /* frames that never returned (a fiber's last, or a stuck block's) */
  __asan_unpoison_memory_region(f->stack, STACK_BYTES);
#endif
  f->done = false;
  f->wait = 0;
#if defined(__x86_64__)
  uintptr_t top = ((uintptr_t)f->stack + STACK_BYTES) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)top;
  *--sp = 0;                            /* where fiber_entry would return */
  *--sp = (uint64_t)(uintptr_t)fiber_entry;
  for (int r = 0; r < 6; r++) *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
  f->sp = sp;
#else
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = STACK_BYTES;
  f->ctx.uc_link = NULL;
  makecontext(&f->ctx, fiber_entry, 0);
#endif
}

/* From the scheduler to the block's first fiber; back when none may run. */
static void resume(fiber *f) {
  B.cur = f;
  emu_self = &f->t;
#ifdef EMU_ASAN
  B.from_sched = true;
  __sanitizer_start_switch_fiber(&B.sched_fake, f->stack, STACK_BYTES);
#endif
#if defined(__x86_64__)
  emu_swap(&B.sched_sp, f->sp);
#else
  swapcontext(&B.sched, &f->ctx);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(B.sched_fake, NULL, NULL);
#endif
}

/* A fiber at a barrier runs again only once its generation has passed. */
void emu_syncthreads() {
  B.arrived++;
  unsigned g = B.gen;
  if (B.arrived == B.alive) {
    B.arrived = 0;
    B.gen++;
    return;
  }
  B.cur->wait = 1, B.cur->wgen = g;
  pass_on(false);
  B.cur->wait = 0;
}

void emu_syncwarp() {
  warp_state *w = &B.w[emu_self->warp];
  w->arrived++;
  unsigned g = w->gen;
  if (w->arrived == w->alive) {
    w->arrived = 0;
    w->gen++;
    return;
  }
  B.cur->wait = 2, B.cur->wgen = g;
  pass_on(false);
  B.cur->wait = 0;
}

/* Every lane writes its slot of one of two sets, all meet, each reads; the
 * next meeting uses the other set, which no lane can reach before every
 * lane has passed this one's barrier and read. */
const uint64_t *emu_gather(uint64_t mine) {
  warp_state *w = &B.w[emu_self->warp];
  int lane = emu_self->lane, p = w->parity[lane];
  w->parity[lane] = p ^ 1;
  w->slot[p][lane] = mine;
  emu_syncwarp();
  return w->slot[p];
}

uint64_t emu_exchange(uint64_t mine, int src) { return emu_gather(mine)[src & 31]; }

/* A lane offers the barrier's generation with its bit, so that lanes that
 * have ended (and left an older slot) count as false. */
unsigned emu_ballot(bool p) {
  uint64_t mine = (uint64_t)B.w[emu_self->warp].gen << 1 | (p ? 1u : 0u);
  const uint64_t *all = emu_gather(mine);
  unsigned m = 0;
  for (int i = 0; i < 32; i++)
    if (all[i] == (mine | 1u)) m |= 1u << i;
  return m;
}

/* One block: every thread a fiber, passing to one another until all are
 * done or none may run. */
static bool run_block(const std::function<void()> &body) {
  int n = (int)(emu_block_dim.x * emu_block_dim.y * emu_block_dim.z);
  B.f.resize((size_t)n);
  int nw = (n + 31) / 32;
  B.w.assign((size_t)nw, warp_state{});
  for (int i = 0; i < nw; i++) B.w[i].alive = i < nw - 1 ? 32 : n - 32 * (nw - 1);
  B.n = n, B.alive = n, B.arrived = 0, B.gen = 0, B.body = &body;
  emu_block_serial++;
  for (int i = 0; i < n; i++) {
    fiber *f = &B.f[i];
    f->t.tid = dim3(i % emu_block_dim.x, i / emu_block_dim.x % emu_block_dim.y, i / (emu_block_dim.x * emu_block_dim.y));
    f->t.lane = i % 32;
    f->t.warp = i / 32;
    f->t.mma = 0;
    f->t.wg = 0;
    fiber_start(f, i);
  }
  resume(&B.f[0]);
  emu_self = NULL;
  for (int i = 0; i < n; i++)
    if (B.f[i].t.wg) {
      emu_report("wgmma (emulated): products still in flight when their block ended (no wait for them)");
      break;
    }
  if (B.alive > 0) {
    char msg[200];
    snprintf(msg, sizeof msg,
             "emulated kernel: block (%u, %u, %u): threads wait at barriers the others never reach",
             emu_block_idx.x, emu_block_idx.y, emu_block_idx.z);
    if (emu_error.empty()) emu_error = msg;
    return false;
  }
  return true;
}

static void run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
  if (!emu_error.empty()) return;
  unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
      grid.z > 65535) {
    char msg[160];
    snprintf(msg, sizeof msg, "emulated launch: invalid configuration (grid %u x %u x %u, block of %u threads)",
             grid.x, grid.y, grid.z, threads);
    emu_error = msg;
    return;
  }
  std::vector<unsigned char> dyn(smem + 16, 0xA5);
  emu_dyn_smem = (unsigned char *)(((uintptr_t)dyn.data() + 15) & ~(uintptr_t)15);
  emu_grid_dim = grid;
  emu_block_dim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        emu_block_idx = dim3(x, y, z);
        if (!run_block(body)) return;
      }
}

/* ---- streams ---------------------------------------------------------------------- */

struct emu_op {
  std::function<void()> fn;   /* empty for a wait */
  std::function<bool()> ready; /* empty, or whether fn may run yet (another process's work) */
  uint64_t wait_for;          /* a wait: the record it waits for (0: none) */
  uint64_t record;            /* a record: its number */
};

struct emu_stream {
  std::deque<emu_op> q;
};

static emu_stream default_stream;
static std::vector<emu_stream *> streams = {&default_stream};
static std::vector<bool> recorded = {true};
static uint64_t rng_state;

static uint64_t rng() {
  if (!rng_state) {
    const char *s = getenv("WEFT_CUDA_EMU_SEED");
    rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(s ? strtoull(s, NULL, 10) + 1 : 1);
  }
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static emu_stream *stream_of(emu_stream *s) { return s ? s : &default_stream; }

/* WEFT_CUDA_EMU_FAIL=N: the N-th kernel fails, as a faulting kernel would
 * (for the tests of the backend's error messages). */
static long launches, fail_at = -1;

/* WEFT_CUDA_EMU_LAUNCHES=FILE: at exit, FILE gets each kernel's launches,
 * a line "count kernel<template arguments>", for the tests that count what
 * a step launches. */
static std::map<const void *, long> *tally;
static std::string tally_file;

/* A kernel's name with its template arguments, without its parameters:
 * "k_attn_dq_fa<__nv_bfloat16, 64, 2>". */
static std::string kernel_name(const void *kernel) {
  Dl_info di;
  std::string name = "?";
  if (kernel && dladdr(kernel, &di) && di.dli_sname) {
    int st = 0;
    char *dm = abi::__cxa_demangle(di.dli_sname, nullptr, nullptr, &st);
    name = st == 0 && dm ? dm : di.dli_sname;
    free(dm);
    size_t depth = 0, cut = std::string::npos;
    for (size_t i = 0; i < name.size() && cut == std::string::npos; i++) {
      if (name[i] == '<') depth++;
      else if (name[i] == '>') depth--;
      else if (name[i] == '(' && depth == 0) cut = i;
    }
    if (cut != std::string::npos) name.resize(cut);
    if (name.compare(0, 5, "void ") == 0) name.erase(0, 5);
  }
  return name;
}

static void write_tally() {
  FILE *f = fopen(tally_file.c_str(), "w");
  if (!f) return;
  for (const auto &t : *tally) fprintf(f, "%ld %s\n", t.second, kernel_name(t.first).c_str());
  fclose(f);
}

/* WEFT_CUDA_EMU_BANKS=FILE: at exit, FILE gets a line for each kernel
 * whose warps read shared memory through ldmatrix: "kernel: N ldmatrix,
 * W wavefronts, I without conflicts". */
struct bank_tally {
  long instructions, wavefronts, ideal;
};
static std::map<const void *, bank_tally> *banks;
static std::string banks_file;
static const void *running_kernel; /* the kernel whose blocks run now */

static void write_banks() {
  FILE *f = fopen(banks_file.c_str(), "w");
  if (!f) return;
  for (const auto &b : *banks)
    fprintf(f, "%s: %ld ldmatrix, %ld wavefronts, %ld without conflicts\n", kernel_name(b.first).c_str(),
            b.second.instructions, b.second.wavefronts, b.second.ideal);
  fclose(f);
}

void emu_smem_wavefronts(long ideal, long wavefronts) {
  static const void *last;
  static bank_tally *at;
  if (!banks) {
    banks = new std::map<const void *, bank_tally>;
    const char *f = getenv("WEFT_CUDA_EMU_BANKS");
    if (f && *f) banks_file = f, atexit(write_banks);
  }
  if (!at || last != running_kernel) at = &(*banks)[running_kernel], last = running_kernel;
  at->instructions++, at->wavefronts += wavefronts, at->ideal += ideal;
}

bool emu_smem_counts(const void *kernel, long counts[3]) {
  auto it = banks ? banks->find(kernel) : std::map<const void *, bank_tally>::iterator();
  if (!banks || it == banks->end()) return false;
  counts[0] = it->second.instructions, counts[1] = it->second.wavefronts, counts[2] = it->second.ideal;
  return true;
}

static void count_launch(const void *kernel) {
  static int on = -1;
  if (on < 0) {
    const char *f = getenv("WEFT_CUDA_EMU_LAUNCHES");
    on = f && *f;
    if (on) {
      tally_file = f;
      tally = new std::map<const void *, long>;
      atexit(write_tally);
    }
  }
  if (on && kernel) (*tally)[kernel]++;
}

void emu_count(const void *fn) { count_launch(fn); }

static std::map<const void *, size_t> smem_allowed;

/* A launch that fails as it runs on s, with msg (a fault's place in the
 * stream's order). */
static void queue_error(emu_stream *s, const std::string &msg) {
  stream_of(s)->q.push_back(emu_op{[msg] { emu_report(msg.c_str()); }, {}, 0, 0});
}

void emu_allow_smem(const void *kernel, size_t bytes) {
  if (bytes > (48 << 10) && bytes <= emu_device().smem_most) smem_allowed[kernel] = bytes;
}

void emu_launch(emu_stream *s, dim3 grid, dim3 block, size_t smem, std::function<void()> body, const void *kernel) {
  count_launch(kernel);
  if (smem > (48 << 10)) {
    const emu_gpu g = emu_device();
    auto it = kernel ? smem_allowed.find(kernel) : smem_allowed.end();
    if (smem > g.smem_most || it == smem_allowed.end() || it->second < smem) {
      char msg[240];
      if (smem > g.smem_most)
        snprintf(msg, sizeof msg,
                 "emulated launch: %zu bytes of dynamic shared memory, over the %zu KiB a block may have on "
                 "compute capability %d.%d (invalid argument)",
                 smem, g.smem_most >> 10, g.major, g.minor);
      else
        snprintf(msg, sizeof msg,
                 "emulated launch: %zu bytes of dynamic shared memory, over the 48 KiB a kernel has unless "
                 "cudaFuncSetAttribute allowed more (invalid argument)",
                 smem);
      queue_error(s, msg);
      return;
    }
  }
  if (fail_at < 0) {
    const char *f = getenv("WEFT_CUDA_EMU_FAIL");
    fail_at = f ? atol(f) : 0;
  }
  if (fail_at > 0 && ++launches == fail_at) {
    queue_error(s, "an illegal memory access was encountered (emulated, WEFT_CUDA_EMU_FAIL)");
    return;
  }
  stream_of(s)->q.push_back(emu_op{[=] {
                                     running_kernel = kernel;
                                     run_grid(grid, block, smem, body);
                                     running_kernel = nullptr;
                                   },
                                   {}, 0, 0});
}

void emu_enqueue(emu_stream *s, std::function<void()> work) { stream_of(s)->q.push_back(emu_op{work, {}, 0, 0}); }

void emu_enqueue_when(emu_stream *s, std::function<bool()> ready, std::function<void()> work) {
  stream_of(s)->q.push_back(emu_op{work, ready, 0, 0});
}

emu_stream *emu_stream_new() {
  emu_stream *s = new emu_stream;
  streams.push_back(s);
  return s;
}

void emu_drain();

void emu_stream_free(emu_stream *s) {
  emu_drain();
  for (size_t i = 0; i < streams.size(); i++)
    if (streams[i] == s) streams.erase(streams.begin() + (long)i);
  delete s;
}

uint64_t emu_record(emu_stream *s) {
  uint64_t id = recorded.size();
  recorded.push_back(false);
  stream_of(s)->q.push_back(emu_op{std::function<void()>(), {}, 0, id});
  return id;
}

void emu_wait(emu_stream *s, uint64_t id) {
  if (id) stream_of(s)->q.push_back(emu_op{std::function<void()>(), {}, id, 0});
}

bool emu_recorded(uint64_t id) { return id < recorded.size() && recorded[id]; }

/* Runs what can run. The streams get random priorities, and the highest
 * whose next operation may run goes first: a stream that nothing orders
 * after another overtakes it whenever its priority is the higher, so a
 * missing wait shows as a wrong result for about half the seeds
 * (WEFT_CUDA_EMU_SEED). Priorities are drawn again every 256 operations.
 * True when nothing is left; false when what is left waits for another
 * process (emu_enqueue_when). */
bool emu_progress() {
  std::vector<uint64_t> prio;
  int since = 0;
  for (;;) {
    if (prio.size() != streams.size() || since++ % 256 == 0) {
      prio.resize(streams.size());
      for (auto &p : prio) p = rng();
    }
    emu_stream *best = NULL;
    uint64_t bp = 0;
    bool any = false, outside = false;
    for (size_t i = 0; i < streams.size(); i++) {
      emu_stream *s = streams[i];
      if (s->q.empty()) continue;
      any = true;
      const emu_op &op = s->q.front();
      if (op.wait_for && !recorded[op.wait_for]) continue;
      if (op.ready && !op.ready()) {
        outside = true;
        continue;
      }
      if (!best || prio[i] > bp) best = s, bp = prio[i];
    }
    if (!any) return true;
    if (!best) {
      if (outside) return false;
      if (emu_error.empty()) emu_error = "emulated streams wait for events that nothing records";
      for (emu_stream *s : streams) s->q.clear();
      return true;
    }
    emu_op op = std::move(best->q.front());
    best->q.pop_front();
    if (op.record) recorded[op.record] = true;
    else if (op.fn) op.fn();
  }
}

/* Runs everything queued, waiting for other processes where work waits
 * for them (their stand-in's operations end by themselves when the
 * communicator is aborted). */
void emu_drain() {
  long nap_us = 10;
  while (!emu_progress()) {
    struct timespec ts = {0, nap_us * 1000};
    nanosleep(&ts, NULL);
    if (nap_us < 2000) nap_us *= 2;
  }
}
