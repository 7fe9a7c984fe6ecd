/* avx2_view.c: an LD_PRELOAD shim that shows the process an AVX2-only x86-64 CPU (no AVX-512, no VNNI of any
 * kind, no AMX) on a CPU that has them, so that ONNX Runtime's MLAS (and PyTorch) pick the kernels an AVX2-only
 * CPU (e.g. an AMD EPYC before Zen 4) runs: how the int8 encoder behaves and what it costs there,
 * measured on a machine that has VNNI.
 *
 * How: Linux's CPUID faulting (arch_prctl(ARCH_SET_CPUID, 0); needs the `cpuid_fault` flag in /proc/cpuinfo)
 * makes every CPUID instruction of the process (and of the threads it starts) raise SIGSEGV; the handler runs the
 * real CPUID with faulting briefly off, clears the feature bits below and steps over the instruction. What is not
 * hidden: XGETBV (the OS still enables the ZMM state; programs check CPUID's AVX512F bit first) and code that
 * tests features before this library loads (glibc's own string functions). The kernels run at this CPU's speed:
 * an AVX2 kernel here is not an AMD core's AVX2 kernel, so ratios transfer better than rates.
 *
 *   gcc -O2 -shared -fPIC -o /tmp/avx2_view.so benchmarks/avx2_view.c
 *   LD_PRELOAD=/tmp/avx2_view.so python -c "import torch; print(torch.backends.cpu.get_cpu_capability())"  # AVX2
 *   AVX2_VIEW_HIDE=amx LD_PRELOAD=...: only AMX hidden (AVX-512 VNNI kept)
 * benchmarks/bench_int8_isa.py builds and uses it.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static struct sigaction previous;

static long cpuid_faulting(int on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on ? 0 : 1); }

static int amx_only;  /* AVX2_VIEW_HIDE=amx: hide AMX alone (AVX-512 VNNI stays): the AVX-512 VNNI path here */

static void mask(uint32_t leaf, uint32_t sub, uint32_t *a, uint32_t *b, uint32_t *c, uint32_t *d) {
    if (amx_only) {
        if (leaf == 7 && sub == 0) *d &= ~((1u << 22) | (1u << 24) | (1u << 25));
        if (leaf == 7 && sub == 1) *a &= ~(1u << 21);
        if (leaf == 0x1d || leaf == 0x1e) *a = *b = *c = *d = 0;
        return;
    }
    if (leaf == 7 && sub == 0) {
        /* EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31 */
        *b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
        /* ECX: VBMI 1, VBMI2 6, AVX512_VNNI 11, BITALG 12, VPOPCNTDQ 14 */
        *c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
        /* EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, AVX512_FP16 23, AMX-TILE 24, AMX-INT8 25 */
        *d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
    } else if (leaf == 7 && sub == 1) {
        /* EAX: AVX-VNNI 4, AVX512_BF16 5, AMX-FP16 21, AVX-IFMA 23; EDX: AVX-VNNI-INT8 4, AVX-NE-CONVERT 5,
         * AVX-VNNI-INT16 10, AVX10 19 */
        *a &= ~((1u << 4) | (1u << 5) | (1u << 21) | (1u << 23));
        *d &= ~((1u << 4) | (1u << 5) | (1u << 10) | (1u << 19));
    } else if (leaf == 0x1d || leaf == 0x1e || leaf == 0x24) {  /* AMX tiles, TMUL, AVX10 */
        *a = *b = *c = *d = 0;
    }
}

static void on_segv(int sig, siginfo_t *info, void *ctx) {
    ucontext_t *uc = (ucontext_t *)ctx;
    greg_t *r = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    if (ip[0] == 0x0f && ip[1] == 0xa2) {
        uint32_t a = (uint32_t)r[REG_RAX], c = (uint32_t)r[REG_RCX], b, d;
        uint32_t leaf = a, sub = c;
        cpuid_faulting(0);
        __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
        cpuid_faulting(1);
        mask(leaf, sub, &a, &b, &c, &d);
        r[REG_RAX] = a; r[REG_RBX] = b; r[REG_RCX] = c; r[REG_RDX] = d;
        r[REG_RIP] += 2;
        return;
    }
    /* not ours: the handler that was there before, or the default action */
    sigaction(SIGSEGV, &previous, NULL);
    (void)sig; (void)info;
}

__attribute__((constructor)) static void avx2_view_init(void) {
    const char *hide = getenv("AVX2_VIEW_HIDE");
    amx_only = hide != NULL && strcmp(hide, "amx") == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous);
    if (cpuid_faulting(1) != 0) {
        fprintf(stderr, "avx2_view: CPUID faulting is not available here (no cpuid_fault): nothing hidden\n");
        sigaction(SIGSEGV, &previous, NULL);
        if (getenv("AVX2_VIEW_REQUIRED")) _exit(3);
    }
}
