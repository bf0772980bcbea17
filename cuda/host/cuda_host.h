// The CUDA device model on the host: what cuda/*.cu use, so that the same sources build with the
// system C++ compiler and compute on the CPU (`--backend cuda-emu`). Every thread of a block is a
// fiber of its own with its own stack, so barriers really wait and warps really exchange:
//
// - A block's threads run one after another on one OS thread, each until it blocks at a barrier, a
//   warp collective or its end; blocks run one after another. `emu_set_schedule` runs the threads
//   of a block in reverse or shuffled order, so a missing barrier shows up as a wrong answer.
// - `__syncthreads` waits for every thread of the block at the same barrier (same source line); a
//   thread that returned, or waits elsewhere, while others wait is reported, never a hang.
// - Warp collectives (shuffles, votes, __syncwarp, the wmma *_sync calls) complete when every lane
//   named in the mask has arrived at the same call; the last lane to arrive computes the results.
// - `__shared__` is a static (thread_local) variable: one instance for the block that runs. The
//   dynamic `extern __shared__` buffer is defined by the build's generated appendix, poisoned with
//   NaN bytes before each block.
// - `__half` is IEEE binary16 with round-to-nearest-even (_Float16); wmma computes what the tensor
//   cores compute: f16 inputs, exact products, f32 accumulation.
//
// Nothing here changes a kernel's arithmetic or indexing: sources are built unchanged.
#pragma once

#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
extern "C" void __sanitizer_start_switch_fiber(void ** fake_stack_save, const void * bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void * fake_stack_save, const void ** bottom_old, size_t * size_old);
extern "C" void __asan_unpoison_memory_region(void const volatile * addr, size_t size);
#endif
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
#include <ucontext.h>
#define EMU_USE_UCONTEXT 1
#endif

// ---- CUDA's qualifiers and built-in types ---------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ thread_local
#define __constant__ static

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct float2 { float x, y; };

