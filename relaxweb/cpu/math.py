"""The math functions of ``kernels.wasm``, written in WAT: WebAssembly has no exp, log or sin
instruction and the module imports nothing but its memory, so the kernels call these.

``MATH_FUNCTIONS`` maps a name to the text of one ``(func $NAME ...)``; a function may call
others of the dict (``relaxweb.cpu.module.assemble_kernels_module`` adds what a kernel calls,
transitively, in the dict's order).  Every function exists as ``NAME_f32x4`` (v128 -> v128,
lane-wise, no branch, no loop: range reduction with f32x4 ops, a minimax polynomial, exponent
tricks with i32x4) and as ``NAME_f32`` (f32 -> f32: the vector form on a splat, lane 0):

    exp log tanh sigmoid sin cos tan asin acos atan asinh acosh atanh erf
                 (param f32) (result f32)
    pow          (param f32 f32) (result f32), WGSL's pow: NaN for a negative base
    unpack_half  (param i32) (result f32), the IEEE half in the low 16 bits (WGSL's
                 unpack2x16float(x).x: denormals, inf and NaN included)

plus helpers the public ones call (``log1p_f32x4``, ``sin_quadrant_f32x4``,
``asin_kernel_f32x4``, ``pow_f64x2``).  In the texts below ``(f32x4.const C)`` stands for
``(v128.const f32x4 C C C C)`` (and ``i32x4`` / ``f64x2`` / ``i64x2`` alike): a constant in
every lane, expanded when the dict is built.

Methods (Cephes' single-precision algorithms and coefficients, as SLEEF and XNNPACK use them):

- exp: n = round(x / ln2) (by adding 1.5 * 2^23, so n's integer is read off the sum's bits),
  r = x - n ln2 (Cody-Waite, two parts), a degree-7 polynomial, times
  2^n built as two exponent scalings (so 2^-150 .. 2^128 need no branch; denormal results are
  rounded once).  Inputs are clamped to [-104, 89], where the result is 0 / inf already.
- log: x = m 2^e with m in [sqrt(1/2), sqrt(2)) by subtracting sqrt(1/2)'s bits (denormals are
  scaled by 2^23 first), log(1 + f) = f - f^2/2 + f^3 P(f), then e ln2 in two parts.
  log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf.
- log1p(v) = log(u) + (v - (u - 1)) / u with u = 1 + v (the correction recovers what rounding
  u lost); the inverse hyperbolic functions use it.
- tanh: |x| < 0.625: x + x^3 P(x^2); else 1 - 2 / (exp(2|x|) + 1); the sign copied back.
- sigmoid: e = exp(-|x|), then one division: 1 / (1 + e) for x >= 0, e / (1 + e) below.
- sin, cos, tan: n = round(|x| 2/pi), r = |x| - n pi/2 with pi/2 in four parts (SLEEF's
  constants, few significant bits each, so n times a part is exact or nearly), sin or cos
  polynomials on [-pi/4, pi/4] chosen by the quadrant (tan: P(r) or -1 / P(r)).  Guaranteed
  (4 ulp) for |x| <= 39000, SLEEF's bound for these constants (measured: 2.4 ulp up to there,
  12.6 ulp at 1e5); beyond it the reduction loses bits gradually and r is clamped to
  [-0.8, 0.8], so sin and cos stay within [-1, 1] and tan finite; +-inf and NaN give NaN.
- asin, acos: |x| <= 0.5: x + x^3 P(x^2); above, asin(x) = pi/2 - 2 asin(sqrt((1 - x)/2))
  (acos from the same kernel, pi and pi/2 in two parts); |x| > 1 gives NaN.
- atan: the argument reduced to |t| <= tan(pi/8) by t = x, (x - 1)/(x + 1) or -1/x, plus
  0, pi/4 or pi/2, then t + t^3 P(t^2).
- asinh: |x| < 0.5: x + x^3 P(x^2); up to 1500: log1p(a + a^2 / (1 + sqrt(1 + a^2)));
  above: log(a) + ln2.  acosh: log1p(d + sqrt(d (x + 1))) with d = x - 1 (exact near 1),
  log(x) + ln2 above 1500; x < 1 gives NaN.  atanh: |x| < 0.5: x + x^3 P(x^2); above:
  log1p(2a / (1 - a)) / 2; +-1 gives +-inf, |x| > 1 NaN.
- erf: |x| < 1: x + x Q(x^2); up to 4: 1 - exp(G(|x| - 2.5) - x^2) (G fitted to
  log(erfc) + x^2, smooth there); 1 above; the sign copied back.  Not called by the compiler
  yet: relaxweb/ops/elementwise.py legalizes erf (and exact GELU) to a Taylor series and
  Numerical Recipes' erfc in TIR (2.4 ulp, 1.2e-7 absolute in float32 with an exact exp;
  about the same count of operations, with a division), which this would replace at 1.4 ulp.
- pow: computed in float64 lanes (two f64x2 halves): log(x) by atanh's series to 2^-40,
  t = y log(x), exp(t) by a degree-8 polynomial and an exponent built in i64x2, rounded to
  f32 once.  pow(x, 0) = 1 and pow(1, y) = 1 (NaN included), pow(0, y > 0) = 0,
  pow(0, y < 0) = inf, pow(inf, y) = inf or 0, NaN for x < 0 or NaN.
- unpack_half: the half's exponent and mantissa bits moved to f32's place and multiplied by
  2^112 (exact, denormal halves included); inf and NaN (exponent 31) by an i32x4 select.

Accuracy, measured against numpy in float64 (tests/cpu/test_cpu_math.py checks the bounds on ~4e5
points per function: dense samples of the domain, log-spaced magnitudes, special values; the
maxima below are over those and a sweep of 5.5e6 random points, random bit patterns included),
in ulps of the float32 result:

    function  max ulp  max rel.   domain sampled
    exp       0.97     8.1e-8     [-104, 89] (0 below, inf above)
    log       0.77     8.1e-8     (0, 3.4e38], denormals included
    tanh      1.31     1.4e-7     [-20, 20] (+-1 beyond)
    sigmoid   2.40     1.7e-7     [-110, 100]
    sin       2.36     1.7e-7     [-39000, 39000]
    cos       2.35     1.7e-7     [-39000, 39000]
    tan       3.43     2.4e-7     [-39000, 39000]
    asin      2.33     2.6e-7     [-1, 1]
    acos      1.13     1.2e-7     [-1, 1]
    atan      2.15     1.6e-7     [-1e4, 1e4] and +-inf
    asinh     1.61     1.6e-7     [-1e4, 1e4] and +-3.4e38
    acosh     2.43     1.8e-7     [1, 1e4] and 3.4e38
    atanh     1.24     1.1e-7     [-1, 1]
    erf       1.49     1.1e-7     [-5, 5] and +-3.4e38
    pow       0.50     6.0e-8     x in [2^-149, 3.4e38], |y| <= 150, a third of them integers
    unpack_half  exact            all 65536 halves

(max rel. over results of normal magnitude; the ulp column includes denormal results.)

Instruction counts of the vector forms (wasm instructions, constants included; the scalar forms
add a splat and an extract_lane; local.get / local.set not counted):

    exp 52, log 68, log1p 11 + log, tanh 32 + exp, sigmoid 10 + exp,
    sin / cos 57 (+ 6 / 3), tan 51, asin 26 + 13, acos 26 + 25, atan 43,
    asinh 35 + log1p + log, acosh 18 + log1p + log, atanh 31 + log1p, erf 63 + exp,
    pow 18 + 2 x 93 (float64 lanes), unpack_half 16

In wasmtime on this machine's x86 (a kernel over 2^20 elements, v128 loads and stores, min of
15 interleaved runs): exp 2.7 ns per element, log 4.0, sin 3.9, atan 2.6 (a plain copy: 1.1).
"""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------------------------
# exp: Cephes expf.  x = n ln2 + r, |r| <= ln2 / 2; exp(r) = 1 + r + r^2 P(r).
EXP = """
(func $exp_f32x4 (param $x v128) (result v128)
  (local $n v128) (local $r v128) (local $p v128) (local $k v128) (local $half v128)
  ;; beyond [-104, 89] the result is 0 or inf already; pmin / pmax
  ;; (one instruction each on x86, where min / max take several) return x when x is NaN
  (local.set $x (f32x4.pmax (f32x4.pmin (local.get $x) (f32x4.const 89.0)) (f32x4.const -104.0)))
  ;; n = x log2(e) rounded to the nearest integer (ties to even, as f32x4.nearest) by adding
  ;; 1.5 * 2^23, whose ulp is 1: the sum's low mantissa bits are n + 2^22 as an integer, so k
  ;; (n as i32) is the sum's bits less 1.5 * 2^23's, with no float-to-int conversion
  (local.set $k (f32x4.add (f32x4.mul (local.get $x) (f32x4.const 1.44269504088896341)) (f32x4.const 12582912.0)))
  (local.set $n (f32x4.sub (local.get $k) (f32x4.const 12582912.0)))
  (local.set $k (i32x4.sub (local.get $k) (i32x4.const 0x4b400000)))
  ;; r = x - n ln2, ln2 = 0.693359375 (exact times n) - 2.12194440e-4
  (local.set $r (f32x4.sub (f32x4.sub (local.get $x) (f32x4.mul (local.get $n) (f32x4.const 0.693359375)))
                           (f32x4.mul (local.get $n) (f32x4.const -2.12194440e-4))))
  (local.set $p (f32x4.add (f32x4.mul (local.get $r) (f32x4.const 1.9875691500e-4)) (f32x4.const 1.3981999507e-3)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (f32x4.const 8.3334519073e-3)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (f32x4.const 4.1665795894e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (f32x4.const 1.6666665459e-1)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r)) (f32x4.const 5.0000001201e-1)))
  (local.set $p (f32x4.add (f32x4.add (f32x4.mul (local.get $p) (f32x4.mul (local.get $r) (local.get $r)))
                                      (local.get $r))
                           (f32x4.const 1.0)))
  ;; times 2^n, n in [-150, 128], as 2^(n >> 1) * 2^(n - (n >> 1)): both normal numbers
  (local.set $half (i32x4.shr_s (local.get $k) (i32.const 1)))
  (f32x4.mul
    (f32x4.mul (local.get $p)
               (i32x4.shl (i32x4.add (local.get $half) (i32x4.const 127)) (i32.const 23)))
    (i32x4.shl (i32x4.add (i32x4.sub (local.get $k) (local.get $half)) (i32x4.const 127)) (i32.const 23))))
"""

