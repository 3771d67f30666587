// Event driver for `cargo xtask bench`: submits io_uring no-op requests at RATE per second
// (0: as fast as it can) for SECONDS, in batches of BATCH per io_uring_enter. Every request a
// marked process submits is an event of credwatch's (the io_uring_submit_req tracepoint), so
// this drives events at rates that open(2) cannot reach on a small machine: one request costs
// the kernel far less than one open. Prints `events N`, `cpu_ns N` (its own user+system CPU)
// and `seconds S`. With `hold`, it prints `ready` and waits for a line on stdin before
// driving, and waits for stdin to close before exiting (see opener.c).
//   uring RATE SECONDS BATCH [hold]
#define _GNU_SOURCE
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

struct ring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail;
    struct io_uring_sqe *sqes;
};

static int setup(struct ring *r, unsigned entries) {
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    r->fd = syscall(__NR_io_uring_setup, entries, &p);
    if (r->fd < 0) return -1;
    size_t sq_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (cq_size > sq_size) sq_size = cq_size;
    // IORING_FEAT_SINGLE_MMAP (5.4+): one mapping holds both rings.
    char *rings = mmap(NULL, sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    if (rings == MAP_FAILED) return -1;
    r->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) return -1;
    r->sq_tail = (unsigned *)(rings + p.sq_off.tail);
    r->sq_mask = (unsigned *)(rings + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(rings + p.sq_off.array);
    r->cq_head = (unsigned *)(rings + p.cq_off.head);
    r->cq_tail = (unsigned *)(rings + p.cq_off.tail);
    return 0;
}

// Queues `count` no-ops, submits them and waits for their completions.
static int submit_nops(struct ring *r, unsigned count) {
    unsigned tail = *r->sq_tail, mask = *r->sq_mask;
    for (unsigned i = 0; i < count; i++) {
        unsigned index = (tail + i) & mask;
        memset(&r->sqes[index], 0, sizeof(struct io_uring_sqe));
        r->sqes[index].opcode = IORING_OP_NOP;
        r->sq_array[index] = index;
    }
    __atomic_store_n(r->sq_tail, tail + count, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, r->fd, count, count, IORING_ENTER_GETEVENTS, NULL, 0) < 0) return -1;
    __atomic_store_n(r->cq_head, __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: uring RATE SECONDS BATCH [hold]\n");
        return 2;
    }
    double rate = atof(argv[1]), seconds = atof(argv[2]);
    unsigned batch = (unsigned)atoi(argv[3]);
    int hold = argc > 4 && strcmp(argv[4], "hold") == 0;
    if (batch < 1 || batch > 4096) {
        fprintf(stderr, "uring: BATCH must be 1..4096\n");
        return 2;
    }
    struct ring r;
    if (setup(&r, batch) != 0) {
        perror("uring: io_uring_setup");
        return 1;
    }
    char line[64];
    if (hold) {
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin)) return 1;
    }
    double start = now_ns(), end = start + seconds * 1e9;
    double interval = rate > 0 ? 1e9 / rate : 0;
    long events = 0;
    for (;;) {
        double now = now_ns();
        if (now >= end) break;
        double due = start + events * interval;
        if (due > now + 50e3) {
            struct timespec pause = {0, (long)(due - now)};
            nanosleep(&pause, NULL);
        }
        if (submit_nops(&r, batch) != 0) {
            perror("uring: io_uring_enter");
            return 1;
        }
        events += batch;
    }
    double elapsed = (now_ns() - start) / 1e9;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    long long cpu_us = (long long)(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000 +
                       usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
    printf("events %ld\ncpu_ns %lld\nseconds %.6f\n", events, cpu_us * 1000, elapsed);
    fflush(stdout);
    while (hold && fgets(line, sizeof(line), stdin)) {
    }
    return 0;
}
