"""The integer helper functions of kernels.wasm, as WAT (name -> text), called by the
expression emitter's renderings (``relaxweb/cpu/emit.py``) and added to the module where a
kernel calls them (``relaxweb/cpu/kernels.py``): division and remainder that never trap, minima
and maxima, run-time index checks and clamps, the integer checks of
``relaxweb/ir/integer_checks.py``, and float16 rounding.  The ``_i64`` ones serve int64, which
kernels.wasm holds and computes exactly.
"""

from __future__ import annotations

# Integer helpers the renderings call, added to kernels.wasm where used (name -> WAT).  Integer
# division and remainder follow WGSL, which defines every case: wasm's i32.div_s traps on a
# zero divisor and on INT_MIN / -1, i32.rem_s on a zero divisor.
HELPER_FUNCTIONS: dict[str, str] = {
    "div_s_i32": """\
;; WGSL's a / b on i32: truncates; a / 0 is a, INT_MIN / -1 is INT_MIN (no trap)
(func $div_s_i32 (param $a i32) (param $b i32) (result i32)
  (if (result i32) (i32.or (i32.eqz (local.get $b))
                           (i32.and (i32.eq (local.get $a) (i32.const 0x80000000)) (i32.eq (local.get $b) (i32.const -1))))
    (then (local.get $a))
    (else (i32.div_s (local.get $a) (local.get $b)))))""",
    "rem_s_i32": """\
;; WGSL's a % b on i32: takes a's sign; a % 0 is 0 (INT_MIN % -1 is 0 in wasm too)
(func $rem_s_i32 (param $a i32) (param $b i32) (result i32)
  (if (result i32) (i32.eqz (local.get $b))
    (then (i32.const 0))
    (else (i32.rem_s (local.get $a) (local.get $b)))))""",
    "div_u32": """\
;; WGSL's a / b on u32: a / 0 is a
(func $div_u32 (param $a i32) (param $b i32) (result i32)
  (if (result i32) (i32.eqz (local.get $b))
    (then (local.get $a))
    (else (i32.div_u (local.get $a) (local.get $b)))))""",
    "floor_div_i32": """\
;; the IR's a // b: rounds toward negative infinity (one less than the truncated quotient
;; where the remainder is not 0 and the signs differ)
(func $floor_div_i32 (param $a i32) (param $b i32) (result i32)
  (i32.sub (call $div_s_i32 (local.get $a) (local.get $b))
           (i32.and (i32.ne (call $rem_s_i32 (local.get $a) (local.get $b)) (i32.const 0))
                    (i32.lt_s (i32.xor (local.get $a) (local.get $b)) (i32.const 0)))))""",
    "floor_mod_i32": """\
;; the IR's a % b: takes b's sign (the truncated remainder plus b where their signs differ)
(func $floor_mod_i32 (param $a i32) (param $b i32) (result i32)
  (local $remainder i32)
  (local.set $remainder (call $rem_s_i32 (local.get $a) (local.get $b)))
  (select (i32.add (local.get $remainder) (local.get $b)) (local.get $remainder)
          (i32.and (i32.ne (local.get $remainder) (i32.const 0))
                   (i32.lt_s (i32.xor (local.get $remainder) (local.get $b)) (i32.const 0)))))""",
    **{f"{name}_{suffix}": f"""\
(func ${name}_{suffix} (param $a {kind}) (param $b {kind}) (result {kind})
  (select (local.get $a) (local.get $b) ({kind}.{compare}_{sign} (local.get $a) (local.get $b))))"""
       for name, compare in (("max", "gt"), ("min", "lt"))
       for suffix, kind, sign in (("s_i32", "i32", "s"), ("u32", "i32", "u"), ("s_i64", "i64", "s"))},
    "div_s_i64": """\
;; a / b on int64 as on i32: truncates; a / 0 is a, INT64_MIN / -1 is INT64_MIN (no trap)
(func $div_s_i64 (param $a i64) (param $b i64) (result i64)
  (if (result i64) (i32.or (i64.eqz (local.get $b))
                           (i32.and (i64.eq (local.get $a) (i64.const 0x8000000000000000))
                                    (i64.eq (local.get $b) (i64.const -1))))
    (then (local.get $a))
    (else (i64.div_s (local.get $a) (local.get $b)))))""",
    "clamp_index_i64": """\
;; an int64 run-time index clamped into [0, extent - 1] (0 for an empty extent), as an i32
(func $clamp_index_i64 (param $index i64) (param $extent i32) (result i32)
  (i32.wrap_i64
    (call $max_s_i64 (call $min_s_i64 (local.get $index) (i64.sub (i64.extend_i32_s (local.get $extent)) (i64.const 1)))
                     (i64.const 0))))""",
    "checked_index_i64": """\
;; a checked int64 index (as $checked_index_i32): wrapped when negative; out of range it is
;; reported (the site, the index as given saturated into i32, the extent) and clamped
(func $checked_index_i64 (param $index i64) (param $extent i32) (param $site i32) (param $status i32) (result i32)
  (local $wrapped i64)
  (local $extent64 i64)
  (local.set $extent64 (i64.extend_i32_s (local.get $extent)))
  (local.set $wrapped (select (i64.add (local.get $index) (local.get $extent64)) (local.get $index)
                              (i64.lt_s (local.get $index) (i64.const 0))))
  (if (i32.and (i64.ge_s (local.get $wrapped) (i64.const 0)) (i64.lt_s (local.get $wrapped) (local.get $extent64)))
    (then (return (i32.wrap_i64 (local.get $wrapped)))))
  (call $report_error (local.get $site)
        (i32.wrap_i64 (call $max_s_i64 (call $min_s_i64 (local.get $index) (i64.const 0x7fffffff))
                                       (i64.const -0x80000000)))
        (local.get $extent) (local.get $status))
  (call $clamp_index_i64 (local.get $wrapped) (local.get $extent)))""",
    "clamp_index_i32": """\
;; a run-time index clamped into [0, extent - 1] (0 for an empty extent)
(func $clamp_index_i32 (param $index i32) (param $extent i32) (result i32)
  (call $max_s_i32 (call $min_s_i32 (local.get $index) (i32.sub (local.get $extent) (i32.const 1))) (i32.const 0)))""",
    "report_error": """\
;; the run's error at $site with two values, into the run status at $status (this thread's:
;; relaxweb/ir/error_sites.py) unless an error was reported before: the first one wins
(func $report_error (param $site i32) (param $value0 i32) (param $value1 i32) (param $status i32)
  (if (i32.eqz (i32.load (local.get $status)))
    (then
      (i32.store (local.get $status) (local.get $site))
      (i32.store offset=4 (local.get $status) (local.get $value0))
      (i32.store offset=8 (local.get $status) (local.get $value1)))))""",
    "checked_index_i32": """\
;; a checked index: wrapped when negative; out of range it is reported (the site, the index as
;; given, the extent) and clamped into [0, extent - 1]
(func $checked_index_i32 (param $index i32) (param $extent i32) (param $site i32) (param $status i32) (result i32)
  (local $wrapped i32)
  (local.set $wrapped (select (i32.add (local.get $index) (local.get $extent)) (local.get $index)
                              (i32.lt_s (local.get $index) (i32.const 0))))
  (if (i32.and (i32.ge_s (local.get $wrapped) (i32.const 0)) (i32.lt_s (local.get $wrapped) (local.get $extent)))
    (then (return (local.get $wrapped))))
  (call $report_error (local.get $site) (local.get $index) (local.get $extent) (local.get $status))
  (call $clamp_index_i32 (local.get $wrapped) (local.get $extent)))""",
    # The integer checks (relaxweb/ir/integer_checks.py): the exact result in i64, reported
    # into the run status at $status unless an error was reported before where it does not
    # fit i32; a zero divisor reported and divided as 1.
    "report_check": """\
(func $report_check (param $site i32) (param $status i32)
  (if (i32.eqz (i32.load (local.get $status)))
    (then (i32.store (local.get $status) (local.get $site)))))""",
    "fit_i32": """\
(func $fit_i32 (param $exact i64) (param $site i32) (param $status i32) (result i32)
  (if (i64.ne (local.get $exact) (i64.extend_i32_s (i32.wrap_i64 (local.get $exact))))
    (then (call $report_check (local.get $site) (local.get $status))))
  (i32.wrap_i64 (local.get $exact)))""",
    "checked_div_i32": """\
(func $checked_div_i32 (param $a i32) (param $b i32) (param $site i32) (param $status i32) (result i32)
  (if (i32.and (i32.eq (local.get $a) (i32.const 0x80000000)) (i32.eq (local.get $b) (i32.const -1)))
    (then (call $report_check (local.get $site) (local.get $status))))
  (call $div_s_i32 (local.get $a) (local.get $b)))""",
    "checked_cast_f32": """\
(func $checked_cast_f32 (param $x f32) (param $site i32) (param $status i32) (result i32)
  (if (i32.eqz (i32.and (f32.ge (local.get $x) (f32.const -0x1p31)) (f32.lt (local.get $x) (f32.const 0x1p31))))
    (then (call $report_check (local.get $site) (local.get $status))))
  (i32.trunc_sat_f32_s (local.get $x)))""",
    "checked_cast_u32": """\
(func $checked_cast_u32 (param $x i32) (param $site i32) (param $status i32) (result i32)
  (if (i32.lt_s (local.get $x) (i32.const 0))
    (then (call $report_check (local.get $site) (local.get $status))))
  (local.get $x))""",
    **{f"checked_divisor_{kind}": f"""\
(func $checked_divisor_{kind} (param $d {kind}) (param $site i32) (param $status i32) (result {kind})
  (if (result {kind}) ({kind}.eqz (local.get $d))
    (then (call $report_check (local.get $site) (local.get $status)) ({kind}.const 1))
    (else (local.get $d))))""" for kind in ("i32", "i64")},
    "round_half_f32": """\
;; x rounded to the nearest float16 (halves to even), as a float32: WGSL's
;; unpack2x16float(pack2x16float(x)); beyond float16's range an infinity, NaN stays NaN
(func $round_half_f32 (param $x f32) (result f32)
  (local $bits i32)
  (if (result f32) (f32.ge (f32.abs (local.get $x)) (f32.const 65520))
    (then (f32.copysign (f32.const inf) (local.get $x)))
    (else
      (if (result f32) (f32.lt (f32.abs (local.get $x)) (f32.const 0x1p-14))
        (then (f32.mul (f32.nearest (f32.mul (local.get $x) (f32.const 0x1p24))) (f32.const 0x1p-24)))
        (else
          ;; keep 10 mantissa bits: add half of the dropped unit (less one where the kept lsb is 0)
          (local.set $bits (i32.reinterpret_f32 (local.get $x)))
          (local.set $bits (i32.add (local.get $bits)
                                    (i32.add (i32.const 0xfff) (i32.and (i32.shr_u (local.get $bits) (i32.const 13)) (i32.const 1)))))
          (f32.reinterpret_i32 (i32.and (local.get $bits) (i32.const 0xffffe000))))))))""",
}