# ---------------------------------------------------------------------------------------------
# log: Cephes logf.  x = m 2^e, m in [sqrt(1/2), sqrt(2)); log(m) = f - f^2 / 2 + f^3 P(f).
LOG = """
(func $log_f32x4 (param $x v128) (result v128)
  (local $tiny v128) (local $i v128) (local $e v128) (local $f v128) (local $z v128) (local $y v128)
  ;; denormals (and everything below the smallest normal) scaled by 2^23, e lowered by 23 below
  (local.set $tiny (f32x4.lt (local.get $x) (f32x4.const 1.17549435e-38)))
  (local.set $i (i32x4.sub
    (v128.bitselect (f32x4.mul (local.get $x) (f32x4.const 8388608.0)) (local.get $x) (local.get $tiny))
    (i32x4.const 0x3f3504f3)))
  ;; bits - bits(sqrt(1/2)): the exponent field counts from sqrt(1/2), the mantissa field is m's
  (local.set $e (f32x4.convert_i32x4_s
    (i32x4.sub (i32x4.shr_s (local.get $i) (i32.const 23)) (v128.and (local.get $tiny) (i32x4.const 23)))))
  (local.set $f (f32x4.sub
    (i32x4.add (v128.and (local.get $i) (i32x4.const 0x007fffff)) (i32x4.const 0x3f3504f3))
    (f32x4.const 1.0)))
  (local.set $z (f32x4.mul (local.get $f) (local.get $f)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $f) (f32x4.const 7.0376836292e-2)) (f32x4.const -1.1514610310e-1)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $f)) (f32x4.const 1.1676998740e-1)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $f)) (f32x4.const -1.2420140846e-1)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $f)) (f32x4.const 1.4249322787e-1)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $f)) (f32x4.const -1.6668057665e-1)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $f)) (f32x4.const 2.0000714765e-1)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $f)) (f32x4.const -2.4999993993e-1)))
  (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $f)) (f32x4.const 3.3333331174e-1)))
  ;; f + f^3 P(f) - f^2 / 2 + e ln2, ln2 in two parts, small terms first
  (local.set $y (f32x4.add (f32x4.mul (f32x4.mul (local.get $y) (local.get $f)) (local.get $z))
                           (f32x4.mul (local.get $e) (f32x4.const -2.12194440e-4))))
  (local.set $y (f32x4.add (f32x4.add (local.get $f)
                                      (f32x4.sub (local.get $y) (f32x4.mul (local.get $z) (f32x4.const 0.5))))
                           (f32x4.mul (local.get $e) (f32x4.const 0.693359375))))
  ;; log(+-0) = -inf, log(inf) = inf, log(x < 0) = log(NaN) = NaN
  (local.set $y (v128.bitselect (f32x4.const -inf) (local.get $y) (f32x4.eq (local.get $x) (f32x4.const 0.0))))
  (local.set $y (v128.bitselect (local.get $x) (local.get $y) (f32x4.eq (local.get $x) (f32x4.const inf))))
  (v128.bitselect (local.get $y) (f32x4.const nan) (f32x4.ge (local.get $x) (f32x4.const 0.0))))
"""

