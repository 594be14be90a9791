// Weight-only int4 and int8 matmuls for CPUs with AVX-512 BF16, for a few rows at a time.
//
// torch's CPU int4 kernel widens every weight to fp32 and multiplies it once per row, so 4 rows
// cost 1.8x one row; speculative verification sends 2-8 rows a sequence. Here each 4-bit code is
// widened once to bf16 and then meets every row through one bf16 dot-product instruction
// (vdpbf16ps: 32 multiplies into 16 fp32 sums), so extra rows cost little until the unit is busy.
//
// Format (one matrix [N, K], N % 16 == 0, K % 32 == 0), per block b of 16 output rows and group g
// of 32 columns, 320 bytes in a row: 256 bytes of codes, then 16 bf16 scales, then 16 bf16 zeros.
// The codes come in 8 quads of 32 bytes (columns 4j..4j+3 of the group); byte 2c + e of quad j holds
// row 16b + c: low nibble column 4j + e, high nibble column 4j + 2 + e.
//
// Math, per row r, group g (X = sum of the group's 32 activations):
//   w = s (q - 8) + z,   and bf16 bits 0x4300 | q are exactly the number 128 + q, so
//   acc = sum_k x_k (128 + q_k)               (vdpbf16ps on the widened codes)
//   y  += s acc + (z - 136 s) X               (= s sum x q - 8 s X + z X)
// Every output row is computed by the same instructions in the same order whatever the number of
// rows or threads, so a row's result never depends on its batch.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kGroup = 32;
constexpr int kBlockRows = 16;
constexpr int kGroupBytes = 256 + 64;
constexpr int kMaxRows = 4;  // activation rows per pass over a block (registers: 4 x 4 sums)
// prefetch this far ahead of the weights being read: 40 groups, the best of 4, 10, 20, 40 and 80
// on this project's AMD EPYC, where one thread then computes 3 rows for about the cost of one
constexpr int kPrefetch = 40 * kGroupBytes;

inline __m512 load_bf16x16(const uint16_t* p) {  // 16 bf16 -> 16 fp32 (exact)
  __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// acc += w . (the bf16 pair at p, in every lane): vdpbf16ps with an embedded broadcast (the
// compiler would spend an instruction on the broadcast).
inline void dp_pair(__m512& acc, __m512i w, const uint16_t* p) {
  asm("vdpbf16ps %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(p)));
}

// MB activation rows (MB <= 4) against one block of 16 output rows (its groups' bytes contiguous
// at `w`). Four sums per row (low/high nibbles x even/odd quads), added at each group's end, keep
// enough dot products in flight; the order is the same whatever MB is.
template <int MB>
void tile(const uint16_t* x, int64_t ldx, const float* xsum, int64_t groups, const uint8_t* w,
          float* y, int64_t ldy) {
  const __m512i low = _mm512_set1_epi16(0x000F);
  const __m512i magic = _mm512_set1_epi16(0x4300);
  __m512 out[MB];
  for (int m = 0; m < MB; ++m) out[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = w + g * kGroupBytes;
    for (int l = 0; l < kGroupBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetch + l), _MM_HINT_T0);
    __m512 acc[MB][4];
    for (int m = 0; m < MB; ++m)
      for (int c = 0; c < 4; ++c) acc[m][c] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const uint16_t* xc = x + g * kGroup + 4 * j;
      __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 32 * j)));
      // (a & b) | c as one ternary-logic op: imm 0xEA
      __m512i wl = _mm512_ternarylogic_epi32(bytes, low, magic, 0xEA);
      __m512i wh = _mm512_ternarylogic_epi32(_mm512_srli_epi16(bytes, 4), low, magic, 0xEA);
      if (j % 2 == 0) {
        for (int m = 0; m < MB; ++m) {
          dp_pair(acc[m][0], wl, xc + m * ldx);
          dp_pair(acc[m][1], wh, xc + m * ldx + 2);
        }
      } else {
        for (int m = 0; m < MB; ++m) {
          dp_pair(acc[m][2], wl, xc + m * ldx);
          dp_pair(acc[m][3], wh, xc + m * ldx + 2);
        }
      }
    }
    const uint16_t* sz = reinterpret_cast<const uint16_t*>(wg + 256);
    __m512 s = load_bf16x16(sz);
    __m512 z = _mm512_fmadd_ps(_mm512_set1_ps(-136.0f), s, load_bf16x16(sz + 16));
    for (int m = 0; m < MB; ++m) {
      __m512 a = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
      out[m] = _mm512_fmadd_ps(s, a, out[m]);
      out[m] = _mm512_fmadd_ps(z, _mm512_set1_ps(xsum[m * groups + g]), out[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * ldy, out[m]);
}

void rows_dispatch(int mb, const uint16_t* x, int64_t ldx, const float* xsum, int64_t groups,
                   const uint8_t* w, float* y, int64_t ldy) {
  switch (mb) {
    case 1: return tile<1>(x, ldx, xsum, groups, w, y, ldy);
    case 2: return tile<2>(x, ldx, xsum, groups, w, y, ldy);
    case 3: return tile<3>(x, ldx, xsum, groups, w, y, ldy);
    default: return tile<4>(x, ldx, xsum, groups, w, y, ldy);
  }
}

// each row's group sums, in a fixed order (column by column)
std::vector<float> group_sums(const uint16_t* xp, int64_t m, int64_t k) {
  const int64_t groups = k / kGroup;
  std::vector<float> xsum(m * groups);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int c = 0; c < kGroup; ++c) {
        uint32_t bits = static_cast<uint32_t>(xp[r * k + g * kGroup + c]) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        s += v;
      }
      xsum[r * groups + g] = s;
    }
  return xsum;
}

