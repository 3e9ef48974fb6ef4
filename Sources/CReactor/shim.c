#define _GNU_SOURCE
#include "CReactor.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sched.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int creactor_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int creactor_epoll_ctl(int epfd, int op, int fd, uint32_t events, uint64_t data) {
    struct epoll_event event;
    memset(&event, 0, sizeof event);
    event.events = events;
    event.data.u64 = data;
    return epoll_ctl(epfd, op, fd, &event);
}

int creactor_epoll_wait(int epfd, creactor_event *events, int capacity, int timeout_ms) {
    struct epoll_event raw[64];
    if (capacity > 64) capacity = 64;
    int count = epoll_wait(epfd, raw, capacity, timeout_ms);
    for (int i = 0; i < count; i++) {
        events[i].events = raw[i].events;
        events[i].data = raw[i].data.u64;
    }
    return count;
}

int creactor_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int creactor_signalfd(const sigset_t *mask) { return signalfd(-1, mask, SFD_NONBLOCK | SFD_CLOEXEC); }

int creactor_signalfd_read(int fd, int32_t *sender_pid) {
    struct signalfd_siginfo info;
    for (;;) {
        ssize_t n = read(fd, &info, sizeof info);
        if (n == (ssize_t)sizeof info) {
            if (sender_pid) *sender_pid = (int32_t)info.ssi_pid;
            return (int)info.ssi_signo;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n >= 0) errno = EIO;
        return -1;
    }
}

int creactor_sigrtmin(void) { return SIGRTMIN; }
int creactor_sigrtmax(void) { return SIGRTMAX; }

void creactor_set_thread_name(const char *name) {
    char cut[16];
    strncpy(cut, name, sizeof cut - 1);
    cut[sizeof cut - 1] = 0;
    pthread_setname_np(pthread_self(), cut);
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CREACTOR_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CREACTOR_SANITIZED 1
#endif

int creactor_thread_create(pthread_t *thread, size_t stack_size, int detached, void *(*body)(void *), void *argument) {
#ifdef CREACTOR_SANITIZED
    stack_size *= 4;
#endif
    long minimum = sysconf(_SC_THREAD_STACK_MIN);
    if (minimum > 0 && stack_size < (size_t)minimum) stack_size = (size_t)minimum;
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) stack_size = (stack_size + (size_t)page - 1) / (size_t)page * (size_t)page;
    pthread_attr_t attributes;
    int status = pthread_attr_init(&attributes);
    if (status != 0) return status;
    status = pthread_attr_setstacksize(&attributes, stack_size);
    if (status == 0 && detached) status = pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    if (status == 0) status = pthread_create(thread, &attributes, body, argument);
    pthread_attr_destroy(&attributes);
    return status;
}

int32_t creactor_gettid(void) { return (int32_t)syscall(SYS_gettid); }

int creactor_current_stack(void **base, size_t *size) {
    pthread_attr_t attributes;
    int status = pthread_getattr_np(pthread_self(), &attributes);
    if (status != 0) return status;
    status = pthread_attr_getstack(&attributes, base, size);
    pthread_attr_destroy(&attributes);
    return status;
}

int creactor_configure_malloc(int arena_max, int trim_threshold, int mmap_threshold) {
#ifdef __GLIBC__
    int ok = mallopt(M_ARENA_MAX, arena_max) == 1;
    ok &= mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1;
    ok &= mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1;
    return ok;
#else
    (void)arena_max; (void)trim_threshold; (void)mmap_threshold;
    return 0;
#endif
}

// Headers older than glibc 2.24 lack it; 4 on every architecture we build for.
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

int creactor_lock_all(int on_fault) {
    return mlockall(MCL_CURRENT | MCL_FUTURE | (on_fault ? MCL_ONFAULT : 0));
}

int creactor_lock_range(void *base, size_t size) { return mlock(base, size); }

int creactor_open_pty(char *name, size_t length) {
    int fd = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return -1;
    if (grantpt(fd) != 0 || unlockpt(fd) != 0 || ptsname_r(fd, name, length) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int creactor_pin_to_current_cpu(void) {
    int cpu = sched_getcpu();
    if (cpu < 0) return -1;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof set, &set);
}

int creactor_mutex_init(pthread_mutex_t *mutex, int priority_inheritance) {
    pthread_mutexattr_t attributes;
    int status = pthread_mutexattr_init(&attributes);
    if (status != 0) return status;
    if (priority_inheritance) {
        status = pthread_mutexattr_setprotocol(&attributes, PTHREAD_PRIO_INHERIT);
        if (status != 0) {
            pthread_mutexattr_destroy(&attributes);
            return status;
        }
    }
    status = pthread_mutex_init(mutex, &attributes);
    pthread_mutexattr_destroy(&attributes);
    return status;
}

int creactor_cond_init_monotonic(pthread_cond_t *cond) {
    pthread_condattr_t attributes;
    int status = pthread_condattr_init(&attributes);
    if (status != 0) return status;
    status = pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    if (status == 0) status = pthread_cond_init(cond, &attributes);
    pthread_condattr_destroy(&attributes);
    return status;
}

int64_t creactor_monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

int creactor_cond_timedwait_relative(pthread_cond_t *cond, pthread_mutex_t *mutex, int64_t nanoseconds_from_now) {
    if (nanoseconds_from_now < 0) nanoseconds_from_now = 0;
    int64_t deadline = creactor_monotonic_ns() + nanoseconds_from_now;
    struct timespec until = { .tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000 };
    return pthread_cond_timedwait(cond, mutex, &until);
}

int creactor_accept(int listener, void *address, unsigned int *length) {
    return accept4(listener, (struct sockaddr *)address, (socklen_t *)length, SOCK_NONBLOCK | SOCK_CLOEXEC);
}