# log1p(v) = log(u) + (v - (u - 1)) / u, u = 1 + v: the correction is what rounding u lost
# (dropped where u is so large that it is below an ulp, and inf - inf would make it NaN).
LOG1P = """
(func $log1p_f32x4 (param $v v128) (result v128)
  (local $u v128)
  (local.set $u (f32x4.add (local.get $v) (f32x4.const 1.0)))
  (f32x4.add (call $log_f32x4 (local.get $u))
             (v128.and (f32x4.div (f32x4.sub (local.get $v) (f32x4.sub (local.get $u) (f32x4.const 1.0)))
                                  (local.get $u))
                       (f32x4.lt (local.get $u) (f32x4.const 16777216.0)))))
"""

# ---------------------------------------------------------------------------------------------
# tanh: Cephes tanhf.  |x| < 0.625: x + x^3 P(x^2); else 1 - 2 / (exp(2|x|) + 1).
TANH = """
(func $tanh_f32x4 (param $x v128) (result v128)
  (local $a v128) (local $z v128) (local $p v128)
  (local.set $a (f32x4.abs (local.get $x)))
  (local.set $z (f32x4.mul (local.get $a) (local.get $a)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $z) (f32x4.const -5.70498872745e-3)) (f32x4.const 2.06390887954e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const -5.37397155531e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 1.33314422036e-1)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const -3.33332819422e-1)))
  (local.set $p (f32x4.add (f32x4.mul (f32x4.mul (local.get $p) (local.get $z)) (local.get $a)) (local.get $a)))
  ;; the sign of x on whichever form |x| picks (NaN falls to the exp form and stays NaN)
  (v128.or
    (v128.and (local.get $x) (i32x4.const 0x80000000))
    (v128.bitselect
      (local.get $p)
      (f32x4.sub (f32x4.const 1.0)
                 (f32x4.div (f32x4.const 2.0)
                            (f32x4.add (call $exp_f32x4 (f32x4.add (local.get $a) (local.get $a))) (f32x4.const 1.0))))
      (f32x4.lt (local.get $a) (f32x4.const 0.625)))))
"""

# sigmoid: e = exp(-|x|) <= 1 never overflows (nor underflows before the result does);
# sigmoid(x) = 1 / (1 + e) for x >= 0 and e / (1 + e) below: one division of a selected numerator.
SIGMOID = """
(func $sigmoid_f32x4 (param $x v128) (result v128)
  (local $e v128)
  (local.set $e (call $exp_f32x4 (f32x4.neg (f32x4.abs (local.get $x)))))
  ;; NaN: e is NaN, and x >= 0 is false, so NaN / (NaN + 1)
  (f32x4.div (v128.bitselect (f32x4.const 1.0) (local.get $e) (f32x4.ge (local.get $x) (f32x4.const 0.0)))
             (f32x4.add (local.get $e) (f32x4.const 1.0))))
"""

