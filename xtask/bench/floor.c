// The floor of credwatch's hooks for `cargo xtask bench`: loads a program that returns 0 at once
// (two instructions: r0 = 0; exit) on each hook given, holds them until SIGTERM or SIGINT.
//   floor tp:CATEGORY/NAME... raw:NAME...
// Raw bpf(2) and perf_event_open(2), so that it needs neither libbpf nor bpftool.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int bpf(int cmd, union bpf_attr *attr) { return syscall(SYS_bpf, cmd, attr, sizeof(*attr)); }

static int load_empty(enum bpf_prog_type type) {
    static const struct bpf_insn insns[] = {
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 0},
        {.code = BPF_JMP | BPF_EXIT},
    };
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.prog_type = type;
    attr.insns = (uint64_t)(uintptr_t)insns;
    attr.insn_cnt = 2;
    attr.license = (uint64_t)(uintptr_t)"GPL";
    return bpf(BPF_PROG_LOAD, &attr);
}

static int attach_tracepoint(const char *spec) {
    char path[512];
    snprintf(path, sizeof(path), "/sys/kernel/tracing/events/%s/id", spec);
    FILE *file = fopen(path, "r");
    if (!file) return -1;
    unsigned long long id = 0;
    int ok = fscanf(file, "%llu", &id) == 1;
    fclose(file);
    if (!ok) return -1;
    int prog = load_empty(BPF_PROG_TYPE_TRACEPOINT);
    if (prog < 0) return -1;
    struct perf_event_attr pe;
    memset(&pe, 0, sizeof(pe));
    pe.type = PERF_TYPE_TRACEPOINT;
    pe.size = sizeof(pe);
    pe.config = id;
    pe.sample_period = 1;
    pe.wakeup_events = 1;
    // One event suffices: a program set on a tracepoint's perf event runs on every CPU.
    int fd = syscall(SYS_perf_event_open, &pe, -1, 0, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return -1;
    if (ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog) < 0) return -1;
    return ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
}

static int attach_raw(const char *name) {
    int prog = load_empty(BPF_PROG_TYPE_RAW_TRACEPOINT);
    if (prog < 0) return -1;
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.raw_tracepoint.name = (uint64_t)(uintptr_t)name;
    attr.raw_tracepoint.prog_fd = prog;
    return bpf(BPF_RAW_TRACEPOINT_OPEN, &attr) < 0 ? -1 : 0;
}

static void on_signal(int signal) { (void)signal; }

int main(int argc, char **argv) {
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    for (int i = 1; i < argc; i++) {
        int rc;
        if (strncmp(argv[i], "tp:", 3) == 0) {
            rc = attach_tracepoint(argv[i] + 3);
        } else if (strncmp(argv[i], "raw:", 4) == 0) {
            rc = attach_raw(argv[i] + 4);
        } else {
            fprintf(stderr, "floor: bad hook %s (tp:CATEGORY/NAME or raw:NAME)\n", argv[i]);
            return 2;
        }
        if (rc < 0) {
            fprintf(stderr, "floor: attaching %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
    }
    printf("attached %d\n", argc - 1);
    fflush(stdout);
    pause();
    return 0;
}