namespace emu {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;
constexpr size_t kMaxDynamicShared = 232448;  // sm_90's opt-in limit per block (227 KiB)

enum class State : uint8_t { Ready, Block, Warp, Done };
enum class Op : uint8_t { None, Sync, SyncOr, SyncAnd, SyncCount, ShflIdx, ShflXor, ShflUp, ShflDown, Ballot, Any, All,
                          SyncWarp, Wmma };

inline const char * op_name(Op op) {
    static const char * names[] = {"?", "__syncthreads", "__syncthreads_or", "__syncthreads_and", "__syncthreads_count",
                                   "__shfl_sync", "__shfl_xor_sync", "__shfl_up_sync", "__shfl_down_sync",
                                   "__ballot_sync", "__any_sync", "__all_sync", "__syncwarp", "a wmma *_sync call"};
    return names[static_cast<int>(op)];
}

struct Thread {
    void * sp = nullptr;  // saved stack pointer (custom switch)
#ifdef EMU_USE_UCONTEXT
    ucontext_t uc;
#endif
    char * stack = nullptr;
    size_t stack_size = 0;
    uint3 idx{0, 0, 0};
    int linear = 0;
    int order_pos = 0;  // place in the block's run order
    State state = State::Ready;
    // the barrier or collective it waits at
    Op op = Op::None;
    const char * file = "";
    int line = 0;
    unsigned mask = 0;
    int arg = 0, width = 0;
    uint64_t value = 0, result = 0;
    const void * wmma_args[4] = {nullptr, nullptr, nullptr, nullptr};  // mma_sync's d, a, b, c
};

struct Launch {
    void (*entry)(void **) = nullptr;
    void ** args = nullptr;
    int n_threads = 0;
    int order = 0;  // 0 forward, 1 reverse, 2 shuffled
    uint64_t seed = 0;
    size_t dynamic_shared_bytes = 0;
    char error[1024] = {0};
    sigjmp_buf escape;
    volatile sig_atomic_t running = 0;
};

inline Thread g_threads[kMaxThreads];
inline int g_run_order[kMaxThreads];
inline Thread * g_current = nullptr;
inline void * g_scheduler_sp = nullptr;
#ifdef EMU_USE_UCONTEXT
inline ucontext_t g_scheduler_uc;
#endif
inline Launch g_launch;
inline dim3 g_block_dim, g_grid_dim;
inline uint3 g_block_idx;
inline int g_block_arrived = 0;
inline int g_schedule_order = 0;
inline uint64_t g_schedule_seed = 0;
inline size_t g_stack_size = 0;
// fills the `extern __shared__` arrays (defined by the build's generated appendix) with 0xff bytes
inline void (*g_poison_dynamic_shared)(size_t bytes) = nullptr;
#ifdef EMU_ASAN
inline void * g_fake_stack = nullptr;
inline const void * g_main_stack_bottom = nullptr;
inline size_t g_main_stack_size = 0;
#endif

// ---- errors: the first one stops the launch -----------------------------------------------------

inline bool g_on_fiber = false;

[[noreturn]] inline void escape(int code) {
#ifdef EMU_ASAN
    if (g_on_fiber) __sanitizer_start_switch_fiber(nullptr, g_main_stack_bottom, g_main_stack_size);
#endif
    siglongjmp(g_launch.escape, code);
}

template <typename... A>
[[noreturn]] void fail(const char * fmt, A... args) {
    if (!g_launch.error[0]) {
        char what[768];
        snprintf(what, sizeof what, fmt, args...);
        snprintf(g_launch.error, sizeof g_launch.error, "block (%u, %u, %u): %s", g_block_idx.x, g_block_idx.y,
                 g_block_idx.z, what);
    }
    escape(1);
}

// ---- fibers -----------------------------------------------------------------------------------------

#ifndef EMU_USE_UCONTEXT
extern "C" void emu_switch_context(void ** save_sp, void * new_sp) __attribute__((visibility("hidden")));
asm(R"(
    .text
    .globl emu_switch_context
    .hidden emu_switch_context
    .type emu_switch_context, @function
emu_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_context, .-emu_switch_context
)");
#endif

// The next runnable thread after `after` in the block's run order, or null.
inline Thread * next_ready(const Thread * after) {
    const int n = g_launch.n_threads;
    for (int k = 1; k <= n; ++k) {
        Thread * t = &g_threads[g_run_order[(after->order_pos + k) % n]];
        if (t->state == State::Ready) return t;
    }
    return nullptr;
}

// The current thread blocks (or has returned): the next runnable thread goes on, straight from this
// fiber to its own; the scheduler gets control back only when no thread of the block can run.
inline void yield_thread() {
    Thread * me = g_current;
    Thread * next = next_ready(me);
#ifdef EMU_ASAN
    void * fake = nullptr;
    __sanitizer_start_switch_fiber(me->state == State::Done ? nullptr : &fake, next ? next->stack : g_main_stack_bottom,
                                   next ? next->stack_size : g_main_stack_size);
#endif
    g_current = next;
#ifdef EMU_USE_UCONTEXT
    swapcontext(&me->uc, next ? &next->uc : &g_scheduler_uc);
#else
    emu_switch_context(&me->sp, next ? next->sp : g_scheduler_sp);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

inline void to_thread(Thread * t) {  // from the scheduler
    g_current = t;
    g_on_fiber = true;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&g_fake_stack, t->stack, t->stack_size);
#endif
#ifdef EMU_USE_UCONTEXT
    swapcontext(&g_scheduler_uc, &t->uc);
#else
    emu_switch_context(&g_scheduler_sp, t->sp);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(g_fake_stack, nullptr, nullptr);
#endif
    g_on_fiber = false;
}

inline void thread_main() {
#ifdef EMU_ASAN
    const void * bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
    if (!g_main_stack_bottom) g_main_stack_bottom = bottom, g_main_stack_size = size;  // the first switch is the scheduler's
#endif
    g_launch.entry(g_launch.args);
    g_current->state = State::Done;
    yield_thread();
    __builtin_trap();  // a finished thread is never resumed
}

inline void thread_start(Thread * t) {
#ifdef EMU_ASAN
    __asan_unpoison_memory_region(t->stack, t->stack_size);  // frames of the stack's last thread never returned
#endif
#ifdef EMU_USE_UCONTEXT
    getcontext(&t->uc);
    t->uc.uc_stack.ss_sp = t->stack;
    t->uc.uc_stack.ss_size = t->stack_size;
    t->uc.uc_link = nullptr;
    makecontext(&t->uc, thread_main, 0);
#else
    // the first switch pops six registers, then returns into thread_main with the stack aligned as a call's
    uintptr_t top = (reinterpret_cast<uintptr_t>(t->stack) + t->stack_size) & ~uintptr_t(15);
    void ** slot = reinterpret_cast<void **>(top - 16);
    *slot = reinterpret_cast<void *>(&thread_main);
    for (int i = 1; i <= 6; ++i) slot[-i] = nullptr;
    t->sp = slot - 6;
#endif
}

inline bool ensure_stacks(int n) {
#ifdef EMU_ASAN
    const size_t size = 1 << 20;
#else
    const size_t size = 256 << 10;
#endif
    if (g_stack_size != size) {
        for (Thread & t : g_threads) {
            if (t.stack) munmap(t.stack - 4096, t.stack_size + 4096);
            t.stack = nullptr;
        }
        g_stack_size = size;
    }
    for (int i = 0; i < n; ++i) {
        Thread & t = g_threads[i];
        if (t.stack) continue;
        void * p = mmap(nullptr, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        mprotect(p, 4096, PROT_NONE);  // a guard page below each stack
        t.stack = static_cast<char *>(p) + 4096;
        t.stack_size = size;
    }
    return true;
}

// ---- the built-in variables ---------------------------------------------------------------------

inline const uint3 & thread_idx() { return g_current->idx; }

}  // namespace emu

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::g_block_idx)
#define blockDim (emu::g_block_dim)
#define gridDim (emu::g_grid_dim)
#define warpSize 32