# ---------------------------------------------------------------------------------------------
# sin, cos, tan: |x| = n pi/2 + r, |r| <= pi/4.  pi/2 in four parts (SLEEF's PI_A..D halved,
# few significant bits each, so n times a part is (nearly) exact for |x| <= 39000).
_REDUCE = """
  (local.set $n (f32x4.nearest (f32x4.mul (local.get $a) (f32x4.const 0.636619772367581343))))
  (local.set $r (f32x4.sub (local.get $a) (f32x4.mul (local.get $n) (f32x4.const 1.5703125))))
  (local.set $r (f32x4.sub (local.get $r) (f32x4.mul (local.get $n) (f32x4.const 4.8351287841796875e-4))))
  (local.set $r (f32x4.sub (local.get $r) (f32x4.mul (local.get $n) (f32x4.const 3.13855707645416259765625e-7))))
  (local.set $r (f32x4.sub (local.get $r) (f32x4.mul (local.get $n) (f32x4.const 6.077100628276710381e-11))))
  ;; beyond the guaranteed range the reduction loses bits: keep r where the polynomials hold
  (local.set $r (f32x4.pmax (f32x4.pmin (local.get $r) (f32x4.const 0.8)) (f32x4.const -0.8)))
  (local.set $z (f32x4.mul (local.get $r) (local.get $r)))"""

# sin(a + shift pi/2) for a >= 0 (or NaN) and shift 0 or 1: sin(r) or cos(r) by the quadrant.
SIN_QUADRANT = """
(func $sin_quadrant_f32x4 (param $a v128) (param $shift i32) (result v128)
  (local $n v128) (local $r v128) (local $z v128) (local $q v128) (local $s v128) (local $c v128)
""" + _REDUCE + """
  (local.set $q (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $n)) (i32x4.splat (local.get $shift))))
  ;; Cephes sinf / cosf polynomials on [-pi/4, pi/4]
  (local.set $s (f32x4.add (f32x4.mul (local.get $z) (f32x4.const -1.9515295891e-4)) (f32x4.const 8.3321608736e-3)))
  (local.set $s (f32x4.add (f32x4.mul (local.get $s) (local.get $z)) (f32x4.const -1.6666654611e-1)))
  (local.set $s (f32x4.add (f32x4.mul (f32x4.mul (local.get $s) (local.get $z)) (local.get $r)) (local.get $r)))
  (local.set $c (f32x4.add (f32x4.mul (local.get $z) (f32x4.const 2.443315711809948e-5)) (f32x4.const -1.388731625493765e-3)))
  (local.set $c (f32x4.add (f32x4.mul (local.get $c) (local.get $z)) (f32x4.const 4.166664568298827e-2)))
  (local.set $c (f32x4.add (f32x4.sub (f32x4.mul (f32x4.mul (local.get $c) (local.get $z)) (local.get $z))
                                      (f32x4.mul (local.get $z) (f32x4.const 0.5)))
                           (f32x4.const 1.0)))
  ;; quadrant q: sin r, cos r, -sin r, -cos r
  (v128.xor
    (v128.bitselect (local.get $c) (local.get $s)
                    (i32x4.eq (v128.and (local.get $q) (i32x4.const 1)) (i32x4.const 1)))
    (i32x4.shl (v128.and (local.get $q) (i32x4.const 2)) (i32.const 30))))
"""

SIN = """
(func $sin_f32x4 (param $x v128) (result v128)
  (v128.xor (call $sin_quadrant_f32x4 (f32x4.abs (local.get $x)) (i32.const 0))
            (v128.and (local.get $x) (i32x4.const 0x80000000))))
"""

COS = """
(func $cos_f32x4 (param $x v128) (result v128)
  (call $sin_quadrant_f32x4 (f32x4.abs (local.get $x)) (i32.const 1)))
"""

# tan: Cephes tanf polynomial on [-pi/4, pi/4]; odd quadrants -1 / tan(r).
TAN = """
(func $tan_f32x4 (param $x v128) (result v128)
  (local $a v128) (local $n v128) (local $r v128) (local $z v128) (local $t v128)
  (local.set $a (f32x4.abs (local.get $x)))
""" + _REDUCE + """
  (local.set $t (f32x4.add (f32x4.mul (local.get $z) (f32x4.const 9.38540185543e-3)) (f32x4.const 3.11992232697e-3)))
  (local.set $t (f32x4.add (f32x4.mul (local.get $t) (local.get $z)) (f32x4.const 2.44301354525e-2)))
  (local.set $t (f32x4.add (f32x4.mul (local.get $t) (local.get $z)) (f32x4.const 5.34112807005e-2)))
  (local.set $t (f32x4.add (f32x4.mul (local.get $t) (local.get $z)) (f32x4.const 1.33387994085e-1)))
  (local.set $t (f32x4.add (f32x4.mul (local.get $t) (local.get $z)) (f32x4.const 3.33331568548e-1)))
  (local.set $t (f32x4.add (f32x4.mul (f32x4.mul (local.get $t) (local.get $z)) (local.get $r)) (local.get $r)))
  (v128.xor
    (v128.bitselect (f32x4.div (f32x4.const -1.0) (local.get $t)) (local.get $t)
                    (i32x4.eq (v128.and (i32x4.trunc_sat_f32x4_s (local.get $n)) (i32x4.const 1)) (i32x4.const 1)))
    (v128.and (local.get $x) (i32x4.const 0x80000000))))
"""

