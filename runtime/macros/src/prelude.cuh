// The helpers of generated kernels (CUDA and HIP alike; the dialect header before this
// defines offload_shfl_down). Defined once however many generated sources are joined.
#ifndef OFFLOAD_GENERATED_PRELUDE
#define OFFLOAD_GENERATED_PRELUDE
template <typename T> __device__ __forceinline__ T offload_min(T a, T b) { return b < a ? b : a; }
template <typename T> __device__ __forceinline__ T offload_max(T a, T b) { return a < b ? b : a; }
// Where out-of-range accesses of a checked launch go: scratch as large as any element
// (DeviceCopy structs are at most 512 bytes); what is stored there is never read as data.
__device__ unsigned long long offload_scratch[64];
// Element i of a view of len elements, or (out of range) the scratch; the report's first
// word records the first violation: 1, argument, index, length.
template <typename T> __device__ __forceinline__ T* offload_at(T* p, unsigned long long i,
        unsigned long long len, unsigned int arg, unsigned long long* err) {
    if (i < len) return p + i;
    if (atomicCAS(err, 0ull, 1ull) == 0ull) { err[1] = arg; err[2] = i; err[3] = len; }
    return (T*)offload_scratch;
}
struct offload_op_add {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct offload_op_mul {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; }
};
struct offload_op_min {
    __device__ __forceinline__ float operator()(float a, float b) const { return fminf(a, b); }
    __device__ __forceinline__ double operator()(double a, double b) const { return fmin(a, b); }
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct offload_op_max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? b : a; }
};
__device__ __forceinline__ void offload_atomic(offload_op_add, float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, int* p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, unsigned int* p, unsigned int v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, unsigned long long* p, unsigned long long v) { atomicAdd(p, v); }
__device__ __forceinline__ void offload_atomic(offload_op_add, long long* p, long long v) {
    atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
#define OFFLOAD_INT_MINMAX(T) \
    __device__ __forceinline__ void offload_atomic(offload_op_min, T* p, T v) { atomicMin(p, v); } \
    __device__ __forceinline__ void offload_atomic(offload_op_max, T* p, T v) { atomicMax(p, v); }
OFFLOAD_INT_MINMAX(int)
OFFLOAD_INT_MINMAX(unsigned int)
OFFLOAD_INT_MINMAX(long long)
OFFLOAD_INT_MINMAX(unsigned long long)
template <typename Op> __device__ __forceinline__ void offload_atomic(Op op, float* p, float v) {
    unsigned int* u = (unsigned int*)p;
    unsigned int old = *u;
    while (true) {
        const unsigned int next = __float_as_uint(op(__uint_as_float(old), v));
        if (next == old) return;
        const unsigned int seen = atomicCAS(u, old, next);
        if (seen == old) return;
        old = seen;
    }
}
template <typename Op> __device__ __forceinline__ void offload_atomic(Op op, double* p, double v) {
    unsigned long long* u = (unsigned long long*)p;
    unsigned long long old = *u;
    while (true) {
        const unsigned long long next = (unsigned long long)__double_as_longlong(op(__longlong_as_double((long long)old), v));
        if (next == old) return;
        const unsigned long long seen = atomicCAS(u, old, next);
        if (seen == old) return;
        old = seen;
    }
}
// Combines every thread's v into *out: a shuffle tree per warp, the warps' partials in
// shared memory, a shuffle tree over them, one atomic per block. Every thread of the block
// calls it; blocks are whole warps (the launch's 256 threads).
template <typename T, typename Op> __device__ __forceinline__ void offload_reduce(T v, T identity, T* out, Op op) {
    __shared__ T partials[32];
    for (int o = 16; o > 0; o >>= 1) v = op(v, offload_shfl_down(v, o));
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads();  // an earlier reduction of this type may still be reading the partials
    if (lane == 0) partials[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < ((blockDim.x + 31u) >> 5) ? partials[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = op(v, offload_shfl_down(v, o));
        if (lane == 0) offload_atomic(op, out, v);
    }
}
// `offload::team_sum(v)` and its kin: the team's (the block's, whole warps) combination of
// every thread's v, returned to every thread. Shuffles within each warp, the warps'
// partials through shared memory, the first warp combines them; its own barriers keep an
// earlier reduction of the same type from reading the partials this one writes.
template <typename T, typename Op> __device__ __forceinline__ T offload_team_reduce(T v, T identity, Op op) {
    __shared__ T partials[33];
    for (int o = 16; o > 0; o >>= 1) v = op(v, offload_shfl_down(v, o));
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) partials[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < ((blockDim.x + 31u) >> 5) ? partials[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = op(v, offload_shfl_down(v, o));
        if (lane == 0) partials[32] = v;
    }
    __syncthreads();
    return partials[32];
}
// Views that are not a kernel's bare parameters (device functions' parameters,
// sub-slices): element access checked when `err` is set (a checked launch).
template <typename T> struct offload_view {
    T* p;
    unsigned long long len;
    unsigned int arg;
    unsigned long long* err;
    __device__ __forceinline__ offload_view(T* p_, unsigned long long len_, unsigned int arg_, unsigned long long* err_)
        : p(p_), len(len_), arg(arg_), err(err_) {}
    template <typename U> __device__ __forceinline__ offload_view(const offload_view<U>& o)
        : p(o.p), len(o.len), arg(o.arg), err(o.err) {}
    __device__ __forceinline__ T& operator[](unsigned long long i) const {
        if (err == nullptr) return p[i];
        return *offload_at(p, i, len, arg, err);
    }
};
// `&v[a..b]`: checked launches report a range outside the view (and give an empty view).
template <typename T> __device__ __forceinline__ offload_view<T> offload_sub(offload_view<T> v,
        unsigned long long a, unsigned long long b) {
    if (v.err != nullptr && !(a <= b && b <= v.len)) {
        offload_at(v.p, b > v.len ? b : a, v.len, v.arg, v.err);
        return offload_view<T>(v.p, 0ull, v.arg, v.err);
    }
    return offload_view<T>(v.p + a, b - a, v.arg, v.err);
}
// The type of an expression without reference or const (for `decltype` of values whose
// type only rustc knows: constants, struct fields, device functions' results).
template <typename T> struct offload_plain_s { typedef T type; };
template <typename T> struct offload_plain_s<T&> { typedef typename offload_plain_s<T>::type type; };
template <typename T> struct offload_plain_s<const T> { typedef T type; };
template <typename T> using offload_plain = typename offload_plain_s<T>::type;
// Rust's operators and methods on values of such types.
__device__ __forceinline__ bool offload_not(bool a) { return !a; }
template <typename T> __device__ __forceinline__ T offload_not(T a) { return ~a; }
__device__ __forceinline__ float offload_rem(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double offload_rem(double a, double b) { return fmod(a, b); }
template <typename T> __device__ __forceinline__ T offload_rem(T a, T b) { return a % b; }
template <typename T> __device__ __forceinline__ T offload_clamp(T x, T lo, T hi) { return x < lo ? lo : (hi < x ? hi : x); }
#define OFFLOAD_MATH1(name, f, d) \
    __device__ __forceinline__ float offload_m_##name(float x) { return f(x); } \
    __device__ __forceinline__ double offload_m_##name(double x) { return d(x); }
#define OFFLOAD_MATH2(name, f, d) \
    __device__ __forceinline__ float offload_m_##name(float x, float y) { return f(x, y); } \
    __device__ __forceinline__ double offload_m_##name(double x, double y) { return d(x, y); }
OFFLOAD_MATH1(sqrt, sqrtf, sqrt) OFFLOAD_MATH1(exp, expf, exp) OFFLOAD_MATH1(exp2, exp2f, exp2)
OFFLOAD_MATH1(ln, logf, log) OFFLOAD_MATH1(log2, log2f, log2) OFFLOAD_MATH1(log10, log10f, log10)
OFFLOAD_MATH1(sin, sinf, sin) OFFLOAD_MATH1(cos, cosf, cos) OFFLOAD_MATH1(tan, tanf, tan)
OFFLOAD_MATH1(asin, asinf, asin) OFFLOAD_MATH1(acos, acosf, acos) OFFLOAD_MATH1(atan, atanf, atan)
OFFLOAD_MATH1(sinh, sinhf, sinh) OFFLOAD_MATH1(cosh, coshf, cosh) OFFLOAD_MATH1(tanh, tanhf, tanh)
OFFLOAD_MATH1(cbrt, cbrtf, cbrt) OFFLOAD_MATH1(floor, floorf, floor) OFFLOAD_MATH1(ceil, ceilf, ceil)
OFFLOAD_MATH1(round, roundf, round) OFFLOAD_MATH1(trunc, truncf, trunc)
OFFLOAD_MATH1(erf, erff, erf) OFFLOAD_MATH1(erfc, erfcf, erfc)
OFFLOAD_MATH2(powf, powf, pow) OFFLOAD_MATH2(atan2, atan2f, atan2) OFFLOAD_MATH2(hypot, hypotf, hypot)
__device__ __forceinline__ float offload_m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double offload_m_abs(double x) { return fabs(x); }
__device__ __forceinline__ int offload_m_abs(int x) { return abs(x); }
__device__ __forceinline__ long long offload_m_abs(long long x) { return llabs(x); }
__device__ __forceinline__ float offload_m_min(float x, float y) { return fminf(x, y); }
__device__ __forceinline__ double offload_m_min(double x, double y) { return fmin(x, y); }
template <typename T> __device__ __forceinline__ T offload_m_min(T x, T y) { return y < x ? y : x; }
__device__ __forceinline__ float offload_m_max(float x, float y) { return fmaxf(x, y); }
__device__ __forceinline__ double offload_m_max(double x, double y) { return fmax(x, y); }
template <typename T> __device__ __forceinline__ T offload_m_max(T x, T y) { return x < y ? y : x; }
template <typename T> __device__ __forceinline__ T offload_m_clamp(T x, T lo, T hi) { return offload_clamp(x, lo, hi); }
template <typename T> __device__ __forceinline__ T offload_m_recip(T x) { return T(1) / x; }
__device__ __forceinline__ float offload_m_mul_add(float x, float a, float b) { return fmaf(x, a, b); }
__device__ __forceinline__ double offload_m_mul_add(double x, double a, double b) { return fma(x, a, b); }
template <typename T> __device__ __forceinline__ T offload_m_powi(T x, int n) { return offload_m_powf(x, (T)n); }
// bf16 and f16 (Rust's `half::bf16`, `half::f16`): 16 bits in memory; converted
// bit for bit as `half` converts (round to nearest even, NaNs kept quiet with their
// payload), and each operator computed in f32 and rounded back, as `half`'s operators do.
struct offload_bf16 { unsigned short bits; };
struct offload_f16 { unsigned short bits; };
__device__ __forceinline__ float offload_half_to_f32(offload_bf16 h) {
    unsigned int i = h.bits;
    if ((i & 0x7fffu) > 0x7f80u) i |= 0x40u;
    return __uint_as_float(i << 16);
}
__device__ __forceinline__ offload_bf16 offload_bf16_from_f32(float v) {
    unsigned int x = __float_as_uint(v);
    offload_bf16 r;
    if ((x & 0x7fffffffu) > 0x7f800000u) { r.bits = (unsigned short)((x >> 16) | 0x40u); return r; }
    unsigned int h = x >> 16;
    if ((x & 0x8000u) != 0u && (x & 0x17fffu) != 0u) h += 1u;
    r.bits = (unsigned short)h;
    return r;
}
__device__ __forceinline__ float offload_half_to_f32(offload_f16 h) {
    unsigned int i = h.bits;
    if ((i & 0x7fffu) == 0u) return __uint_as_float(i << 16);
    unsigned int sign = (i & 0x8000u) << 16, exp = i & 0x7c00u, man = i & 0x03ffu;
    if (exp == 0x7c00u) return __uint_as_float(man == 0u ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (man << 13)));
    if (exp == 0u) {
        unsigned int e = (unsigned int)(__clz(man) - 16 - 6);
        return __uint_as_float(sign | ((127u - 15u - e) << 23) | ((man << (14u + e)) & 0x7fffffu));
    }
    return __uint_as_float(sign | (((exp >> 10) + 127u - 15u) << 23) | (man << 13));
}
__device__ __forceinline__ offload_f16 offload_f16_from_f32(float v) {
    unsigned int x = __float_as_uint(v);
    unsigned int sign = x & 0x80000000u, exp = x & 0x7f800000u, man = x & 0x007fffffu;
    unsigned int hs = sign >> 16;
    offload_f16 r;
    if (exp == 0x7f800000u) { r.bits = (unsigned short)(hs | 0x7c00u | (man != 0u ? 0x0200u : 0u) | (man >> 13)); return r; }
    int he = (int)(exp >> 23) - 127 + 15;
    if (he >= 0x1f) { r.bits = (unsigned short)(hs | 0x7c00u); return r; }
    if (he <= 0) {
        if (14 - he > 24) { r.bits = (unsigned short)hs; return r; }
        unsigned int m = man | 0x00800000u;
        unsigned int hm = m >> (14 - he);
        unsigned int round = 1u << (13 - he);
        if ((m & round) != 0u && (m & (3u * round - 1u)) != 0u) hm += 1u;
        r.bits = (unsigned short)(hs | hm);
        return r;
    }
    unsigned int h = hs | ((unsigned int)he << 10) | (man >> 13);
    if ((man & 0x1000u) != 0u && (man & 0x2fffu) != 0u) h += 1u;
    r.bits = (unsigned short)h;
    return r;
}
// f64 from the f32 value, the NaN's payload moved by bits (a GPU's conversion would make
// it the canonical NaN).
template <typename H> __device__ __forceinline__ double offload_half_to_f64(H h) {
    float f = offload_half_to_f32(h);
    unsigned int b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return __longlong_as_double((long long)(((unsigned long long)(b & 0x80000000u) << 32)
            | 0x7ff0000000000000ull | ((unsigned long long)(b & 0x007fffffu) << 29)));
    return (double)f;
}
#define OFFLOAD_HALF_OPS(H) \
    __device__ __forceinline__ H operator+(H a, H b) { return H##_from_f32(offload_half_to_f32(a) + offload_half_to_f32(b)); } \
    __device__ __forceinline__ H operator-(H a, H b) { return H##_from_f32(offload_half_to_f32(a) - offload_half_to_f32(b)); } \
    __device__ __forceinline__ H operator*(H a, H b) { return H##_from_f32(offload_half_to_f32(a) * offload_half_to_f32(b)); } \
    __device__ __forceinline__ H operator/(H a, H b) { return H##_from_f32(offload_half_to_f32(a) / offload_half_to_f32(b)); } \
    __device__ __forceinline__ H operator%(H a, H b) { return H##_from_f32(fmodf(offload_half_to_f32(a), offload_half_to_f32(b))); } \
    __device__ __forceinline__ H operator-(H a) { H r; r.bits = (unsigned short)(a.bits ^ 0x8000u); return r; } \
    __device__ __forceinline__ H& operator+=(H& a, H b) { a = a + b; return a; } \
    __device__ __forceinline__ H& operator-=(H& a, H b) { a = a - b; return a; } \
    __device__ __forceinline__ H& operator*=(H& a, H b) { a = a * b; return a; } \
    __device__ __forceinline__ H& operator/=(H& a, H b) { a = a / b; return a; } \
    __device__ __forceinline__ H& operator%=(H& a, H b) { a = a % b; return a; } \
    __device__ __forceinline__ bool operator==(H a, H b) { return offload_half_to_f32(a) == offload_half_to_f32(b); } \
    __device__ __forceinline__ bool operator!=(H a, H b) { return offload_half_to_f32(a) != offload_half_to_f32(b); } \
    __device__ __forceinline__ bool operator<(H a, H b) { return offload_half_to_f32(a) < offload_half_to_f32(b); } \
    __device__ __forceinline__ bool operator<=(H a, H b) { return offload_half_to_f32(a) <= offload_half_to_f32(b); } \
    __device__ __forceinline__ bool operator>(H a, H b) { return offload_half_to_f32(a) > offload_half_to_f32(b); } \
    __device__ __forceinline__ bool operator>=(H a, H b) { return offload_half_to_f32(a) >= offload_half_to_f32(b); }
OFFLOAD_HALF_OPS(offload_bf16)
OFFLOAD_HALF_OPS(offload_f16)
#endif
