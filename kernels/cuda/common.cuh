// Shared by every kernel file: the host compiles each `.cu` file as one
// NVRTC program made of this header, `quant.cuh`, `quant_low_k.cuh` and
// the file itself, so no file includes another (NVRTC has no include path
// here, and no CUDA headers: f16 and bf16 conversions are written with PTX
// below).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;

#define WARP 32

// f16 bits to f32, exact.
__device__ __forceinline__ float f16_to_f32(u16 bits) {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
}

// f32 to the nearest f16 (ties to even), as the CPU backend rounds KV rows.
__device__ __forceinline__ u16 f32_to_f16(float value) {
    u16 bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
}

// bf16 bits to f32, exact: bf16 is the top half of an f32.
__device__ __forceinline__ float bf16_to_f32(u16 bits) {
    return __uint_as_float(((u32)bits) << 16);
}

// Unaligned little-endian loads: GGUF blocks are packed without padding,
// so a block's fields sit at any byte offset.
__device__ __forceinline__ u16 load_u16(const u8* at) {
    return (u16)at[0] | ((u16)at[1] << 8);
}

__device__ __forceinline__ u32 load_u32(const u8* at) {
    return (u32)at[0] | ((u32)at[1] << 8) | ((u32)at[2] << 16) | ((u32)at[3] << 24);
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    return value;
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
    return value;
}

// Sum over a block of up to 1024 threads; every thread gets the total.
// `scratch` holds one float per warp. The block must call it together.
__device__ __forceinline__ float block_sum(float value, float* scratch) {
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    value = warp_sum(value);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = value;
    }
    __syncthreads();
    const int warps = (blockDim.x + WARP - 1) / WARP;
    value = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(value);
}

__device__ __forceinline__ float block_max(float value, float* scratch) {
    const int lane = threadIdx.x % WARP;
    const int warp = threadIdx.x / WARP;
    value = warp_max(value);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = value;
    }
    __syncthreads();
    const int warps = (blockDim.x + WARP - 1) / WARP;
    value = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
    return warp_max(value);
}

// Q8_0, the one block format both weights and the KV store use: 32 values
// as an f16 scale `d` and 32 signed bytes, value i = d × q[i].
#define Q8_0_VALUES 32
#define Q8_0_BYTES 34

__device__ __forceinline__ float q8_0_scale(const u8* block) {
    return f16_to_f32(load_u16(block));
}

__device__ __forceinline__ float q8_0_value(const u8* block, int i) {
    return q8_0_scale(block) * (float)(i8)block[2 + i];
}