# ---------------------------------------------------------------------------------------------
# asin, acos: Cephes asinf.  For a = |x| <= 0.5 the kernel returns asin(a); above, asin(s) with
# s = sqrt((1 - a) / 2) (NaN for a > 1), and asin(a) = pi/2 - 2 asin(s).
ASIN_KERNEL = """
(func $asin_kernel_f32x4 (param $a v128) (result v128)
  (local $big v128) (local $z v128) (local $s v128) (local $p v128)
  (local.set $big (f32x4.gt (local.get $a) (f32x4.const 0.5)))
  (local.set $z (v128.bitselect
    (f32x4.mul (f32x4.sub (f32x4.const 1.0) (local.get $a)) (f32x4.const 0.5))
    (f32x4.mul (local.get $a) (local.get $a))
    (local.get $big)))
  (local.set $s (v128.bitselect (f32x4.sqrt (local.get $z)) (local.get $a) (local.get $big)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $z) (f32x4.const 4.2163199048e-2)) (f32x4.const 2.4181311049e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 4.5470025998e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 7.4953002686e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 1.6666752422e-1)))
  (f32x4.add (f32x4.mul (f32x4.mul (local.get $p) (local.get $z)) (local.get $s)) (local.get $s)))
"""

# pi/2 = 1.57079637 - 4.37113883e-8, pi = 3.14159274 - 8.74227766e-8 (float32 + remainder)
ASIN = """
(func $asin_f32x4 (param $x v128) (result v128)
  (local $a v128) (local $p v128)
  (local.set $a (f32x4.abs (local.get $x)))
  (local.set $p (call $asin_kernel_f32x4 (local.get $a)))
  (v128.xor
    (v128.bitselect
      (f32x4.add (f32x4.sub (f32x4.const -4.37113883e-8) (f32x4.add (local.get $p) (local.get $p)))
                 (f32x4.const 1.57079637))
      (local.get $p)
      (f32x4.gt (local.get $a) (f32x4.const 0.5)))
    (v128.and (local.get $x) (i32x4.const 0x80000000))))
"""

# acos(x) = hi + (lo + t): |x| > 0.5: x > 0: 0 + (0 + 2p), x < 0: pi - 2p;
# |x| <= 0.5: pi/2 - asin(x) with asin(x) = p with x's sign.
ACOS = """
(func $acos_f32x4 (param $x v128) (result v128)
  (local $big v128) (local $neg v128) (local $sign v128) (local $p v128)
  (local.set $big (f32x4.gt (f32x4.abs (local.get $x)) (f32x4.const 0.5)))
  (local.set $neg (i32x4.shr_s (local.get $x) (i32.const 31)))
  (local.set $sign (v128.and (local.get $x) (i32x4.const 0x80000000)))
  (local.set $p (call $asin_kernel_f32x4 (f32x4.abs (local.get $x))))
  (f32x4.add
    (v128.bitselect (v128.and (local.get $neg) (f32x4.const 3.14159274)) (f32x4.const 1.57079637) (local.get $big))
    (f32x4.add
      (v128.bitselect (v128.and (local.get $neg) (f32x4.const -8.74227766e-8)) (f32x4.const -4.37113883e-8) (local.get $big))
      (v128.bitselect
        (v128.xor (f32x4.add (local.get $p) (local.get $p)) (local.get $sign))
        (v128.xor (local.get $p) (v128.xor (local.get $sign) (i32x4.const 0x80000000)))
        (local.get $big)))))
"""

# atan: Cephes atanf.  a = |x| > tan(3pi/8): pi/2 + atan(-1/a); a > tan(pi/8): pi/4 +
# atan((a - 1)/(a + 1)); else atan(a): one division with the numerator and denominator selected.
ATAN = """
(func $atan_f32x4 (param $x v128) (result v128)
  (local $a v128) (local $big v128) (local $mid v128) (local $t v128) (local $z v128) (local $p v128)
  (local.set $a (f32x4.abs (local.get $x)))
  (local.set $big (f32x4.gt (local.get $a) (f32x4.const 2.414213562373095)))
  (local.set $mid (f32x4.gt (local.get $a) (f32x4.const 0.4142135623730950)))
  (local.set $t (f32x4.div
    (v128.bitselect (f32x4.const -1.0) (v128.bitselect (f32x4.sub (local.get $a) (f32x4.const 1.0)) (local.get $a) (local.get $mid)) (local.get $big))
    (v128.bitselect (local.get $a) (v128.bitselect (f32x4.add (local.get $a) (f32x4.const 1.0)) (f32x4.const 1.0) (local.get $mid)) (local.get $big))))
  (local.set $z (f32x4.mul (local.get $t) (local.get $t)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $z) (f32x4.const 8.05374449538e-2)) (f32x4.const -1.38776856032e-1)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 1.99777106478e-1)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const -3.33329491539e-1)))
  (local.set $p (f32x4.add (f32x4.mul (f32x4.mul (local.get $p) (local.get $z)) (local.get $t)) (local.get $t)))
  ;; + pi/2 or pi/4 (float32 + remainder), or + 0
  (local.set $p (f32x4.add
    (f32x4.add (local.get $p)
               (v128.bitselect (f32x4.const -4.37113883e-8) (v128.and (local.get $mid) (f32x4.const -2.18556941e-8)) (local.get $big)))
    (v128.bitselect (f32x4.const 1.57079637) (v128.and (local.get $mid) (f32x4.const 0.785398185)) (local.get $big))))
  (v128.xor (local.get $p) (v128.and (local.get $x) (i32x4.const 0x80000000))))
"""

