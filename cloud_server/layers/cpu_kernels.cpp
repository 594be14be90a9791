// Weight-only int4 and int8 matmuls for x86-64 CPUs with AVX-512 VNNI, for a few rows at a time.
//
// torch's CPU int4 kernel widens every weight to fp32 and multiplies it once per row, so 4 rows
// cost 1.8x one row; speculative verification sends 2-8 rows a sequence. Here the activations are
// rounded to int8 (per row and group of 32 columns, as llama.cpp does for its quantized matmuls)
// and each weight code meets every row through one integer dot-product instruction (vpdpbusd: 64
// byte products into 16 int32 sums), with no widening of the weights at all: 8 rows cost about
// what 1 costs while reading the weights is the bottleneck.
//
// Activations, per row r and group g of 32 columns (X = their fp32 sum, in a fixed order):
//   d = max |x| / 127,   a_k = round(x_k / d)   (int8; all 0 where the group is 0)
// int4 weights, w = s (q - 8) + z with q in 0..15:
//   y += s d sum_k a_k (q_k - 8) + z X      (the sum exact in int32: starts at -8 sum a_k)
// int8 weights, w = s q + z with q an int8, stored as the byte q + 128 (vpdpbusd's unsigned side):
//   y += s d sum_k a_k q_k + z X            (the sum exact in int32: starts at -128 sum a_k)
// Only the s term sees the rounded activations: z X, the weights' offset, uses the exact sum.
//
// Formats, one matrix [N, K] (N % 16 == 0, K % 32 == 0), per block b of 16 output rows:
//   int4: per group g, 320 bytes: 4 chunks of 64 code bytes, then 16 bf16 scales and 16 bf16
//         zeros. Byte 4c + e of chunk i holds row 16b + c: low nibble column 4i + e, high nibble
//         column 16 + 4i + e.
//   int8: codes, per group 8 chunks of 64 bytes: byte 4c + e of chunk j is Q[16b + c, 32g + 4j + e]
//         + 128; and apart, sz fp16 [N / 16, K / 32, 2, 16]: per block and group the 16 rows'
//         scales, then their zeros. GGUF blocks of 32 (Q8_0, Q5_0, Q4_0, Q4_1) are such groups
//         exactly, with their fp16 d and m.
// Each output row is computed by the same instructions in the same order whatever the number of
// rows or threads (and integer sums are exact), so a row's result never depends on its batch.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int kGroup = 32;
constexpr int kBlockRows = 16;
constexpr int kMaxRows = 8;  // activation rows per pass over a block (registers: 8 sums + 8 outputs)

inline __m512 load_bf16x16(const uint16_t* p) {  // 16 bf16 -> 16 fp32 (exact)
  __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

inline __m512 load_f16x16(const uint16_t* p) {  // 16 fp16 -> 16 fp32 (exact)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The activations rounded to int8, per row and group (see the top of the file).
struct Rows {
  int64_t k = 0, groups = 0;
  std::vector<int8_t> a;      // [M, K]
  std::vector<float> d;       // [M, groups]
  std::vector<float> xsum;    // [M, groups]
  std::vector<int32_t> asum;  // [M, groups]
};

Rows quantize_rows(const uint16_t* x, int64_t m, int64_t k) {
  Rows r;
  r.k = k;
  r.groups = k / kGroup;
  const int64_t n = m * r.groups;
  r.a.resize(m * k);
  r.d.resize(n);
  r.xsum.resize(n);
  r.asum.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const __m512 lo = load_bf16x16(x + i * kGroup), hi = load_bf16x16(x + i * kGroup + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    // rounded to nearest even (the default mode); |x| 127 / amax <= 127 plus a rounding error, so
    // every value fits an int8 as it is
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.a.data() + i * kGroup), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.a.data() + i * kGroup + 16), _mm512_cvtsepi32_epi8(qhi));
    r.d[i] = amax / 127.0f;
    r.xsum[i] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    r.asum[i] = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
  }
  return r;
}

// acc += w . (the 4 int8 activations at p, in every lane): vpdpbusd, unsigned codes times signed
// activations, with an embedded broadcast (the compiler would spend an instruction on it).
inline void dp4(__m512i& acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(p)));
}

// One block's weights in the int4 format: group g's column quad j (j = 0..7) as 16 x 4 bytes.
struct Int4Block {
  static constexpr int kBias = 8;
  static constexpr int kGroupBytes = 256 + 64;
  // prefetch this far ahead: 40 groups, the best of 4, 10, 20, 40 and 80 on this project's AMD EPYC
  static constexpr int kPrefetch = 40 * kGroupBytes;
  const uint8_t* w;
  void prefetch(int64_t g) const {
    for (int l = 0; l < kGroupBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(w + g * kGroupBytes + kPrefetch + l), _MM_HINT_T0);
  }
  __m512i quad(int64_t g, int j) const {  // the chunk's load is shared by quads j and j + 4
    const __m512i bytes = _mm512_loadu_si512(w + g * kGroupBytes + 64 * (j % 4));
    return _mm512_and_si512(j < 4 ? bytes : _mm512_srli_epi16(bytes, 4), _mm512_set1_epi8(0x0F));
  }
  void scales(int64_t g, __m512& s, __m512& z) const {
    const uint16_t* sz = reinterpret_cast<const uint16_t*>(w + g * kGroupBytes + 256);
    s = load_bf16x16(sz);
    z = load_bf16x16(sz + kBlockRows);
  }
};

