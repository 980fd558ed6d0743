/* A CPU device's worker threads, in C (tiny.runtime.cpu_pool loads this file, compiled by the device's compiler).

   A kernel compiled for several threads is a C function whose last argument is its part's number. tiny_pool_run
   hands the parts out: the calling thread and the workers each take the next part not taken until none is left, and
   the call returns when all are done. Between kernels the workers spin (pause instructions) for spin_ns, so that the
   next kernel, a few microseconds later in a decode step, finds them awake; then they sleep on a condition variable
   until one comes. Python's ThreadPoolExecutor took about 20 us to hand out and collect a kernel's two parts; this
   takes about 2 (the ctypes call included) while the workers are awake, about 13 when one must be woken.

   Every argument is passed as a 64-bit integer: a kernel's arguments are pointers and ints, which the x86-64 System
   V and the AArch64 procedure call standards pass alike in a register or an 8-byte stack slot, an int in its low
   half (tiny.runtime.cpu_pool checks the platform; Apple's AArch64 packs stack arguments and is not one of them). */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ __volatile__("yield")
#else
#define RELAX() ((void)0)
#endif

#define MOST_ARGS 32 /* a kernel's buffers and ints; its part's number comes after them */

typedef int64_t arg_t;
typedef void (*kernel_t)(arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t,
                         arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t,
                         arg_t, arg_t, arg_t, arg_t, arg_t, arg_t, arg_t);

typedef struct {
  /* the kernel being run: written by tiny_pool_run before it publishes the job's number in `next` (atomics only so
     that a worker's look at a job already over is no data race: it reads them relaxed, and takes no part of it) */
  _Atomic(kernel_t) kernel;
  atomic_int n_args, parts;
  _Atomic arg_t args[MOST_ARGS];
  /* the job's number (high 32 bits) and its next part to take (low 32): a worker late for one job cannot take a
     part of the next, since taking one compares both halves */
  _Atomic uint64_t next;
  atomic_int done;    /* parts of the job finished */
  atomic_int asleep;  /* workers waiting on `wake` */
  atomic_int stop;
  int64_t spin_ns;
  pthread_mutex_t sleep_lock, run_lock; /* run_lock: one job at a time, whichever thread gives it */
  pthread_cond_t wake;
  int workers;
  pthread_t threads[];
} pool_t;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static uint32_t job_of(uint64_t next) { return (uint32_t)(next >> 32); }

/* Take and run parts of job `job` until none is left (or the pool has gone on to another job). */
static void take_parts(pool_t *p, uint32_t job) {
  arg_t a[MOST_ARGS + 1] = {0};
  for (;;) {
    uint64_t next = atomic_load(&p->next);
    uint32_t parts = (uint32_t)atomic_load_explicit(&p->parts, memory_order_relaxed);
    if (job_of(next) != job || (uint32_t)next >= parts) return;
    kernel_t kernel = atomic_load_explicit(&p->kernel, memory_order_relaxed);
    int n = atomic_load_explicit(&p->n_args, memory_order_relaxed);
    for (int i = 0; i < n; i++) a[i] = atomic_load_explicit(&p->args[i], memory_order_relaxed);
    /* taken only if the job and part are still these: then the fields read above were this job's */
    if (!atomic_compare_exchange_weak(&p->next, &next, next + 1)) continue;
    a[n] = (uint32_t)next;
    kernel(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16],
           a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31],
           a[32]);
    atomic_fetch_add(&p->done, 1);
  }
}

static int waiting(pool_t *p, uint32_t seen) { return job_of(atomic_load(&p->next)) == seen && !atomic_load(&p->stop); }

static void *worker(void *arg) {
  pool_t *p = arg;
  uint32_t seen = 0; /* (jobs count from 1: a job given before this thread first looks is still one to help with) */
  for (;;) {
    int64_t until = now_ns() + p->spin_ns;
    for (int i = 1; waiting(p, seen); i++) {
      RELAX();
      if (i % 256 == 0 && now_ns() > until) {
        /* counted as asleep before the last look at the job: tiny_pool_run publishes a job, then looks at
           `asleep`, so one of the two sees the other */
        pthread_mutex_lock(&p->sleep_lock);
        atomic_fetch_add(&p->asleep, 1);
        while (waiting(p, seen)) pthread_cond_wait(&p->wake, &p->sleep_lock);
        atomic_fetch_sub(&p->asleep, 1);
        pthread_mutex_unlock(&p->sleep_lock);
      }
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = job_of(atomic_load(&p->next));
    take_parts(p, seen);
  }
}

static void wake_all(pool_t *p) {
  pthread_mutex_lock(&p->sleep_lock);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->sleep_lock);
}

/* A pool of `workers` threads (beside the threads that give it jobs) that stay awake spin_ns between jobs; NULL if
   the threads could not be made. */
void *tiny_pool_new(int workers, int64_t spin_ns) {
  pool_t *p = calloc(1, sizeof(pool_t) + (size_t)workers * sizeof(pthread_t));
  if (p == NULL) return NULL;
  p->spin_ns = spin_ns;
  pthread_mutex_init(&p->sleep_lock, NULL);
  pthread_mutex_init(&p->run_lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  for (; p->workers < workers; p->workers++) {
    if (pthread_create(&p->threads[p->workers], NULL, worker, p) != 0) break;
  }
  return p;
}

/* Run kernel(args..., part) for every part in 0 .. parts-1, on this thread and the pool's; return when all are done. */
void tiny_pool_run(pool_t *p, void *kernel, int n_args, const arg_t *args, int parts) {
  pthread_mutex_lock(&p->run_lock);
  uint32_t job = job_of(atomic_load(&p->next)) + 1;
  atomic_store_explicit(&p->kernel, (kernel_t)kernel, memory_order_relaxed);
  atomic_store_explicit(&p->n_args, n_args, memory_order_relaxed);
  atomic_store_explicit(&p->parts, parts, memory_order_relaxed);
  for (int i = 0; i < n_args; i++) atomic_store_explicit(&p->args[i], args[i], memory_order_relaxed);
  atomic_store(&p->done, 0);
  atomic_store(&p->next, (uint64_t)job << 32);
  if (atomic_load(&p->asleep) > 0) wake_all(p);
  take_parts(p, job);
  while (atomic_load(&p->done) < parts) RELAX();
  pthread_mutex_unlock(&p->run_lock);
}

/* Run kernels one after another as tiny_pool_run runs each (a sequence TinyJit captured, replayed in one call):
   kernel i takes the next n_args[i] of `args` and runs in parts[i] parts, or, of one part, on this thread alone and
   without a part's number. */
void tiny_pool_batch(pool_t *p, int n, void *const *kernels, const int *n_args, const int *parts, const arg_t *args) {
  arg_t a[MOST_ARGS + 1] = {0};
  for (int i = 0; i < n; args += n_args[i], i++) {
    if (parts[i] > 1) {
      tiny_pool_run(p, kernels[i], n_args[i], args, parts[i]);
      continue;
    }
    for (int j = 0; j < n_args[i]; j++) a[j] = args[j];
    ((kernel_t)kernels[i])(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14],
                           a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27],
                           a[28], a[29], a[30], a[31], a[32]);
  }
}

/* The workers end (at the process's exit); a job given after runs on the thread that gives it. */
void tiny_pool_stop(pool_t *p) {
  atomic_store(&p->stop, 1);
  wake_all(p);
}

int tiny_pool_most_args(void) { return MOST_ARGS; }

int tiny_pool_workers(pool_t *p) { return p->workers; }