# ---------------------------------------------------------------------------------------------
# asinh: Cephes asinhf below 0.5; log1p(a + a^2 / (1 + sqrt(1 + a^2))) up to 1500; log(a) + ln2.
ASINH = """
(func $asinh_f32x4 (param $x v128) (result v128)
  (local $a v128) (local $z v128) (local $p v128) (local $huge v128) (local $l v128)
  (local.set $a (f32x4.abs (local.get $x)))
  (local.set $z (f32x4.mul (local.get $a) (local.get $a)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $z) (f32x4.const 2.0122003309e-2)) (f32x4.const -4.2699340972e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 7.4847586088e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const -1.6666288134e-1)))
  (local.set $p (f32x4.add (f32x4.mul (f32x4.mul (local.get $p) (local.get $z)) (local.get $a)) (local.get $a)))
  (local.set $huge (f32x4.gt (local.get $a) (f32x4.const 1500.0)))
  (local.set $l (v128.bitselect
    (f32x4.add (call $log_f32x4 (local.get $a)) (f32x4.const 0.693147181))
    (call $log1p_f32x4
      (f32x4.add (local.get $a)
                 (f32x4.div (local.get $z)
                            (f32x4.add (f32x4.const 1.0) (f32x4.sqrt (f32x4.add (local.get $z) (f32x4.const 1.0)))))))
    (local.get $huge)))
  (v128.or
    (v128.bitselect (local.get $p) (local.get $l) (f32x4.lt (local.get $a) (f32x4.const 0.5)))
    (v128.and (local.get $x) (i32x4.const 0x80000000))))
"""

# acosh: log1p(d + sqrt(d (x + 1))), d = x - 1 (exact near 1); log(x) + ln2 above 1500;
# NaN below 1 (-huge would give d (x + 1) = inf otherwise).
ACOSH = """
(func $acosh_f32x4 (param $x v128) (result v128)
  (local $d v128)
  (local.set $d (f32x4.sub (local.get $x) (f32x4.const 1.0)))
  (v128.bitselect
    (v128.bitselect
      (f32x4.add (call $log_f32x4 (local.get $x)) (f32x4.const 0.693147181))
      (call $log1p_f32x4
        (f32x4.add (local.get $d)
                   (f32x4.sqrt (f32x4.mul (local.get $d) (f32x4.add (local.get $x) (f32x4.const 1.0))))))
      (f32x4.gt (local.get $x) (f32x4.const 1500.0)))
    (f32x4.const nan)
    (f32x4.ge (local.get $x) (f32x4.const 1.0))))
"""

# atanh: Cephes atanhf below 0.5; log1p(2a / (1 - a)) / 2 above.
ATANH = """
(func $atanh_f32x4 (param $x v128) (result v128)
  (local $a v128) (local $z v128) (local $p v128)
  (local.set $a (f32x4.abs (local.get $x)))
  (local.set $z (f32x4.mul (local.get $a) (local.get $a)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $z) (f32x4.const 1.81740078349e-1)) (f32x4.const 8.24370301058e-2)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 1.46691431730e-1)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 1.99782164500e-1)))
  (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $z)) (f32x4.const 3.33337300303e-1)))
  (local.set $p (f32x4.add (f32x4.mul (f32x4.mul (local.get $p) (local.get $z)) (local.get $a)) (local.get $a)))
  (v128.or
    (v128.bitselect
      (local.get $p)
      (f32x4.mul (f32x4.const 0.5)
                 (call $log1p_f32x4 (f32x4.div (f32x4.add (local.get $a) (local.get $a))
                                               (f32x4.sub (f32x4.const 1.0) (local.get $a)))))
      (f32x4.lt (local.get $a) (f32x4.const 0.5)))
    (v128.and (local.get $x) (i32x4.const 0x80000000))))
"""