// x bf16 [M, K], w uint8 packed (see above) for [N, K]: y fp32 [M, N].
at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& w, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: bf16 [M, K]");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous(), "w: packed uint8");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % kGroup == 0 && n % kBlockRows == 0, "K % 32 and N % 16 must be 0");
  const int64_t groups = k / kGroup, blocks = n / kBlockRows;
  TORCH_CHECK(w.numel() == blocks * groups * kGroupBytes, "w does not match [N, K]");
  auto y = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0) return y;
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const std::vector<float> xsum = group_sums(xp, m, k);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  // threads split the blocks; a block's weights meet every chunk of 4 rows while in cache
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t r = 0; r < m; r += kMaxRows) {
        const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, m - r));
        rows_dispatch(mb, xp + r * k, k, xsum.data() + r * groups, groups, wp + b * groups * kGroupBytes,
                      yp + r * n + b * kBlockRows, n);
      }
  });
  return y;
}

// ---- int8 in groups of 32 (a scale and a zero per row and group), the same way ----------------
// Format (one matrix [N, K], N % 16 == 0, K % 32 == 0), two arrays:
//   codes: per block of 16 output rows, K / 2 pairs of 32 bytes: byte 2c + e of pair p is
//          Q[16b + c, 2p + e] (a group is 16 pairs, 512 bytes);
//   sz:    fp16 [N / 16, K / 32, 2, 16]: per block and group, the 16 rows' scales, then their zeros.
// Math, per row r, group g (X = sum of the group's 32 activations):
//   w = s q + z,   q an int8 (exact in bf16: |q| <= 128 needs 8 bits), so
//   y += s sum_k x_k q_k + z X      (every product exact, fp32 sums)
// GGUF blocks of 32 (Q8_0, Q5_0, Q4_0, Q4_1) are such groups exactly, with their fp16 d and m.

constexpr int kGroupBytes8 = kGroup * kBlockRows;  // 512 bytes of codes per block and group
constexpr int kPrefetch8 = 16384;  // bytes ahead (the int4 kernel's distance, in whole lines)