namespace emu {

// ---- block barriers -------------------------------------------------------------------------------

inline int lane_of(const Thread * t) { return t->linear % kWarp; }

inline int sync_block(Op op, int predicate, const char * file, int line) {
    Thread * me = g_current;
    me->op = op;
    me->file = file;
    me->line = line;
    me->value = predicate != 0;
    me->state = State::Block;
    if (++g_block_arrived < g_launch.n_threads) {
        yield_thread();
        return static_cast<int>(me->result);
    }
    // the last thread to arrive: every thread waits at this barrier, with the same kind
    uint64_t count = 0;
    for (int i = 0; i < g_launch.n_threads; ++i) {
        Thread & t = g_threads[i];
        if (t.op != op || t.line != line || strcmp(t.file, file) != 0)
            fail("threads wait at different barriers: thread %d at %s (%s:%d), thread %d at %s (%s:%d)", t.linear,
                 op_name(t.op), t.file, t.line, me->linear, op_name(op), file, line);
        count += t.value;
    }
    uint64_t result = 0;
    if (op == Op::SyncOr) result = count != 0;
    if (op == Op::SyncAnd) result = count == static_cast<uint64_t>(g_launch.n_threads);
    if (op == Op::SyncCount) result = count;
    for (int i = 0; i < g_launch.n_threads; ++i) {
        g_threads[i].result = result;
        g_threads[i].state = State::Ready;
        g_threads[i].op = Op::None;
    }
    g_block_arrived = 0;
    return static_cast<int>(result);
}

// ---- warp collectives --------------------------------------------------------------------------------

// Waits until every lane of `mask` has arrived at this call; the last one to arrive runs `complete`
// over the warp's threads (indexed by lane), which fills each lane's `result`.
template <typename Complete>
inline uint64_t warp_collective(Op op, unsigned mask, const char * file, int line, Complete complete) {
    Thread * me = g_current;
    const int lane = lane_of(me), base = me->linear - lane;
    const int lanes_here = std::min(kWarp, g_launch.n_threads - base);
    if (!(mask >> lane & 1u)) fail("lane %d calls %s (%s:%d) with a mask 0x%08x that leaves it out", lane, op_name(op),
                                   file, line, mask);
    if (lanes_here < kWarp && (mask >> lanes_here) != 0)
        fail("%s (%s:%d) names lanes past the end of warp %d (mask 0x%08x, block of %d threads)", op_name(op), file,
             line, me->linear / kWarp, mask, g_launch.n_threads);
    me->op = op;
    me->file = file;
    me->line = line;
    me->mask = mask;
    me->state = State::Warp;
    Thread * lanes[kWarp] = {};
    for (int l = 0; l < lanes_here; ++l) lanes[l] = &g_threads[base + l];
    for (int l = 0; l < lanes_here; ++l) {
        if (!(mask >> l & 1u)) continue;
        const Thread * t = lanes[l];
        if (t->state != State::Warp) {
            if (t->state == State::Done)
                fail("lane %d of warp %d calls %s (%s:%d) but lane %d, named in its mask, has returned", lane,
                     me->linear / kWarp, op_name(op), file, line, l);
            yield_thread();  // not everyone is here yet: the last lane completes the collective
            return me->result;
        }
    }
    for (int l = 0; l < lanes_here; ++l) {
        if (!(mask >> l & 1u)) continue;
        const Thread * t = lanes[l];
        if (t->op != op || t->line != line || t->mask != mask || strcmp(t->file, file) != 0)
            fail("lanes of warp %d diverge: lane %d at %s (%s:%d, mask 0x%08x), lane %d at %s (%s:%d, mask 0x%08x)",
                 me->linear / kWarp, l, op_name(t->op), t->file, t->line, t->mask, lane, op_name(op), file, line, mask);
    }
    complete(lanes, mask);
    for (int l = 0; l < lanes_here; ++l) {
        if (!(mask >> l & 1u)) continue;
        lanes[l]->state = State::Ready;
        lanes[l]->op = Op::None;
    }
    return me->result;
}

template <typename T>
inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value fits 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}

