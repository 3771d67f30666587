// The floor of credwatch's hooks for `cargo xtask bench`: loads a program that returns 0 at once
// (two instructions: r0 = 0; exit) on each hook given, holds them until SIGTERM or SIGINT.
//   floor tp:CATEGORY/NAME... raw:NAME... fexit:FUNCTION...
// Raw bpf(2) and perf_event_open(2), so that it needs neither libbpf nor bpftool.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/bpf.h>
#include <linux/btf.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int bpf(int cmd, union bpf_attr *attr) { return syscall(SYS_bpf, cmd, attr, sizeof(*attr)); }

static int load_empty_for(enum bpf_prog_type type, enum bpf_attach_type attach, uint32_t btf_id) {
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
    attr.expected_attach_type = attach;
    attr.attach_btf_id = btf_id;
    return bpf(BPF_PROG_LOAD, &attr);
}

static int load_empty(enum bpf_prog_type type) { return load_empty_for(type, 0, 0); }

// The BTF id of function `name` in the kernel's BTF (an fexit program's attach target), or 0.
static uint32_t btf_function(const char *name) {
    FILE *file = fopen("/sys/kernel/btf/vmlinux", "rb");
    if (!file) return 0;
    static char data[64 << 20];
    size_t len = fread(data, 1, sizeof(data), file);
    fclose(file);
    const struct btf_header *header = (const void *)data;
    if (len < sizeof(*header) || header->magic != BTF_MAGIC) return 0;
    const char *types = data + header->hdr_len + header->type_off;
    const char *end = types + header->type_len;
    const char *strings = data + header->hdr_len + header->str_off;
    uint32_t id = 1;
    for (const char *at = types; at + sizeof(struct btf_type) <= end; id++) {
        const struct btf_type *type = (const void *)at;
        uint32_t vlen = BTF_INFO_VLEN(type->info);
        if (BTF_INFO_KIND(type->info) == BTF_KIND_FUNC && strcmp(strings + type->name_off, name) == 0) return id;
        at += sizeof(*type);
        switch (BTF_INFO_KIND(type->info)) {
        case BTF_KIND_INT: case BTF_KIND_VAR: case 17 /* DECL_TAG */: at += 4; break;
        case BTF_KIND_ARRAY: at += sizeof(struct btf_array); break;
        case BTF_KIND_STRUCT: case BTF_KIND_UNION: at += vlen * sizeof(struct btf_member); break;
        case BTF_KIND_ENUM: at += vlen * sizeof(struct btf_enum); break;
        case BTF_KIND_FUNC_PROTO: at += vlen * sizeof(struct btf_param); break;
        case BTF_KIND_DATASEC: at += vlen * sizeof(struct btf_var_secinfo); break;
        case 19 /* ENUM64 */: at += vlen * 12; break;
        default: break; // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        }
    }
    return 0;
}

static int attach_fexit(const char *function) {
    uint32_t id = btf_function(function);
    if (id == 0) {
        errno = ENOENT;
        return -1;
    }
    int prog = load_empty_for(BPF_PROG_TYPE_TRACING, BPF_TRACE_FEXIT, id);
    if (prog < 0) return -1;
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.raw_tracepoint.prog_fd = prog;
    return bpf(BPF_RAW_TRACEPOINT_OPEN, &attr) < 0 ? -1 : 0;
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
        } else if (strncmp(argv[i], "fexit:", 6) == 0) {
            rc = attach_fexit(argv[i] + 6);
        } else {
            fprintf(stderr, "floor: bad hook %s (tp:CATEGORY/NAME, raw:NAME or fexit:FUNCTION)\n", argv[i]);
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
