// Event driver for `cargo xtask bench`: PROCS processes open+close PATH at RATE opens per second
// in total (0: as fast as they can) for SECONDS, or until MAX opens each (0: no limit); each
// process prints `opens N` (the opens it made) and `cpu_ns N` (its own user+system CPU time,
// eBPF programs run in its syscalls included), and the parent prints `seconds S`.
// With `hold`, the parent prints `ready` and waits for a line on stdin before driving, and after
// `seconds` waits for stdin to close before exiting: the bench samples the agent's CPU time
// around the flood while the agent is neither starting nor shutting down.
//   opener RATE SECONDS PATH PROCS [MAX [hold]]
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void drive(double rate, double seconds, const char *path, long max) {
    double start = now_ns(), end = start + seconds * 1e9;
    double interval = rate > 0 ? 1e9 / rate : 0;
    long opens = 0;
    for (;;) {
        if ((opens & 63) == 0) {
            double now = now_ns();
            if (now >= end) break;
            double due = start + opens * interval;
            // Ahead of the schedule: sleep off the lead (pacing stays within a 64-open batch).
            if (due > now + 50e3) {
                struct timespec pause = {0, (long)(due - now)};
                nanosleep(&pause, NULL);
            }
        }
        if (max > 0 && opens >= max) break;
        int fd = open(path, O_RDONLY);
        if (fd >= 0) close(fd);
        opens++;
    }
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    long long cpu_us = (long long)(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000 +
                       usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
    printf("opens %ld\ncpu_ns %lld\n", opens, cpu_us * 1000);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: opener RATE SECONDS PATH PROCS [MAX [hold]]\n");
        return 2;
    }
    double rate = atof(argv[1]), seconds = atof(argv[2]);
    int procs = atoi(argv[4]);
    long max = argc > 5 ? atol(argv[5]) : 0;
    int hold = argc > 6 && strcmp(argv[6], "hold") == 0;
    if (procs < 1) procs = 1;
    char line[64];
    if (hold) {
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin)) return 1;
    }
    double start = now_ns();
    for (int i = 0; i < procs; i++) {
        if (fork() == 0) {
            drive(rate / procs, seconds, argv[3], max);
            _exit(0);
        }
    }
    while (wait(NULL) > 0) {
    }
    printf("seconds %.6f\n", (now_ns() - start) / 1e9);
    fflush(stdout);
    while (hold && fgets(line, sizeof(line), stdin)) {
    }
    return 0;
}