template <typename T>
inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}

template <typename T>
inline T shuffle(Op op, unsigned mask, T v, int arg, int width, const char * file, int line) {
    if (width < 1 || width > kWarp || (width & (width - 1)))
        fail("%s (%s:%d): width %d is not a power of two up to 32", op_name(op), file, line, width);
    g_current->value = bits_of(v);
    g_current->arg = arg;
    g_current->width = width;
    const uint64_t r = warp_collective(op, mask, file, line, [op, file, line](Thread ** lanes, unsigned m) {
        for (int l = 0; l < kWarp; ++l) {
            if (!(m >> l & 1u)) continue;
            Thread * t = lanes[l];
            const int w = t->width, seg = l & ~(w - 1), in = l - seg;
            int src = l;
            if (op == Op::ShflIdx) src = seg + (t->arg & (w - 1));
            else if (op == Op::ShflXor) src = seg + ((in ^ t->arg) & (w - 1)) ;
            else if (op == Op::ShflUp) src = in - t->arg >= 0 ? l - t->arg : l;
            else if (op == Op::ShflDown) src = in + t->arg < w ? l + t->arg : l;
            if (op == Op::ShflXor && (in ^ t->arg) >= w) src = l;  // outside the segment: its own value
            if (!(m >> src & 1u))
                fail("%s (%s:%d): lane %d reads lane %d, which the mask 0x%08x leaves out", op_name(op), file, line, l,
                     src, m);
            t->result = lanes[src]->value;
        }
    });
    return from_bits<T>(r);
}

inline unsigned vote(Op op, unsigned mask, int predicate, const char * file, int line) {
    g_current->value = predicate != 0;
    return static_cast<unsigned>(warp_collective(op, mask, file, line, [op](Thread ** lanes, unsigned m) {
        unsigned ballot = 0;
        for (int l = 0; l < kWarp; ++l)
            if ((m >> l & 1u) && lanes[l]->value) ballot |= 1u << l;
        const uint64_t r = op == Op::Ballot ? ballot : op == Op::Any ? ballot != 0 : op == Op::All ? ballot == m : 0;
        for (int l = 0; l < kWarp; ++l)
            if (m >> l & 1u) lanes[l]->result = r;
    }));
}

}  // namespace emu

#define __syncthreads() ((void) emu::sync_block(emu::Op::Sync, 0, __FILE__, __LINE__))
#define __syncthreads_or(p) emu::sync_block(emu::Op::SyncOr, (p), __FILE__, __LINE__)
#define __syncthreads_and(p) emu::sync_block(emu::Op::SyncAnd, (p), __FILE__, __LINE__)
#define __syncthreads_count(p) emu::sync_block(emu::Op::SyncCount, (p), __FILE__, __LINE__)
#define __syncwarp(...) emu::syncwarp_at(__FILE__, __LINE__ __VA_OPT__(,) __VA_ARGS__)
#define __shfl_sync(m, v, src, ...) emu::shuffle(emu::Op::ShflIdx, (m), (v), (src), emu::width_or_warp(__VA_ARGS__), __FILE__, __LINE__)
#define __shfl_xor_sync(m, v, x, ...) emu::shuffle(emu::Op::ShflXor, (m), (v), (x), emu::width_or_warp(__VA_ARGS__), __FILE__, __LINE__)
#define __shfl_up_sync(m, v, d, ...) emu::shuffle(emu::Op::ShflUp, (m), (v), (int) (d), emu::width_or_warp(__VA_ARGS__), __FILE__, __LINE__)
#define __shfl_down_sync(m, v, d, ...) emu::shuffle(emu::Op::ShflDown, (m), (v), (int) (d), emu::width_or_warp(__VA_ARGS__), __FILE__, __LINE__)
#define __ballot_sync(m, p) emu::vote(emu::Op::Ballot, (m), (p), __FILE__, __LINE__)
#define __any_sync(m, p) ((int) emu::vote(emu::Op::Any, (m), (p), __FILE__, __LINE__))
#define __all_sync(m, p) ((int) emu::vote(emu::Op::All, (m), (p), __FILE__, __LINE__))