# ---------------------------------------------------------------------------------------------
# erf: |x| < 1: x + x Q(x^2); 1 <= |x| <= 4: 1 - erfc with erfc(a) = exp(G(a - 2.5) - a^2)
# (log(erfc(a)) + a^2 is smooth there); above 4, erf rounds to 1 (a clamped to 4).  Q and G
# were fitted for this file (weighted least squares iterated towards minimax, Lawson's method,
# against math.erf / math.erfc in float64): Q's degree 6 is within 1.4e-9 relative, G's
# degree 8 within 1.2e-8 absolute (times erfc <= 0.16 in the result).
ERF = """
(func $erf_f32x4 (param $x v128) (result v128)
  (local $a v128) (local $z v128) (local $q v128) (local $c v128) (local $t v128) (local $g v128)
  (local.set $a (f32x4.abs (local.get $x)))
  (local.set $z (f32x4.mul (local.get $a) (local.get $a)))
  (local.set $q (f32x4.add (f32x4.mul (local.get $z) (f32x4.const 7.889119e-05)) (f32x4.const -0.0008020841)))
  (local.set $q (f32x4.add (f32x4.mul (local.get $q) (local.get $z)) (f32x4.const 0.005189535)))
  (local.set $q (f32x4.add (f32x4.mul (local.get $q) (local.get $z)) (f32x4.const -0.026854444)))
  (local.set $q (f32x4.add (f32x4.mul (local.get $q) (local.get $z)) (f32x4.const 0.112836)))
  (local.set $q (f32x4.add (f32x4.mul (local.get $q) (local.get $z)) (f32x4.const -0.37612626)))
  (local.set $q (f32x4.add (f32x4.mul (local.get $q) (local.get $z)) (f32x4.const 0.12837917)))
  (local.set $q (f32x4.add (f32x4.mul (local.get $q) (local.get $a)) (local.get $a)))
  ;; 1 - exp(G(c - 2.5) - c^2), c = min(|x|, 4) (pmin returns a NaN a)
  (local.set $c (f32x4.pmin (local.get $a) (f32x4.const 4.0)))
  (local.set $t (f32x4.sub (local.get $c) (f32x4.const 2.5)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $t) (f32x4.const 2.5077267e-07)) (f32x4.const -2.0292682e-05)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $g) (local.get $t)) (f32x4.const 6.474672e-05)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $g) (local.get $t)) (f32x4.const -0.00042824436)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $g) (local.get $t)) (f32x4.const 0.0021670628)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $g) (local.get $t)) (f32x4.const -0.010854255)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $g) (local.get $t)) (f32x4.const 0.05610767)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $g) (local.get $t)) (f32x4.const -0.35268068)))
  (local.set $g (f32x4.add (f32x4.mul (local.get $g) (local.get $t)) (f32x4.const -1.5568153)))
  (v128.or
    (v128.bitselect
      (local.get $q)
      (f32x4.sub (f32x4.const 1.0)
                 (call $exp_f32x4 (f32x4.sub (local.get $g) (f32x4.mul (local.get $c) (local.get $c)))))
      (f32x4.lt (local.get $a) (f32x4.const 1.0)))
    (v128.and (local.get $x) (i32x4.const 0x80000000))))
"""

# ---------------------------------------------------------------------------------------------
# pow in float64 lanes: x (float32, so no f64 denormal) = m 2^e, m in [sqrt(1/2), sqrt(2));
# log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172: the series to s^13 is within 2^-40.
# exp(t) = 2^n exp(r), |r| <= ln2 / 2: Taylor to r^8 is within 2^-31.  One rounding to f32 at
# the end (by the caller), so the result is within an ulp wherever t = y log(x) is exact enough.
POW_F64X2 = """
(func $pow_f64x2 (param $x v128) (param $y v128) (result v128)
  (local $i v128) (local $e v128) (local $f v128) (local $s v128) (local $z v128) (local $l v128)
  (local $n v128) (local $r v128) (local $p v128)
  (local.set $i (i64x2.sub (local.get $x) (i64x2.const 0x3fe6a09e667f3bcd)))
  ;; e: the high i64 halves' exponents as f64 (i32 lanes 0 and 2 of the shifted bits)
  (local.set $e (f64x2.convert_low_i32x4_s
    (i8x16.shuffle 0 1 2 3 8 9 10 11 0 1 2 3 8 9 10 11 (i64x2.shr_s (local.get $i) (i32.const 52)) (local.get $i))))
  (local.set $f (f64x2.sub
    (i64x2.add (v128.and (local.get $i) (i64x2.const 0x000fffffffffffff)) (i64x2.const 0x3fe6a09e667f3bcd))
    (f64x2.const 1.0)))
  (local.set $s (f64x2.div (local.get $f) (f64x2.add (local.get $f) (f64x2.const 2.0))))
  (local.set $z (f64x2.mul (local.get $s) (local.get $s)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $z) (f64x2.const 0.15384615384615385)) (f64x2.const 0.18181818181818182)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $z)) (f64x2.const 0.2222222222222222)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $z)) (f64x2.const 0.2857142857142857)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $z)) (f64x2.const 0.4)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $z)) (f64x2.const 0.6666666666666666)))
  (local.set $l (f64x2.add
    (f64x2.add (f64x2.mul (f64x2.mul (local.get $p) (local.get $z)) (local.get $s)) (f64x2.add (local.get $s) (local.get $s)))
    (f64x2.mul (local.get $e) (f64x2.const 0.6931471805599453))))
  ;; log(0) = -inf, log(inf) = inf, log(x < 0) = log(NaN) = NaN
  (local.set $l (v128.bitselect (f64x2.const -inf) (local.get $l) (f64x2.eq (local.get $x) (f64x2.const 0.0))))
  (local.set $l (v128.bitselect (local.get $x) (local.get $l) (f64x2.eq (local.get $x) (f64x2.const inf))))
  (local.set $l (v128.bitselect (local.get $l) (f64x2.const nan) (f64x2.ge (local.get $x) (f64x2.const 0.0))))
  ;; exp(y log x): beyond [-110, 100] the float32 result is 0 or inf already
  (local.set $r (f64x2.pmax (f64x2.pmin (f64x2.mul (local.get $y) (local.get $l)) (f64x2.const 100.0)) (f64x2.const -110.0)))
  (local.set $n (f64x2.nearest (f64x2.mul (local.get $r) (f64x2.const 1.4426950408889634))))
  (local.set $r (f64x2.sub (local.get $r) (f64x2.mul (local.get $n) (f64x2.const 0.6931471805599453))))
  (local.set $p (f64x2.add (f64x2.mul (local.get $r) (f64x2.const 2.48015873015873e-05)) (f64x2.const 1.984126984126984e-04)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $r)) (f64x2.const 1.388888888888889e-03)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $r)) (f64x2.const 8.333333333333333e-03)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $r)) (f64x2.const 4.1666666666666664e-02)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $r)) (f64x2.const 0.16666666666666666)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $r)) (f64x2.const 0.5)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $r)) (f64x2.const 1.0)))
  (local.set $p (f64x2.add (f64x2.mul (local.get $p) (local.get $r)) (f64x2.const 1.0)))
  ;; times 2^n, n in [-159, 145]: (n + 1023) << 52
  (f64x2.mul (local.get $p)
             (i64x2.shl (i64x2.add (i64x2.extend_low_i32x4_s (i32x4.trunc_sat_f64x2_s_zero (local.get $n)))
                                   (i64x2.const 1023))
                        (i32.const 52))))
"""

