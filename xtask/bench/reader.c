// Alert driver for `cargo xtask bench` (outputs): opens DIR/000000 to DIR/<N-1> once each, as fast
// as it can, each a distinct credential file (one alert each), then prints `opens N` and
// `seconds S`. With `hold`, it prints `ready` and waits for a line on stdin before opening, and
// after the opens waits for stdin to close before exiting: the bench samples the agent's CPU
// around the alerts and keeps the agent up until the receiver has them all.
//   reader DIR N [hold]
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: reader DIR N [hold]\n");
        return 2;
    }
    long n = atol(argv[2]);
    int hold = argc > 3 && strcmp(argv[3], "hold") == 0;
    char line[64], path[4096];
    if (hold) {
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin)) return 1;
    }
    double start = now_s();
    long opens = 0;
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%06ld", argv[1], i);
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            close(fd);
            opens++;
        }
    }
    printf("opens %ld\nseconds %.6f\n", opens, now_s() - start);
    fflush(stdout);
    while (hold && fgets(line, sizeof(line), stdin)) {
    }
    return 0;
}