namespace emu {
inline int width_or_warp(int w = kWarp) { return w; }
inline void syncwarp_at(const char * file, int line, unsigned mask = 0xffffffffu) {
    warp_collective(Op::SyncWarp, mask, file, line, [](Thread **, unsigned) {});
}
}  // namespace emu

// ---- atomics: a thread runs alone between its barriers, so each is one uninterrupted step ----------

#define EMU_ATOMIC_RMW(name, expr)                                                                          \
    template <typename T, typename U>                                                                       \
    inline T name(T * p, U v_) {                                                                            \
        const T v = static_cast<T>(v_);                                                                     \
        const T old = *p;                                                                                   \
        *p = (expr);                                                                                        \
        return old;                                                                                         \
    }
EMU_ATOMIC_RMW(atomicAdd, old + v)
EMU_ATOMIC_RMW(atomicSub, old - v)
EMU_ATOMIC_RMW(atomicExch, v)
EMU_ATOMIC_RMW(atomicMin, v < old ? v : old)
EMU_ATOMIC_RMW(atomicMax, v > old ? v : old)
EMU_ATOMIC_RMW(atomicAnd, old & v)
EMU_ATOMIC_RMW(atomicOr, old | v)
EMU_ATOMIC_RMW(atomicXor, old ^ v)
#undef EMU_ATOMIC_RMW
inline unsigned atomicInc(unsigned * p, unsigned v) {
    const unsigned old = *p;
    *p = old >= v ? 0 : old + 1;
    return old;
}
inline unsigned atomicDec(unsigned * p, unsigned v) {
    const unsigned old = *p;
    *p = (old == 0 || old > v) ? v : old - 1;
    return old;
}
template <typename T>
inline T atomicCAS(T * p, T compare, T v) {
    const T old = *p;
    if (old == compare) *p = v;
    return old;
}
inline void __threadfence() {}
inline void __threadfence_block() {}
template <typename T>
inline T __ldg(const T * p) { return *p; }

// ---- integer and float intrinsics ---------------------------------------------------------------------

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float x) { return 1.0f / x; }
// CUDA's min and max overloads for the integer types (float ones come from math.h as fminf/fmaxf)
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

// ---- __half: IEEE binary16 --------------------------------------------------------------------------

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) { _Float16 h = static_cast<_Float16>(f); memcpy(&__x, &h, 2); }
    __half(double f) : __half(static_cast<float>(f)) {}
    __half(int i) : __half(static_cast<float>(i)) {}
    operator float() const { _Float16 h; memcpy(&h, &__x, 2); return static_cast<float>(h); }
};
struct __half2 { __half x, y; };
struct __half_raw { unsigned short x; };

inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half_rz(float f) {
    __half h(f);
    if (fabsf(static_cast<float>(h)) > fabsf(f) && isfinite(f)) h.__x -= 1;  // one step toward zero
    return h;
}
inline __half __int2half_rn(int i) { return __half(static_cast<float>(i)); }
inline int __half2int_rz(__half h) { return static_cast<int>(static_cast<float>(h)); }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __hadd(__half a, __half b) { return __half(static_cast<float>(a) + static_cast<float>(b)); }
inline __half __hsub(__half a, __half b) { return __half(static_cast<float>(a) - static_cast<float>(b)); }
inline __half __hmul(__half a, __half b) { return __half(static_cast<float>(a) * static_cast<float>(b)); }
inline __half __hdiv(__half a, __half b) { return __half(static_cast<float>(a) / static_cast<float>(b)); }
inline __half __hfma(__half a, __half b, __half c) {
    return __half(static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c)));
}
inline __half __hneg(__half a) { a.__x ^= 0x8000u; return a; }
inline __half __habs(__half a) { a.__x &= 0x7fffu; return a; }
inline __half __hmax(__half a, __half b) { return static_cast<float>(a) >= static_cast<float>(b) ? a : b; }
inline __half __hmin(__half a, __half b) { return static_cast<float>(a) <= static_cast<float>(b) ? a : b; }
inline bool __hlt(__half a, __half b) { return static_cast<float>(a) < static_cast<float>(b); }
inline bool __hgt(__half a, __half b) { return static_cast<float>(a) > static_cast<float>(b); }
inline bool __hle(__half a, __half b) { return static_cast<float>(a) <= static_cast<float>(b); }
inline bool __hge(__half a, __half b) { return static_cast<float>(a) >= static_cast<float>(b); }
inline bool __heq(__half a, __half b) { return static_cast<float>(a) == static_cast<float>(b); }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline bool __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return {__half(a), __half(a)}; }
inline float __low2float(__half2 h) { return static_cast<float>(h.x); }
inline float __high2float(__half2 h) { return static_cast<float>(h.y); }
inline float2 __half22float2(__half2 h) { return {static_cast<float>(h.x), static_cast<float>(h.y)}; }
inline __half2 __hadd2(__half2 a, __half2 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }
inline __half operator+(__half a, __half b) { return __hadd(a, b); }
inline __half operator-(__half a, __half b) { return __hsub(a, b); }
inline __half operator*(__half a, __half b) { return __hmul(a, b); }
inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
inline __half operator-(__half a) { return __hneg(a); }