inline __m512i widen_int8_pair(const int8_t* q) {  // 32 int8 -> 32 bf16 (exact), in order
  __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

inline __m512 load_f16x16(const uint16_t* p) {  // 16 fp16 -> 16 fp32 (exact)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int MB>
void tile8(const uint16_t* x, int64_t ldx, const float* xsum, int64_t groups, const int8_t* w,
           const uint16_t* sz, float* y, int64_t ldy) {
  // per group, one sum per row and pair position mod 4, then scaled into the row's total: the same
  // order whatever MB is
  __m512 out[MB];
  for (int m = 0; m < MB; ++m) out[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* wg = w + g * kGroupBytes8;
    __m512 acc[MB][4];
    for (int m = 0; m < MB; ++m)
      for (int c = 0; c < 4; ++c) acc[m][c] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // 4 pairs, 128 bytes
      const int8_t* wc = wg + 128 * i;
      _mm_prefetch(reinterpret_cast<const char*>(wc + kPrefetch8), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wc + kPrefetch8 + 64), _MM_HINT_T0);
      const __m512i w0 = widen_int8_pair(wc), w1 = widen_int8_pair(wc + 32);
      const __m512i w2 = widen_int8_pair(wc + 64), w3 = widen_int8_pair(wc + 96);
      for (int m = 0; m < MB; ++m) {
        const uint16_t* xr = x + m * ldx + g * kGroup + 8 * i;
        dp_pair(acc[m][0], w0, xr);
        dp_pair(acc[m][1], w1, xr + 2);
        dp_pair(acc[m][2], w2, xr + 4);
        dp_pair(acc[m][3], w3, xr + 6);
      }
    }
    const uint16_t* szg = sz + g * 2 * kBlockRows;
    _mm_prefetch(reinterpret_cast<const char*>(szg + kPrefetch8 / 8), _MM_HINT_T0);
    const __m512 s = load_f16x16(szg), z = load_f16x16(szg + kBlockRows);
    for (int m = 0; m < MB; ++m) {
      __m512 a = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
      out[m] = _mm512_fmadd_ps(s, a, out[m]);
      out[m] = _mm512_fmadd_ps(z, _mm512_set1_ps(xsum[m * groups + g]), out[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * ldy, out[m]);
}

void rows_dispatch8(int mb, const uint16_t* x, int64_t ldx, const float* xsum, int64_t groups, const int8_t* w,
                    const uint16_t* sz, float* y, int64_t ldy) {
  switch (mb) {
    case 1: return tile8<1>(x, ldx, xsum, groups, w, sz, y, ldy);
    case 2: return tile8<2>(x, ldx, xsum, groups, w, sz, y, ldy);
    case 3: return tile8<3>(x, ldx, xsum, groups, w, sz, y, ldy);
    default: return tile8<4>(x, ldx, xsum, groups, w, sz, y, ldy);
  }
}

// x bf16 [M, K], codes int8 and sz fp16 packed (see above) for [N, K]: y fp32 [M, N].
at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sz) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: bf16 [M, K]");
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous(), "w: packed int8");
  TORCH_CHECK(sz.scalar_type() == at::kHalf && sz.is_contiguous(), "sz: packed fp16");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % kGroup == 0, "K % 32 must be 0");
  const int64_t groups = k / kGroup, n = w.numel() / k;
  TORCH_CHECK(n % kBlockRows == 0 && w.numel() == n * k && sz.numel() == n * groups * 2,
              "w and sz do not match [N, K]");
  auto y = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0) return y;
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const std::vector<float> xsum = group_sums(xp, m, k);
  const int8_t* wp = w.data_ptr<int8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::Half>());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n / kBlockRows, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t r = 0; r < m; r += kMaxRows) {
        const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, m - r));
        rows_dispatch8(mb, xp + r * k, k, xsum.data() + r * groups, groups, wp + b * kBlockRows * k,
                       sp + b * groups * 2 * kBlockRows, yp + r * n + b * kBlockRows, n);
      }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(hybridllm_cpu, lib) {
  lib.def("int4_mm(Tensor x, Tensor w, int n) -> Tensor", &int4_mm);
  lib.def("int8_mm(Tensor x, Tensor w, Tensor sz) -> Tensor", &int8_mm);
}
