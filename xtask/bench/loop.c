// Tight syscall loops for `cargo xtask bench`: prints the mean cost of one iteration, in wall
// time and in the process's own CPU time (user + system: what eBPF programs on its syscalls
// cost it, without the time other processes on the shared cores took from it).
//   loop open N PATH   open(PATH, O_RDONLY) + close, N times
//   loop getppid N     getppid(), N times (a syscall no credwatch hook is about)
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double cpu_ns(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e9 +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e3;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: loop open N PATH | loop getppid N\n");
        return 2;
    }
    long n = atol(argv[2]);
    double start, end, cpu_start, cpu_end;
    if (strcmp(argv[1], "open") == 0 && argc == 4) {
        const char *path = argv[3];
        cpu_start = cpu_ns();
        start = now_ns();
        for (long i = 0; i < n; i++) {
            int fd = open(path, O_RDONLY);
            if (fd < 0) {
                perror(path);
                return 1;
            }
            close(fd);
        }
        end = now_ns();
        cpu_end = cpu_ns();
    } else if (strcmp(argv[1], "getppid") == 0) {
        cpu_start = cpu_ns();
        start = now_ns();
        // The raw syscall: glibc could cache or inline nothing here, but be explicit.
        for (long i = 0; i < n; i++) syscall(SYS_getppid);
        end = now_ns();
        cpu_end = cpu_ns();
    } else {
        fprintf(stderr, "usage: loop open N PATH | loop getppid N\n");
        return 2;
    }
    printf("ns_per_op %.2f\ncpu_ns_per_op %.2f\n", (end - start) / n, (cpu_end - cpu_start) / n);
    return 0;
}