// ---- nvcuda::wmma: warp-wide matrix fragments ----------------------------------------------------------
//
// A fragment's M x N (or M x K, K x N) elements are spread over the 32 lanes: lane l holds elements
// l, l + 32, ... of the row-major matrix. load/store/mma are warp collectives; mma's products of f16
// values are exact in f32 and accumulate in f32, in k order.

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K>
struct shape_of;
template <int M, int N, int K> struct shape_of<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct shape_of<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct shape_of<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert((M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) || (M == 8 && N == 32 && K == 16),
                  "wmma shapes for f16: 16x16x16, 32x8x16, 8x32x16");
    static constexpr int rows = shape_of<Use, M, N, K>::rows, cols = shape_of<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols / emu::kWarp;
    using element_type = T;
    T x[num_elements];
};

template <typename F, typename V>
inline void fill_fragment(F & f, const V & v) {
    for (int i = 0; i < F::num_elements; ++i) f.x[i] = static_cast<typename F::element_type>(v);
}

template <typename T>
inline void check_matrix_pointer(const T * p, unsigned ldm, const char * what) {
    if (reinterpret_cast<uintptr_t>(p) % 32)
        emu::fail("%s: pointer %p is not 256-bit aligned", what, static_cast<const void *>(p));
    if ((ldm * sizeof(T)) % 16)
        emu::fail("%s: ldm %u is not a multiple of %d elements", what, ldm, static_cast<int>(16 / sizeof(T)));
}

// element e of a fragment: lane e % 32, slot e / 32; row-major position (e / cols, e % cols)
template <typename F, typename T>
inline void load_lane(F & f, const T * p, unsigned ldm, bool row_major_memory) {
    const int lane = emu::lane_of(emu::g_current);
    for (int i = 0; i < F::num_elements; ++i) {
        const int e = i * emu::kWarp + lane, r = e / F::cols, c = e % F::cols;
        f.x[i] = p[row_major_memory ? (size_t) r * ldm + c : (size_t) c * ldm + r];
    }
}

inline void wmma_sync_point(const char * what) {
    emu::warp_collective(emu::Op::Wmma, 0xffffffffu, what, 0, [](emu::Thread **, unsigned) {});
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout> & f, const T * p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load names its memory layout");
    check_matrix_pointer(p, ldm, "wmma::load_matrix_sync");
    wmma_sync_point("wmma::load_matrix_sync");
    load_lane(f, p, ldm, std::is_same<Layout, row_major>::value);
}

template <int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T> & f, const T * p, unsigned ldm, layout_t layout) {
    check_matrix_pointer(p, ldm, "wmma::load_matrix_sync");
    wmma_sync_point("wmma::load_matrix_sync");
    load_lane(f, p, ldm, layout == mem_row_major);
}

template <int M, int N, int K, typename T>
inline void store_matrix_sync(T * p, const fragment<accumulator, M, N, K, T> & f, unsigned ldm, layout_t layout) {
    using F = fragment<accumulator, M, N, K, T>;
    check_matrix_pointer(p, ldm, "wmma::store_matrix_sync");
    wmma_sync_point("wmma::store_matrix_sync");
    const int lane = emu::lane_of(emu::g_current);
    for (int i = 0; i < F::num_elements; ++i) {
        const int e = i * emu::kWarp + lane, r = e / F::cols, c = e % F::cols;
        p[layout == mem_row_major ? (size_t) r * ldm + c : (size_t) c * ldm + r] = f.x[i];
    }
}