// One block's weights in the int8 format.
struct Int8Block {
  static constexpr int kBias = 128;
  static constexpr int kGroupBytes = kGroup * kBlockRows;
  static constexpr int kPrefetch = 16384;  // bytes ahead (the int4 kernel's distance, in whole lines)
  const uint8_t* w;
  const uint16_t* sz;
  void prefetch(int64_t g) const {
    for (int l = 0; l < kGroupBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(w + g * kGroupBytes + kPrefetch + l), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(sz + g * 2 * kBlockRows + kPrefetch / 8), _MM_HINT_T0);
  }
  __m512i quad(int64_t g, int j) const { return _mm512_loadu_si512(w + g * kGroupBytes + 64 * j); }
  void scales(int64_t g, __m512& s, __m512& z) const {
    s = load_f16x16(sz + g * 2 * kBlockRows);
    z = load_f16x16(sz + g * 2 * kBlockRows + kBlockRows);
  }
};

// MB activation rows (from row r0) against one block of 16 output rows: one int32 sum per row and
// group, then y += s d sum + z X in fp32, in the same order whatever MB is.
template <int MB, class Block>
void tile(const Block& blk, const Rows& x, int64_t r0, float* y, int64_t ldy) {
  __m512 out[MB];
  for (int m = 0; m < MB; ++m) out[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < x.groups; ++g) {
    blk.prefetch(g);
    __m512i acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_set1_epi32(-Block::kBias * x.asum[(r0 + m) * x.groups + g]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i w = blk.quad(g, j);
      for (int m = 0; m < MB; ++m) dp4(acc[m], w, x.a.data() + (r0 + m) * x.k + g * kGroup + 4 * j);
    }
    __m512 s, z;
    blk.scales(g, s, z);
    for (int m = 0; m < MB; ++m) {
      const int64_t i = (r0 + m) * x.groups + g;
      out[m] = _mm512_fmadd_ps(_mm512_mul_ps(s, _mm512_set1_ps(x.d[i])), _mm512_cvtepi32_ps(acc[m]), out[m]);
      out[m] = _mm512_fmadd_ps(z, _mm512_set1_ps(x.xsum[i]), out[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * ldy, out[m]);
}

template <class Block>
void tile_rows(int mb, const Block& blk, const Rows& x, int64_t r0, float* y, int64_t ldy) {
  switch (mb) {
    case 1: return tile<1>(blk, x, r0, y, ldy);
    case 2: return tile<2>(blk, x, r0, y, ldy);
    case 3: return tile<3>(blk, x, r0, y, ldy);
    case 4: return tile<4>(blk, x, r0, y, ldy);
    case 5: return tile<5>(blk, x, r0, y, ldy);
    case 6: return tile<6>(blk, x, r0, y, ldy);
    case 7: return tile<7>(blk, x, r0, y, ldy);
    default: return tile<8>(blk, x, r0, y, ldy);
  }
}

// y fp32 [M, N] = x [M, K] times the N / 16 blocks that block(b) gives; threads split the blocks,
// and a block's weights meet every chunk of 8 rows while in cache.
template <class MakeBlock>
at::Tensor rows_times_blocks(const at::Tensor& x, int64_t n, MakeBlock block) {
  const int64_t m = x.size(0), k = x.size(1);
  auto y = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0) return y;
  const Rows rows = quantize_rows(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), m, k);
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n / kBlockRows, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const auto blk = block(b);
      for (int64_t r = 0; r < m; r += kMaxRows)
        tile_rows(static_cast<int>(std::min<int64_t>(kMaxRows, m - r)), blk, rows, r, yp + r * n + b * kBlockRows, n);
    }
  });
  return y;
}

// x bf16 [M, K], w uint8 packed (see above) for [N, K]: y fp32 [M, N].
at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& w, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: bf16 [M, K]");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous(), "w: packed uint8");
  const int64_t k = x.size(1);
  TORCH_CHECK(k % kGroup == 0 && n % kBlockRows == 0, "K % 32 and N % 16 must be 0");
  const int64_t groups = k / kGroup;
  TORCH_CHECK(w.numel() == n / kBlockRows * groups * Int4Block::kGroupBytes, "w does not match [N, K]");
  const uint8_t* wp = w.data_ptr<uint8_t>();
  return rows_times_blocks(x, n, [&](int64_t b) { return Int4Block{wp + b * groups * Int4Block::kGroupBytes}; });
}

// x bf16 [M, K], codes uint8 and sz fp16 packed (see above) for [N, K]: y fp32 [M, N].
at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sz) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: bf16 [M, K]");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous(), "w: packed uint8");
  TORCH_CHECK(sz.scalar_type() == at::kHalf && sz.is_contiguous(), "sz: packed fp16");
  const int64_t k = x.size(1);
  TORCH_CHECK(k % kGroup == 0, "K % 32 must be 0");
  const int64_t groups = k / kGroup, n = w.numel() / k;
  TORCH_CHECK(n % kBlockRows == 0 && w.numel() == n * k && sz.numel() == n * groups * 2,
              "w and sz do not match [N, K]");
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::Half>());
  return rows_times_blocks(x, n, [&](int64_t b) {
    return Int8Block{wp + b * kBlockRows * k, sp + b * groups * 2 * kBlockRows};
  });
}

}  // namespace

TORCH_LIBRARY(hybridllm_cpu, lib) {
  lib.def("int4_mm(Tensor x, Tensor w, int n) -> Tensor", &int4_mm);
  lib.def("int8_mm(Tensor x, Tensor w, Tensor sz) -> Tensor", &int8_mm);
}
