// The few Linux interfaces the reactor needs that Swift's Glibc module does
// not export (they sit behind _GNU_SOURCE or are macros): epoll, eventfd,
// signalfd, named threads, monotonic condition variables and
// priority-inheriting mutexes. Thin wrappers only; no policy lives here.
#ifndef CREACTOR_H
#define CREACTOR_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/// One epoll event, unpacked (struct epoll_event is packed on x86_64).
typedef struct {
    uint32_t events;
    uint64_t data;
} creactor_event;

enum {
    CREACTOR_EPOLLIN = 0x001,
    CREACTOR_EPOLLOUT = 0x004,
    CREACTOR_EPOLLERR = 0x008,
    CREACTOR_EPOLLHUP = 0x010,
    CREACTOR_EPOLLRDHUP = 0x2000,
};

int creactor_epoll_create(void);
/// op: 1 add, 2 delete, 3 modify (EPOLL_CTL_*).
int creactor_epoll_ctl(int epfd, int op, int fd, uint32_t events, uint64_t data);
int creactor_epoll_wait(int epfd, creactor_event *events, int capacity, int timeout_ms);

/// A non-blocking, close-on-exec eventfd.
int creactor_eventfd(void);

/// A non-blocking, close-on-exec signalfd for `mask` (blocked by the caller).
int creactor_signalfd(const sigset_t *mask);
/// Reads one signalfd record; returns the signal number, 0 when none is
/// pending, -1 on error (errno set).
int creactor_signalfd_read(int fd, int32_t *sender_pid);

int creactor_sigrtmin(void);
int creactor_sigrtmax(void);

/// pthread_create with an explicit stack size (raised to PTHREAD_STACK_MIN
/// and to whole pages; four times larger under a sanitizer) and, when
/// `detached`, PTHREAD_CREATE_DETACHED. 0 or the pthread error.
int creactor_thread_create(pthread_t *thread, size_t stack_size, int detached, void *(*body)(void *), void *argument);
/// The calling thread's kernel id (gettid(2); glibc before 2.30 has no
/// wrapper).
int32_t creactor_gettid(void);
/// The calling thread's stack (pthread_getattr_np): its lowest address and
/// size. 0 or the pthread error.
int creactor_current_stack(void **base, size_t *size);

/// glibc malloc's settings (mallopt): at most `arena_max` arenas, the top of
/// the heap given back past `trim_threshold` bytes, blocks from
/// `mmap_threshold` bytes in mappings of their own (fixed values also stop
/// glibc raising either threshold on its own). Returns 1 when every setting
/// took, 0 when one did not or the C library has no mallopt (musl).
int creactor_configure_malloc(int arena_max, int trim_threshold, int mmap_threshold);
/// mlockall(MCL_CURRENT | MCL_FUTURE), with MCL_ONFAULT when `on_fault`
/// (Linux 4.4+): pages are locked as they are first touched instead of all
/// being read in now. 0 or -1 (errno).
int creactor_lock_all(int on_fault);
/// mlock(2) of [base, base + size): every page made resident now and kept.
int creactor_lock_range(void *base, size_t size);

/// pthread_setname_np for the calling thread (names are cut to 15 bytes).
void creactor_set_thread_name(const char *name);

/// A pseudo-terminal master (posix_openpt, grantpt, unlockpt), close-on-exec,
/// and its slave's path in `name`. The master descriptor, or -1 (errno).
int creactor_open_pty(char *name, size_t length);

/// Pins the calling thread to the CPU it runs on now (sched_getcpu,
/// sched_setaffinity); threads it creates inherit that. 0 or -1 (errno).
/// For tests that need threads to compete for one CPU.
int creactor_pin_to_current_cpu(void);

/// A mutex, optionally with priority inheritance (PTHREAD_PRIO_INHERIT): a
/// lower-priority holder runs at the waiter's priority until it unlocks.
int creactor_mutex_init(pthread_mutex_t *mutex, int priority_inheritance);
/// A condition variable timed against CLOCK_MONOTONIC, so a wall-clock step
/// (NTP on a board without an RTC) never stretches or cuts a wait.
int creactor_cond_init_monotonic(pthread_cond_t *cond);
/// Waits until CLOCK_MONOTONIC reaches `nanoseconds_from_now` later; 0 or
/// ETIMEDOUT.
int creactor_cond_timedwait_relative(pthread_cond_t *cond, pthread_mutex_t *mutex, int64_t nanoseconds_from_now);

/// accept4(2) with SOCK_NONBLOCK | SOCK_CLOEXEC: the descriptor is never
/// visible to a fork/exec without close-on-exec.
int creactor_accept(int listener, void *address, unsigned int *length);

/// CLOCK_MONOTONIC in nanoseconds.
int64_t creactor_monotonic_ns(void);

#endif