// D = A B + C for the whole warp: every lane passes its own fragments
template <int M, int N, int K, typename TA, typename LA, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC> & d, const fragment<matrix_a, M, N, K, TA, LA> & a,
                     const fragment<matrix_b, M, N, K, TA, LB> & b, const fragment<accumulator, M, N, K, TC> & c) {
    using FA = fragment<matrix_a, M, N, K, TA, LA>;
    using FB = fragment<matrix_b, M, N, K, TA, LB>;
    using FC = fragment<accumulator, M, N, K, TC>;
    emu::Thread * me = emu::g_current;
    me->wmma_args[0] = &d;
    me->wmma_args[1] = &a;
    me->wmma_args[2] = &b;
    me->wmma_args[3] = &c;
    emu::warp_collective(emu::Op::Wmma, 0xffffffffu, "wmma::mma_sync", 0, [](emu::Thread ** lanes, unsigned) {
        float A[M][K], B[K][N], C[M][N];
        for (int l = 0; l < emu::kWarp; ++l) {
            const FA & fa = *static_cast<const FA *>(lanes[l]->wmma_args[1]);
            const FB & fb = *static_cast<const FB *>(lanes[l]->wmma_args[2]);
            const FC & fc = *static_cast<const FC *>(lanes[l]->wmma_args[3]);
            for (int i = 0; i < FA::num_elements; ++i) {
                const int e = i * emu::kWarp + l;
                A[e / K][e % K] = static_cast<float>(fa.x[i]);
            }
            for (int i = 0; i < FB::num_elements; ++i) {
                const int e = i * emu::kWarp + l;
                B[e / N][e % N] = static_cast<float>(fb.x[i]);
            }
            for (int i = 0; i < FC::num_elements; ++i) {
                const int e = i * emu::kWarp + l;
                C[e / N][e % N] = static_cast<float>(fc.x[i]);
            }
        }
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
                float acc = C[m][n];
                for (int k = 0; k < K; ++k) acc += A[m][k] * B[k][n];  // f16 x f16 is exact in f32
                C[m][n] = acc;
            }
        for (int l = 0; l < emu::kWarp; ++l) {
            FC & fd = *static_cast<FC *>(const_cast<void *>(lanes[l]->wmma_args[0]));
            for (int i = 0; i < FC::num_elements; ++i) {
                const int e = i * emu::kWarp + l;
                fd.x[i] = static_cast<TC>(C[e / N][e % N]);
            }
        }
    });
}

}  // namespace wmma
}  // namespace nvcuda

// ---- the launcher: what cuLaunchKernel does -------------------------------------------------------------

namespace emu {

struct KernelEntry {
    const char * name;
    void (*entry)(void **);
};

template <typename... A, size_t... I>
inline void call_with(void (*kernel)(A...), void ** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A> *>(args[I])...);
}

template <typename... A>
constexpr size_t arity(void (*)(A...)) { return sizeof...(A); }

template <auto Kernel>
void entry(void ** args) {
    call_with(Kernel, args, std::make_index_sequence<arity(Kernel)>{});
}

inline uint64_t next_random(uint64_t & s) {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

inline void set_run_order(int n, uint64_t & seed) {
    for (int i = 0; i < n; ++i) g_run_order[i] = g_schedule_order == 1 ? n - 1 - i : i;
    if (g_schedule_order == 2)
        for (int i = n - 1; i > 0; --i) std::swap(g_run_order[i], g_run_order[next_random(seed) % (i + 1)]);
}

inline const char * describe_state(const Thread & t, char * buf, size_t n) {
    if (t.state == State::Done) snprintf(buf, n, "has returned");
    else if (t.state == State::Ready) snprintf(buf, n, "is runnable");
    else snprintf(buf, n, "waits at %s (%s:%d)", op_name(t.op), t.file, t.line);
    return buf;
}

[[noreturn]] inline void report_deadlock() {
    // group consecutive threads that are in the same state, at the same place
    char out[700] = {0}, a[160], b[160];
    size_t len = 0;
    int groups = 0;
    for (int i = 0; i < g_launch.n_threads && groups < 4;) {
        int j = i + 1;
        describe_state(g_threads[i], a, sizeof a);
        while (j < g_launch.n_threads && strcmp(describe_state(g_threads[j], b, sizeof b), a) == 0) ++j;
        len += snprintf(out + len, sizeof out - len, "%sthreads %d-%d %s", groups ? "; " : "", i, j - 1, a);
        if (len >= sizeof out) break;
        ++groups;
        i = j;
    }
    fail("no thread can go on (a barrier that not every thread reaches): %s", out);
}

inline void run_block() {
    uint64_t seed = g_schedule_seed ^ (static_cast<uint64_t>(g_block_idx.x) * 0x100000001b3ull + g_block_idx.y * 7919u +
                                       g_block_idx.z);
    const int n = g_launch.n_threads;
    set_run_order(n, seed);
    for (int i = 0; i < n; ++i) {
        Thread & t = g_threads[i];
        t.linear = i;
        t.idx = {static_cast<unsigned>(i % g_block_dim.x), static_cast<unsigned>(i / g_block_dim.x % g_block_dim.y),
                 static_cast<unsigned>(i / (g_block_dim.x * g_block_dim.y))};
        t.state = State::Ready;
        t.op = Op::None;
        thread_start(&t);
    }
    g_block_arrived = 0;
    if (g_poison_dynamic_shared) g_poison_dynamic_shared(g_launch.dynamic_shared_bytes);  // NaN floats
    for (int k = 0; k < n; ++k) g_threads[g_run_order[k]].order_pos = k;
    // each call runs threads until none can go on: then all have returned, or some wait forever
    for (int k = 0; k < n; ++k)
        if (g_threads[g_run_order[k]].state == State::Ready) to_thread(&g_threads[g_run_order[k]]);
    for (int i = 0; i < n; ++i)
        if (g_threads[i].state != State::Done) report_deadlock();
}

inline void on_timeout(int, siginfo_t *, void *) {
    if (g_launch.running) escape(2);
}

}  // namespace emu