# pow_f32x4: lanes 0-1 and 2-3 as two f64x2 halves, rounded to f32 once each, joined;
# then pow(x, 0) = pow(1, y) = 1 (also for NaN y or x, as IEEE pow and WGSL's exp2 formula).
POW = """
(func $pow_f32x4 (param $x v128) (param $y v128) (result v128)
  (local $high_x v128) (local $high_y v128)
  (local.set $high_x (i8x16.shuffle 8 9 10 11 12 13 14 15 8 9 10 11 12 13 14 15 (local.get $x) (local.get $x)))
  (local.set $high_y (i8x16.shuffle 8 9 10 11 12 13 14 15 8 9 10 11 12 13 14 15 (local.get $y) (local.get $y)))
  (v128.bitselect
    (f32x4.const 1.0)
    (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23
      (f32x4.demote_f64x2_zero
        (call $pow_f64x2 (f64x2.promote_low_f32x4 (local.get $x)) (f64x2.promote_low_f32x4 (local.get $y))))
      (f32x4.demote_f64x2_zero
        (call $pow_f64x2 (f64x2.promote_low_f32x4 (local.get $high_x)) (f64x2.promote_low_f32x4 (local.get $high_y)))))
    (v128.or (f32x4.eq (local.get $y) (f32x4.const 0.0)) (f32x4.eq (local.get $x) (f32x4.const 1.0)))))
"""

# ---------------------------------------------------------------------------------------------
# unpack_half: the half's exponent and mantissa (bits 0-14) shifted to f32's place read as a
# float are the value times 2^-112 (denormal halves included: they become f32 denormals);
# exponent 31 (inf, NaN) gets f32's all-ones exponent instead.
UNPACK_HALF = """
(func $unpack_half_f32x4 (param $h v128) (result v128)
  (local $bits v128)
  (local.set $bits (i32x4.shl (v128.and (local.get $h) (i32x4.const 0x7fff)) (i32.const 13)))
  (v128.or
    (i32x4.shl (v128.and (local.get $h) (i32x4.const 0x8000)) (i32.const 16))
    (v128.bitselect
      (v128.or (local.get $bits) (i32x4.const 0x7f800000))
      (f32x4.mul (local.get $bits) (f32x4.const 0x1p112))
      (i32x4.gt_s (local.get $bits) (i32x4.const 0x0f7fe000)))))
"""

# ---------------------------------------------------------------------------------------------
UNARY = ["exp", "log", "tanh", "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan",
         "asinh", "acosh", "atanh", "erf"]


def _scalar_form(name: str, params: list[str], result: str) -> str:
    """``NAME_f32``: ``NAME_f32x4`` on splats of its arguments, lane 0."""
    splats = " ".join(f"({'f32x4' if kind == 'f32' else 'i32x4'}.splat (local.get $a{i}))"
                      for i, kind in enumerate(params))
    signature = " ".join(f"(param $a{i} {kind})" for i, kind in enumerate(params))
    return (f"(func ${name}_f32 {signature} (result {result})\n"
            f"  (f32x4.extract_lane 0 (call ${name}_f32x4 {splats})))")


_CONSTANT = re.compile(r"\((f32x4|i32x4|f64x2|i64x2)\.const ([^()\s]+)\)")


def _expanded(text: str) -> str:
    """``(f32x4.const C)`` -> ``(v128.const f32x4 C C C C)`` (and the other lane shapes)."""
    def constant(match: re.Match) -> str:
        shape, value = match.groups()
        return f"(v128.const {shape} {' '.join([value] * int(shape[4:]))})"
    return _CONSTANT.sub(constant, text.strip())


_VECTOR_FORMS = [EXP, LOG, LOG1P, TANH, SIGMOID, SIN_QUADRANT, SIN, COS, TAN, ASIN_KERNEL, ASIN, ACOS,
                 ATAN, ASINH, ACOSH, ATANH, ERF, POW_F64X2, POW, UNPACK_HALF]
_SCALAR_FORMS = ([_scalar_form(name, ["f32"], "f32") for name in UNARY]
                 + [_scalar_form("pow", ["f32", "f32"], "f32"), _scalar_form("unpack_half", ["i32"], "f32")])


def _name(text: str) -> str:
    return re.match(r"\(func \$([A-Za-z0-9_]+)", text).group(1)


MATH_FUNCTIONS: dict[str, str] = {_name(text): text
                                  for text in (_expanded(t) for t in _VECTOR_FORMS + _SCALAR_FORMS)}