extern "C" {


// Run one kernel over a grid: returns 0, or 1 (an error, in `error`) or 2 (past `timeout_s`).
__attribute__((visibility("default"))) int emu_launch(void (*entry)(void **), void ** args, unsigned gx, unsigned gy,
                                                      unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                      unsigned long long dynamic_shared, double timeout_s, char * error,
                                                      unsigned long long error_size) {
    using namespace emu;
    const unsigned long long n = static_cast<unsigned long long>(bx) * by * bz;
    if (n == 0 || n > kMaxThreads || dynamic_shared > kMaxDynamicShared) {
        snprintf(error, error_size, "launch refused: %llu threads, %llu bytes of shared memory", n, dynamic_shared);
        return 1;
    }
    if (!ensure_stacks(static_cast<int>(n))) {
        snprintf(error, error_size, "out of memory for %llu thread stacks", n);
        return 1;
    }
    g_launch.entry = entry;
    g_launch.args = args;
    g_launch.n_threads = static_cast<int>(n);
    g_launch.error[0] = 0;
    g_launch.dynamic_shared_bytes = dynamic_shared;
    g_block_dim = {bx, by, bz};
    g_grid_dim = {gx, gy, gz};

    struct sigaction action = {}, previous = {};
    action.sa_sigaction = on_timeout;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    const int signo = SIGRTMIN + 7;
    sigaction(signo, &action, &previous);
    timer_t timer;
    struct sigevent event = {};
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = signo;
    event._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
    const bool timed = timeout_s > 0 && timer_create(CLOCK_MONOTONIC, &event, &timer) == 0;
    if (timed) {
        struct itimerspec spec = {};
        spec.it_value.tv_sec = static_cast<time_t>(timeout_s);
        spec.it_value.tv_nsec = static_cast<long>((timeout_s - static_cast<double>(spec.it_value.tv_sec)) * 1e9);
        if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
        timer_settime(timer, 0, &spec, nullptr);
    }
    int status = sigsetjmp(g_launch.escape, 1);
    if (status == 0) {
        g_launch.running = 1;
        for (unsigned z = 0; z < gz; ++z)
            for (unsigned y = 0; y < gy; ++y)
                for (unsigned x = 0; x < gx; ++x) {
                    g_block_idx = {x, y, z};
                    run_block();
                }
    }
    g_launch.running = 0;
    const bool from_fiber = g_on_fiber;
    g_on_fiber = false;
    if (timed) timer_delete(timer);
    sigaction(signo, &previous, nullptr);
#ifdef EMU_ASAN
    if (from_fiber) __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    if (status == 2)
        snprintf(error, error_size, "ran past the time limit of %g s (in block (%u, %u, %u))", timeout_s, g_block_idx.x,
                 g_block_idx.y, g_block_idx.z);
    else if (status == 1)
        snprintf(error, error_size, "%s", g_launch.error);
    return status;
}

// 0: threads of a block run in index order; 1: reverse; 2: shuffled by `seed` (per block).
__attribute__((visibility("default"))) void emu_set_schedule(int order, unsigned long long seed) {
    emu::g_schedule_order = order;
    emu::g_schedule_seed = seed;
}
}
