"""The WebAssembly of the fused attention kernel (``relaxweb/library/attention.py``), for
kernels.wasm.

It computes the WGSL's recurrence for ``WASM_ROWS`` query rows per unit, which share each key
word's load.  The keys every row of a unit sees go in blocks of ``WASM_KEY_BLOCK``: the
block's scores of every row in scratch, one rescale of a row's accumulators per block, and the
weights times the values for two rows at once, their accumulators in registers (the rescale
per key group of the WGSL ran 1.9x slower at Whisper's 1500 keys).  A row's remaining keys (a
causal row's last ones, a partial last unit's) follow the WGSL: four keys' scores at once in
an f32x4, their weights from one ``$exp_f32x4``, the ``Dv`` accumulators in the thread's
scratch memory (:class:`AttentionWat`).
"""

from __future__ import annotations

import numpy as np

from ...ir.library_kernel import LibraryKernel
from ...ir.params_block import ParamsLayout
from ...ir.symbolic import as_int, product, simplify
from ...library.attention import QUERY_GROUP, QUERY_ROW, AttentionPlan, attention_plan
from ..relaxed_simd import multiply_add
from .wat import (
    IndexText, LibraryWat, broadcast_lane, element, fold, index_helpers, indent, kernel_text, loop, params_field, repeat,
    shuffle,
)


#: Query rows per unit of the kernel's WebAssembly: they share each key word's load (4 were no faster:
#: 16 dot-product accumulators spill x86's 16 vector registers).
WASM_ROWS = 2
#: Keys per block of the shared phase: their scores (then weights) for every row of the unit in
#: scratch, one rescale of the accumulators per block; a block's keys and values (32 KiB at
#: D = Dv = 64) stay in L1 while the rows read them (Whisper-tiny's attention, 1500 keys: 64
#: and 128 alike, 32 4% slower).
WASM_KEY_BLOCK = 64
#: Key words per step of a key block's dot products (Whisper-tiny's attention under wasmtime with
#: epoch interruption, a check per loop iteration: 1: 32.6 ms a head, 2: 27.2, 4: 26.7, 16: 30.9).
PAIR_DOT_STEP = 4



def _splat(value: str) -> str:
    return f"(v128.const f32x4 {value} {value} {value} {value})"


def exp_nonpositive(x: str) -> list[str]:
    """``$x`` (an f32x4 local of values <= 0, -inf or NaN) replaced by its ``exp``, inline:
    ``$exp_f32x4``'s computation (relaxweb/cpu/math.py) without its upper clamp, in the
    locals ``$en``, ``$er``, ``$ek``, ``$eh``.  Inline because a call in a loop makes
    Cranelift store and reload the loop's vector values around it (every vector register is
    the caller's to save)."""
    get = lambda name: f"(local.get ${name})"  # noqa: E731
    return [
        f";; {x} = exp({x}), {x} <= 0: exp(-104) is 0 already; pmax keeps a NaN",
        f"(local.set ${x} (f32x4.pmax {get(x)} {_splat('-104.0')}))",
        ";; n = x log2(e) rounded to an integer (to even, as f32x4.nearest) by adding 1.5 * 2^23, whose"
        " low bits then hold n",
        f"(local.set $ek (f32x4.add (f32x4.mul {get(x)} {_splat('1.44269504088896341')}) {_splat('12582912.0')}))",
        f"(local.set $en (f32x4.sub {get('ek')} {_splat('12582912.0')}))",
        "(local.set $ek (i32x4.sub (local.get $ek) (v128.const i32x4 0x4b400000 0x4b400000 0x4b400000 0x4b400000)))",
        f"(local.set $er (f32x4.sub (f32x4.sub {get(x)} (f32x4.mul {get('en')} {_splat('0.693359375')})) "
        f"(f32x4.mul {get('en')} {_splat('-2.12194440e-4')})))",
        f"(local.set ${x} (f32x4.add (f32x4.mul {get('er')} {_splat('1.9875691500e-4')}) {_splat('1.3981999507e-3')}))",
        *(f"(local.set ${x} (f32x4.add (f32x4.mul {get(x)} {get('er')}) {_splat(c)}))"
          for c in ("8.3334519073e-3", "4.1665795894e-2", "1.6666665459e-1", "5.0000001201e-1")),
        f"(local.set ${x} (f32x4.add (f32x4.add (f32x4.mul {get(x)} (f32x4.mul {get('er')} {get('er')})) {get('er')}) "
        f"{_splat('1.0')}))",
        ";; times 2^n, n in [-150, 0], as 2^(n >> 1) * 2^(n - (n >> 1))",
        f"(local.set $eh (i32x4.shr_s {get('ek')} (i32.const 1)))",
        f"(local.set ${x} (f32x4.mul (f32x4.mul {get(x)} (i32x4.shl (i32x4.add {get('eh')} "
        "(v128.const i32x4 127 127 127 127)) (i32.const 23)))",
        f"  (i32x4.shl (i32x4.add (i32x4.sub {get('ek')} {get('eh')}) (v128.const i32x4 127 127 127 127)) "
        "(i32.const 23))))",
    ]


def render_attention(kernel: LibraryKernel) -> LibraryWat:
    """The attention kernel's WAT and its scratch bytes."""
    return AttentionWat(attention_plan(**kernel.arguments)).render()


class AttentionWat:
    """The WAT of one attention kernel, a method per piece.  One unit per block of ``WASM_ROWS`` query rows
    of one (batch..., head): the WGSL's recurrence over groups of 4 keys, the 4 scores of a
    row in one f32x4 (dot products along D in f32x4 words, a transposing sum), their weights
    from one ``$exp_f32x4``, and the ``Dv`` accumulators in scratch updated in f32x4 words
    (unrolled along the constant Dv: constant offsets).  The dot products are a loop along D,
    two words per step (one when D / 4 is odd): unrolled, Cranelift loaded every key word of
    the group before the first product and spilled them.

    Two phases.  The shared phase walks the keys every row of a full block sees (up to its
    first row's count rounded down to a group: all keys for a non-causal block), the rows
    together: each key word is loaded once for the block's dot products, and no key is past a
    row's count (no selects, no validity masks).  With ``Dv`` a multiple of 4 (``blocked``) it
    goes in key blocks (``key_blocks``): per block, each pair of rows' scores into scratch, each
    row's weights in their place with one correction of its accumulators and sum, then each
    pair's accumulators (4 value words of both rows in 8 registers at a time) times their
    corrections plus the weights times the values; otherwise it goes a group of 4 keys at a
    time as the second phase does.  Then each row finishes alone from there (a causal row's
    last keys, the remainder of ``Sk`` % 4, every key of a partial last block), where a
    group's keys past ``count`` stand in as key j for the scores (and are then replaced by its
    score, as the WGSL's select does) and read a zero row of scratch for the values (weight
    0).  Scratch: per row its accumulators then its running maximum, running sum and whether
    it started (``block`` bytes), then the zero row, then (blocked) each row's
    ``WASM_KEY_BLOCK`` scores."""

    def __init__(self, plan: AttentionPlan) -> None:
        self.plan = plan
        self.head, self.value_head, self.scale = plan.head, plan.value_head, plan.scale
        layout = ParamsLayout(tuple(plan.size_vars))
        local_names = {QUERY_GROUP.name: "(local.get $bh)", QUERY_ROW.name: "(local.get $row)"}
        self.index = IndexText(lambda var: local_names.get(var) or params_field(layout, var))
        self.words, self.value_words = self.head // 4, self.value_head // 4  # whole f32x4 words of a key / value row
        self.row_bytes = 16 * (-(-self.value_head // 4))  # the accumulators (and the zero row) rounded up to words
        self.block = self.row_bytes + 16  # a row's accumulators, running maximum, running sum, started
        self.rows = WASM_ROWS
        self.bindings = [buffer.name for buffer in plan.inputs] + ["out"]
        self.masked = plan.mask_shape is not None
        self.mask_step = as_int(plan.mask_row_start()[1]) if self.masked else 0
        # the shared keys in blocks (value products in f32x4 words: Dv a multiple of 4; rows in pairs)
        self.blocked = self.value_head % 4 == 0 and self.value_head > 0 and self.rows % 2 == 0
        if plan.causal:  # key j is visible to row i when j <= i + Sk - Sq
            self.count = ("(call $main_max (i32.const 0) (call $main_min (local.get $seq_k) (i32.add (local.get $row) "
                          "(i32.add (i32.sub (local.get $seq_k) (local.get $seq_q)) (i32.const 1)))))")
        else:
            self.count = "(local.get $seq_k)"
        self.mask_start = self.index(plan.mask_row_start()[0]) if self.masked else ""
        # row r of the block's mask over keys j .. j + 3 (none past count), and the one row's (some may be)
        self.shared_masks = [
            f"(f32x4.splat (f32.load {element('mask', f'(local.get $mask_start{r})')}))" if self.mask_step == 0 else
            f"(v128.load {element('mask', f'(i32.add (local.get $mask_start{r}) (local.get $j))')})"
            for r in range(self.rows)]
        mask_key = ["(local.get $mask_start)" if self.mask_step == 0 else
                    f"(i32.add (local.get $mask_start) (call $main_min (i32.add (local.get $j) (i32.const {u})) "
                    f"(i32.sub (local.get $count) (i32.const 1))))" for u in range(4)]
        self.row_masks = [self.lanes([f"(f32.load {element('mask', key)})" for key in mask_key])]
        self.row_start = "(i32.add (i32.mul (local.get $bh) (local.get $seq_q)) (local.get $row))"

    def scores_at(self, r: int) -> int:
        """The scratch offset of row r's scores (then weights) of a key block."""
        return self.rows * self.block + self.row_bytes + 4 * WASM_KEY_BLOCK * r

    def key_at(self, u: int) -> str:
        """The address of key j + u, or key j's past ``count``."""
        if u == 0:
            return f"(i32.add (local.get $keys) (i32.mul (local.get $j) (i32.const {4 * self.head})))"
        return (f"(select (i32.add (local.get $k0) (i32.const {4 * self.head * u})) (local.get $k0) "
                f"(i32.lt_s (i32.add (local.get $j) (i32.const {u})) (local.get $count)))")

    def value_at(self, u: int) -> str:
        """The address of value j + u, or the zero row past ``count``."""
        return (f"(select (i32.add (local.get $values) (i32.mul (i32.add (local.get $j) (i32.const {u})) "
                f"(i32.const {4 * self.value_head}))) (local.get $zero) (i32.lt_s (i32.add (local.get $j) (i32.const {u})) "
                f"(local.get $count)))")

    @staticmethod
    def lanes(values: list[str]) -> str:
        """An f32x4 of ``values[u]`` in each lane u."""
        vector = f"(f32x4.splat {values[0]})"
        for u in range(1, 4):
            vector = f"(f32x4.replace_lane {u} {vector} {values[u]})"
        return vector

    def pair_dot(self) -> list[str]:
        """The dot products ``$d{r}{u}`` of rows r = 0, 1 from ``$q`` with keys u = 0 .. 3 from
        ``$k0`` (D >= 4): a word of each row, then each key's word used by both rows at once
        (13 vector registers live: Cranelift keeps them all, where loading the four key words
        first spilled), ``PAIR_DOT_STEP`` words per step with pointers stepping (no address
        arithmetic), the remaining words after the loop."""
        def word_step(w: int) -> list[str]:
            return [
                *(f"(local.set $key{r} (v128.load offset={4 * self.head * r + 16 * w} (local.get $qp)))" for r in range(2)),
                *(line for u in range(4) for line in [
                    f"(local.set $word (v128.load offset={4 * self.head * u + 16 * w} (local.get $kp)))",
                    *(f"(local.set $d{r}{u} {multiply_add(f'(local.get $key{r})', '(local.get $word)', f'(local.get $d{r}{u})')})"
                      for r in range(2))])]
        step = min(PAIR_DOT_STEP, self.words)
        return [
            "(local.set $qp (local.get $q))",
            "(local.set $kp (local.get $k0))",
            f"(local.set $dot_end (i32.add (local.get $q) (i32.const {16 * (self.words - self.words % step)})))",
            *repeat("dot", "(i32.lt_u (local.get $qp) (local.get $dot_end))", [
                *(line for w in range(step) for line in word_step(w)),
                f"(local.set $qp (i32.add (local.get $qp) (i32.const {16 * step})))",
                f"(local.set $kp (i32.add (local.get $kp) (i32.const {16 * step})))"]),
            *(line for w in range(self.words % step) for line in word_step(w)),
        ]

    def scores(self, count: int, keys: list[tuple[str, int]], masks: list[str], rows_first: bool = False) -> list[str]:
        """The scores of keys j .. j + 3 (key u at address ``keys[u]``: a local and a constant
        offset) for the ``count`` query rows from ``$q`` on, into ``$s0``, ``$s1``, ...: dot
        products in f32x4 words (each key word loaded once for all rows), a transposing sum,
        a scalar tail for D % 4, the scale, and row r's mask (``masks[r]``: an f32x4 of it)."""
        def key_element(u: int, byte: int) -> str:
            return f"(f32.load offset={keys[u][1] + byte} (local.get ${keys[u][0]}))"
        step = 2 if self.words % 2 == 0 else 1  # words per step of the loop along D (4 spilled: 1.3x slower)
        lines = [*(f"(local.set $d{r}{u} (v128.const i32x4 0 0 0 0))" for r in range(count) for u in range(4))]
        if rows_first:  # the key blocks' pairs of rows: keys at $k0, 4 * head bytes apart
            lines += self.pair_dot() if self.words else []
        else:
            lines += [
                "(local.set $at (i32.const 0))",
                *loop("dot", f"(i32.ge_u (local.get $at) (i32.const {16 * self.words}))", [
                    *(line for w in range(step) for line in [
                        *(f"(local.set $key{u} (v128.load offset={keys[u][1] + 16 * w} (i32.add (local.get ${keys[u][0]}) "
                          f"(local.get $at))))" for u in range(4)),
                        *(line for r in range(count) for line in [
                            f"(local.set $word (v128.load offset={4 * self.head * r + 16 * w} (i32.add (local.get $q) "
                            "(local.get $at))))",
                            *(f"(local.set $d{r}{u} "
                              f"{multiply_add('(local.get $word)', f'(local.get $key{u})', f'(local.get $d{r}{u})')})"
                              for u in range(4))])]),
                    f"(local.set $at (i32.add (local.get $at) (i32.const {16 * step})))"])]
        for r in range(count):
            d = [f"(local.get $d{r}{u})" for u in range(4)]
            lines += [
                f";; row {r}: (d0, d1, d2, d3) summed across lanes: lane u is key j + u's dot product",
                f"(local.set $d{r}0 (f32x4.add {shuffle(d[0], d[1], (0, 1, 4, 5))} {shuffle(d[0], d[1], (2, 3, 6, 7))}))",
                f"(local.set $d{r}2 (f32x4.add {shuffle(d[2], d[3], (0, 1, 4, 5))} {shuffle(d[2], d[3], (2, 3, 6, 7))}))",
                f"(local.set $s{r} (f32x4.add {shuffle(d[0], d[2], (0, 2, 4, 6))} {shuffle(d[0], d[2], (1, 3, 5, 7))}))",
                *(f"(local.set $s{r} (f32x4.add (local.get $s{r}) (f32x4.mul (f32x4.splat (f32.load "
                  f"offset={4 * self.head * r + 4 * e} (local.get $q))) {self.lanes([key_element(u, 4 * e) for u in range(4)])})))"
                  for e in range(4 * self.words, self.head)),  # the scalar tail of D % 4
            ]
            if self.scale != 1.0:
                lines.append(f"(local.set $s{r} (f32x4.mul (local.get $s{r}) "
                             f"(f32x4.splat (f32.const {float(np.float32(self.scale))!r}))))")
            if self.masked:
                lines.append(f"(local.set $s{r} (f32x4.add (local.get $s{r}) {masks[r]}))")
        return lines

    def update(self, r: int, acc: str, offset: int, values: list[tuple[str, int]], valid: bool) -> list[str]:
        """The online softmax step of row r's group (scores ``$s{r}``; ``valid``: lanes past
        ``count`` weigh 0) and its value product, with the row's block in scratch at
        ``$acc`` + ``offset`` (the accumulators, then its state) and value u at ``values[u]``."""
        state = offset + self.row_bytes  # running maximum, running sum, started
        s = f"(local.get $s{r})"

        def value_word(u: int, byte: int, kind: str = "v128") -> str:
            return f"({kind}.load offset={values[u][1] + byte} (local.get ${values[u][0]}))"

        def acc_word(byte: int, kind: str = "v128") -> str:
            return f"({kind}.load offset={offset + byte} (local.get ${acc}))"
        return [
            f"(local.set $running_max (f32.load offset={state} (local.get ${acc})))",
            f"(local.set $started (i32.load offset={state + 8} (local.get ${acc})))",
            f"(local.set $word (f32x4.max {s} {shuffle(s, s, (2, 3, 0, 1))}))",
            f"(local.set $group_max (f32x4.extract_lane 0 (f32x4.max (local.get $word) "
            f"{shuffle('(local.get $word)', '(local.get $word)', (1, 0, 3, 2))})))",
            "(local.set $new_max (select (f32.max (local.get $running_max) (local.get $group_max)) (local.get $group_max) "
            "(local.get $started)))",
            ";; every score so far -inf: nothing to add yet (a NaN score makes the weights, so the row, NaN)",
            "(if (i32.ne (i32.reinterpret_f32 (local.get $new_max)) (i32.const 0xff800000))",
            "  (then",
            "    ;; the maximum unchanged (most groups): exp(0) is 1, without the call",
            "    (local.set $correction (if (result f32) (i32.and (local.get $started) "
            "(f32.eq (local.get $running_max) (local.get $new_max)))",
            "      (then (f32.const 1))",
            "      (else (select (call $exp_f32 (f32.sub (local.get $running_max) (local.get $new_max))) "
            "(f32.const 0) (local.get $started)))))",
            f"    (local.set $p (call $exp_f32x4 (f32x4.sub {s} (f32x4.splat (local.get $new_max)))))",
            *(["    (local.set $p (v128.and (local.get $p) (local.get $valid)))"] if valid else []),
            f"    (local.set $word (f32x4.add (local.get $p) {shuffle('(local.get $p)', '(local.get $p)', (2, 3, 0, 1))}))",
            f"    (f32.store offset={state + 4} (local.get ${acc}) (f32.add (f32.mul (f32.load offset={state + 4} "
            f"(local.get ${acc})) (local.get $correction)) (f32x4.extract_lane 0 (f32x4.add (local.get $word) "
            f"{shuffle('(local.get $word)', '(local.get $word)', (1, 0, 3, 2))}))))",
            *indent([
                *(f"(local.set $p{u} {broadcast_lane('(local.get $p)', u)})" for u in range(4)),
                "(local.set $c (f32x4.splat (local.get $correction)))",
                ";; acc = acc * correction + p0 v0 + p1 v1 + p2 v2 + p3 v3, a word at a time",
                *(line for w in range(self.value_words) for line in [
                    f"(v128.store offset={offset + 16 * w} (local.get ${acc}) (f32x4.add (f32x4.add",
                    f"  (f32x4.mul {acc_word(16 * w)} (local.get $c))",
                    f"  (f32x4.mul (local.get $p0) {value_word(0, 16 * w)}))",
                    "  (f32x4.add",
                    f"    (f32x4.add (f32x4.mul (local.get $p1) {value_word(1, 16 * w)})",
                    f"               (f32x4.mul (local.get $p2) {value_word(2, 16 * w)}))",
                    f"    (f32x4.mul (local.get $p3) {value_word(3, 16 * w)}))))"]),
                *(f"(f32.store offset={offset + 4 * d} (local.get ${acc}) " + fold("f32.add", [
                    f"(f32.mul {acc_word(4 * d, 'f32')} (local.get $correction))",
                    *(f"(f32.mul (f32x4.extract_lane {u} (local.get $p)) {value_word(u, 4 * d, 'f32')})"
                      for u in range(4))]) + ")"
                  for d in range(4 * self.value_words, self.value_head)),
                f"(f32.store offset={state} (local.get ${acc}) (local.get $new_max))",
                f"(i32.store offset={state + 8} (local.get ${acc}) (i32.const 1))))",
            ], 2),
        ]

    @staticmethod
    def horizontal(instruction: str, vector: str, target: str) -> list[str]:
        """``$target`` set to the ``instruction`` (``f32x4.max``, ``f32x4.add``) of the four
        lanes of the f32x4 local ``$vector`` (which it overwrites)."""
        v = f"(local.get ${vector})"
        return [f"(local.set ${vector} ({instruction} {v} {shuffle(v, v, (2, 3, 0, 1))}))",
                f"(local.set ${target} (f32x4.extract_lane 0 ({instruction} {v} {shuffle(v, v, (1, 0, 3, 2))})))"]

    def block_weights(self, r: int) -> list[str]:
        """Row r's online softmax step over the block's scores (in scratch at ``scores_at(r)``,
        their maximum's lanes in ``$m{r}``): the correction ``$corr{r}`` of its accumulators,
        and the scores replaced by their weights ``exp(score - maximum)``, whose sum joins the
        running sum.

        Without branches on the scores: the maximum is taken with ``pmax`` (one instruction on
        x86 where ``max`` takes seven), which passes over NaN scores: their weights are NaN, so
        the row is.  A row whose scores so far are all -inf subtracts 0 (weights exp(-inf) = 0,
        a NaN score's NaN) and stays not started: its accumulators, 0, get 0 added."""
        state = r * self.block + self.row_bytes
        at = self.scores_at(r)
        word = f"(v128.load offset={at} (local.get $at))"
        return [
            f";; row {r}: the block's maximum, then its weights in place of its scores",
            *self.horizontal("f32x4.pmax", f"m{r}", "group_max"),
            f"(local.set $running_max (f32.load offset={state} (local.get $scratch)))",
            f"(local.set $started (i32.load offset={state + 8} (local.get $scratch)))",
            "(local.set $new_max (select (f32.max (local.get $running_max) (local.get $group_max)) (local.get $group_max) "
            "(local.get $started)))",
            ";; the maximum unchanged (most blocks): exp(0) is 1, without the call; not started: 0",
            f"(local.set $corr{r} (if (result f32) (i32.and (local.get $started) "
            "(f32.eq (local.get $running_max) (local.get $new_max)))",
            "  (then (f32.const 1))",
            "  (else (select (call $exp_f32 (f32.sub (local.get $running_max) (local.get $new_max))) "
            "(f32.const 0) (local.get $started)))))",
            ";; subtracted from the scores: the maximum, or 0 while every score is -inf",
            "(local.set $c (f32x4.splat (select (f32.const 0) (local.get $new_max) (i32.eq (i32.reinterpret_f32 "
            "(local.get $new_max)) (i32.const 0xff800000)))))",
            "(local.set $word (v128.const i32x4 0 0 0 0))",
            "(local.set $at (local.get $scratch))",
            *repeat(f"weights{r}", "(i32.lt_u (local.get $at) (local.get $stop))", [
                f"(local.set $p (f32x4.sub {word} (local.get $c)))",
                *exp_nonpositive("p"),
                f"(v128.store offset={at} (local.get $at) (local.get $p))",
                "(local.set $word (f32x4.add (local.get $word) (local.get $p)))",
                "(local.set $at (i32.add (local.get $at) (i32.const 16)))"]),
            *self.horizontal("f32x4.add", "word", "running_sum"),
            f"(f32.store offset={state + 4} (local.get $scratch) (f32.add (f32.mul (f32.load offset={state + 4} "
            f"(local.get $scratch)) (local.get $corr{r})) (local.get $running_sum)))",
            f"(f32.store offset={state} (local.get $scratch) (local.get $new_max))",
            f"(i32.store offset={state + 8} (local.get $scratch) (i32.or (local.get $started) "
            "(i32.ne (i32.reinterpret_f32 (local.get $new_max)) (i32.const 0xff800000))))",
        ]

    def block_scores(self, pair: int) -> list[str]:
        """The scores of rows 2 pair, 2 pair + 1 for the block's keys, a group of 4 at a time
        (each key word loaded once for both rows), into scratch at ``scores_at``, and their
        lanes' maxima (``pmax``: NaN passed over, see ``block_weights``) in ``$m{r}``."""
        return [
            f";; rows {2 * pair} and {2 * pair + 1}: their scores of the block's keys",
            f"(local.set $q (i32.add (local.get $q_row0) (i32.const {2 * pair * 4 * self.head})))",
            "(local.set $j (local.get $j0))",
            "(local.set $sp (local.get $scratch))",
            *(f"(local.set $m{2 * pair + r} (v128.const f32x4 -inf -inf -inf -inf))" for r in range(2)),
            *loop(f"scores{pair}", "(i32.ge_s (local.get $j) (local.get $block_end))", [
                f"(local.set $k0 (i32.add (local.get $keys) (i32.mul (local.get $j) (i32.const {4 * self.head}))))",
                *self.scores(2, [("k0", 4 * self.head * u) for u in range(4)], self.shared_masks[2 * pair:2 * pair + 2], True),
                *(line for r in range(2) for line in [
                    f"(v128.store offset={self.scores_at(2 * pair + r)} (local.get $sp) (local.get $s{r}))",
                    f"(local.set $m{2 * pair + r} (f32x4.pmax (local.get $m{2 * pair + r}) (local.get $s{r})))"]),
                "(local.set $sp (i32.add (local.get $sp) (i32.const 16)))",
                "(local.set $j (i32.add (local.get $j) (i32.const 4)))"]),
        ]

    def block_values(self, pair: int) -> list[str]:
        """Rows 2 pair and 2 pair + 1's accumulators times their corrections plus the block's
        weights times its values: up to 4 value words of both rows in registers at a time
        (each value word loaded once for both rows, each weight once per chunk)."""
        lines = []
        for first in range(0, self.value_words, 4):
            chunk = range(first, min(first + 4, self.value_words))
            lines += [
                f";; rows {2 * pair} and {2 * pair + 1}, value words {first} .. {chunk[-1]}: acc * correction "
                "+ weights . values",
                *(f"(local.set $a{r}{w - first} (f32x4.mul (v128.load offset={(2 * pair + r) * self.block + 16 * w} "
                  f"(local.get $scratch)) (f32x4.splat (local.get $corr{2 * pair + r}))))" for r in range(2) for w in chunk),
                f"(local.set $vp (i32.add (local.get $values) (i32.add (i32.mul (local.get $j0) (i32.const {4 * self.value_head})) "
                f"(i32.const {16 * first}))))",
                "(local.set $at (local.get $scratch))",
                ";; the block's keys (at least 4, a multiple of 4) 4 at a time: a word of weights per row, each"
                " weight broadcast",
                *repeat(f"values{pair}_{first}", "(i32.lt_u (local.get $at) (local.get $stop))", [
                    *(f"(local.set $p{2 + r} (v128.load offset={self.scores_at(2 * pair + r)} (local.get $at)))"
                      for r in range(2)),
                    *(line for u in range(4) for line in [
                        *(f"(local.set $p{r} {broadcast_lane(f'(local.get $p{2 + r})', u)})" for r in range(2)),
                        *(line for w in chunk for line in [
                            f"(local.set $key0 (v128.load offset={4 * self.value_head * u + 16 * (w - first)} (local.get $vp)))",
                            *(f"(local.set $a{r}{w - first} "
                              f"{multiply_add(f'(local.get $p{r})', '(local.get $key0)', f'(local.get $a{r}{w - first})')})"
                              for r in range(2))])]),
                    f"(local.set $vp (i32.add (local.get $vp) (i32.const {16 * self.value_head})))",
                    "(local.set $at (i32.add (local.get $at) (i32.const 16)))"]),
                *(f"(v128.store offset={(2 * pair + r) * self.block + 16 * w} (local.get $scratch) (local.get $a{r}{w - first}))"
                  for r in range(2) for w in chunk),
            ]
        return lines

    def key_blocks(self) -> list[str]:
        """The shared keys in blocks of up to ``WASM_KEY_BLOCK`` (the last one shorter): each
        block's scores for every row, each row's weights with one rescale per block, then the
        value products (see the class doc)."""
        return [
            "(local.set $q_row0 (local.get $q))",
            *loop("blocks", "(i32.ge_s (local.get $j) (local.get $shared))", [
                ";; keys j .. block_end, seen by every row: scores, weights, value products",
                "(local.set $j0 (local.get $j))",
                f"(local.set $block_end (call $main_min (local.get $shared) (i32.add (local.get $j) "
                f"(i32.const {WASM_KEY_BLOCK}))))",
                "(local.set $stop (i32.add (local.get $scratch) (i32.shl (i32.sub (local.get $block_end) "
                "(local.get $j0)) (i32.const 2))))",
                *(line for pair in range(self.rows // 2) for line in self.block_scores(pair)),
                *(line for r in range(self.rows) for line in self.block_weights(r)),
                *(line for pair in range(self.rows // 2) for line in self.block_values(pair)),
                "(local.set $j (local.get $block_end))"]),
            "(local.set $q (local.get $q_row0))",
        ]

    def shared_phase(self) -> list[str]:
        """The keys every row of a full unit sees, the rows together (from key 0 to ``$shared``)."""
        return [
            "(local.set $row (local.get $row0))",
            f"(local.set $count {self.count})",
            ";; the key groups every row of a full block sees",
            f"(local.set $shared (select (i32.and (local.get $count) (i32.const -4)) (i32.const 0) "
            f"(i32.le_s (i32.add (local.get $row0) (i32.const {self.rows})) (local.get $seq_q))))",
            *(line for r in range(self.rows) if self.masked for line in [
                f"(local.set $row (i32.add (local.get $row0) (i32.const {r})))",
                f"(local.set $mask_start{r} {self.mask_start})"]),
            "(local.set $row (local.get $row0))",
            f"(local.set $q (i32.add (local.get $query) (i32.mul {self.row_start} (i32.const {4 * self.head}))))",
            "(local.set $j (i32.const 0))",
            *(self.key_blocks() if self.blocked else loop("shared", "(i32.ge_s (local.get $j) (local.get $shared))", [
                ";; keys j .. j + 3 for every row of the block: their scores, then each row's rescale",
                f"(local.set $k0 (i32.add (local.get $keys) (i32.mul (local.get $j) (i32.const {4 * self.head}))))",
                f"(local.set $v0 (i32.add (local.get $values) (i32.mul (local.get $j) (i32.const {4 * self.value_head}))))",
                *self.scores(self.rows, [("k0", 4 * self.head * u) for u in range(4)], self.shared_masks),
                *(line for r in range(self.rows)
                  for line in self.update(r, "scratch", r * self.block, [("v0", 4 * self.value_head * u) for u in range(4)], False)),
                "(local.set $j (i32.add (local.get $j) (i32.const 4)))",
            ])),
        ]


    def one_row(self) -> list[str]:
        """Row ``$r`` of the unit alone: its remaining keys (from ``$shared``), then its output."""
        return [
            "(local.set $row (i32.add (local.get $row0) (local.get $r)))",
            f"(local.set $q (i32.add (local.get $query) (i32.mul {self.row_start} (i32.const {4 * self.head}))))",
            *([f"(local.set $mask_start {self.mask_start})"] if self.masked else []),
            f"(local.set $count {self.count})",
            f"(local.set $acc (i32.add (local.get $scratch) (i32.mul (local.get $r) (i32.const {self.block}))))",
            "(local.set $j (local.get $shared))",
            *loop("keys", "(i32.ge_s (local.get $j) (local.get $count))", [
                ";; keys j .. j + 3 of this row, some maybe past count: their scores, then one rescale",
                *(f"(local.set $k{u} {self.key_at(u)})" for u in range(4)),
                *(f"(local.set $v{u} {self.value_at(u)})" for u in range(4)),
                *self.scores(1, [(f"k{u}", 0) for u in range(4)], self.row_masks),
                ";; keys past count: key j's score (their weights are 0 below)",
                "(local.set $valid (i32x4.lt_s (i32x4.add (i32x4.splat (local.get $j)) (v128.const i32x4 0 1 2 3)) "
                "(i32x4.splat (local.get $count))))",
                f"(local.set $s0 (v128.bitselect (local.get $s0) {broadcast_lane('(local.get $s0)', 0)} (local.get $valid)))",
                *self.update(0, "acc", 0, [(f"v{u}", 0) for u in range(4)], True),
                "(local.set $j (i32.add (local.get $j) (i32.const 4)))",
            ]),
            *self.row_end(),
            "(local.set $p (f32x4.splat (local.get $running_sum)))",
            "(local.set $at (i32.const 0))",
            *loop("store", f"(i32.ge_u (local.get $at) (i32.const {16 * self.value_words}))", [
                "(v128.store (i32.add (local.get $o) (local.get $at)) (select (result v128)",
                "  (f32x4.div (v128.load (i32.add (local.get $acc) (local.get $at))) (local.get $p))",
                "  (local.get $c) (local.get $started)))",
                "(local.set $at (i32.add (local.get $at) (i32.const 16)))",
            ]),
            *(f"(f32.store offset={4 * d} (local.get $o) (select (f32.div (f32.load offset={4 * d} (local.get $acc)) "
              "(local.get $running_sum)) (f32x4.extract_lane 0 (local.get $c)) (local.get $started)))"
              for d in range(4 * self.value_words, self.value_head)),
            "(local.set $r (i32.add (local.get $r) (i32.const 1)))",
        ]

    def row_end(self) -> list[str]:
        """Before row ``$r``'s output: ``$c``, the value of a row without weights, and
        ``$started``, whether its weights are numbers (else it is ``$c``)."""
        lines = [
            ";; acc / sum; a row with no score above -inf is NaN (the unfused softmax's); no keys: 0",
            f"(local.set $o (i32.add (local.get $out) (i32.mul {self.row_start} (i32.const {4 * self.value_head}))))",
            "(local.set $c (f32x4.splat (select (f32.const nan) (f32.const 0) (local.get $seq_k))))  ;; the row without weights",
            f"(local.set $running_sum (f32.load offset={self.row_bytes + 4} (local.get $acc)))",
            f"(local.set $started (i32.load offset={self.row_bytes + 8} (local.get $acc)))",
        ]
        if not self.plan.zero_nan_rows:
            return lines
        return [
            *lines,
            ";; zero_nan_rows: a row whose weights are NaN (not started, or a NaN sum: a NaN or +inf score) is 0,",
            ";; as where(isnan(weights), 0, weights) makes it",
            "(local.set $c (v128.const i32x4 0 0 0 0))",
            "(local.set $started (i32.and (local.get $started) (f32.eq (local.get $running_sum) (local.get $running_sum))))",
        ]

    def body(self) -> list[str]:
        """``$main``'s body: every unit of ``$first .. $end``, the shared phase then each row."""
        return [
            f"(local.set $seq_q {self.index(self.plan.query_length)})",
            f"(local.set $seq_k {self.index(self.plan.key_length)})",
            f"(local.set $blocks (i32.div_u (i32.add (local.get $seq_q) (i32.const {self.rows - 1})) (i32.const {self.rows})))",
            f"(local.set $zero (i32.add (local.get $scratch) (i32.const {self.rows * self.block})))",
            f"(memory.fill (local.get $zero) (i32.const 0) (i32.const {self.row_bytes}))",
            "(local.set $unit (local.get $first))",
            *loop("unit", "(i32.ge_s (local.get $unit) (local.get $end))", [
                "(local.set $bh (i32.div_u (local.get $unit) (local.get $blocks)))",
                f"(local.set $row0 (i32.mul (i32.rem_u (local.get $unit) (local.get $blocks)) (i32.const {self.rows})))",
                f"(local.set $kv (i32.mul {self.index(self.plan.kv_group())} {self.index(self.plan.key_rows)}))",
                f"(local.set $keys (i32.add (local.get $key) (i32.mul (local.get $kv) (i32.const {4 * self.head}))))",
                f"(local.set $values (i32.add (local.get $value) (i32.mul (local.get $kv) (i32.const {4 * self.value_head}))))",
                ";; every row's accumulators 0 and state (maximum 0, sum 0, not started)",
                f"(memory.fill (local.get $scratch) (i32.const 0) (i32.const {self.rows * self.block}))",
                *self.shared_phase(),
                ";; then each row alone: its remaining keys, and its output",
                f"(local.set $rows_here (call $main_min (i32.const {self.rows}) (i32.sub (local.get $seq_q) (local.get $row0))))",
                "(local.set $r (i32.const 0))",
                *loop("row", "(i32.ge_s (local.get $r) (local.get $rows_here))", self.one_row()),
                "(local.set $unit (i32.add (local.get $unit) (i32.const 1)))",
            ]),
        ]

    def render(self) -> LibraryWat:
        """The kernel's WAT and the scratch bytes ``$main`` needs per thread."""
        body = self.body()
        int_locals = ["seq_q", "seq_k", "blocks", "unit", "bh", "row0", "row", "r", "rows_here", "shared", "kv", "keys",
                      "values", "q", "o", "acc", "zero", "count", "j", "at", "started",
                      *(["q_row0", "j0", "block_end", "stop", "sp", "vp", "qp", "kp", "dot_end"] if self.blocked else []),
                      *(["mask_start", *(f"mask_start{r}" for r in range(self.rows))] if self.masked else []),
                      *(f"k{u}" for u in range(4)), *(f"v{u}" for u in range(4))]
        float_locals = ["running_max", "running_sum", "new_max", "group_max", "correction",
                        *((f"corr{r}" for r in range(self.rows)) if self.blocked else ())]
        vector_locals = ["word", "p", "c", "valid", *(f"s{r}" for r in range(self.rows)),
                         *(f"d{r}{u}" for r in range(self.rows) for u in range(4)), *(f"key{u}" for u in range(4)),
                         *(f"p{u}" for u in range(4)), *((f"a{r}{w}" for r in range(2) for w in range(4)) if self.blocked else ()),
                         *(["en", "er", "ek", "eh", *(f"m{r}" for r in range(self.rows))] if self.blocked else [])]
        units = [self.index(simplify(product(self.plan.batch) * ((self.plan.query_length + (self.rows - 1)) // self.rows)))]
        title = (f"library kernel: {self.plan.name} (fused attention, {self.rows} query rows per unit, online softmax over "
                 + (f"blocks of {WASM_KEY_BLOCK} keys shared by the rows, then groups of 4 keys)" if self.blocked else
                    "groups of 4 keys)"))
        text = kernel_text(title, self.bindings, units,
                           [*((n, "i32") for n in int_locals), *((n, "f32") for n in float_locals),
                            *((n, "v128") for n in vector_locals)],
                           body, index_helpers("\n".join([*units, *body])))
        return LibraryWat(text, self.scores_at(self.rows) if self.blocked else self.rows * self.block + self.row_bytes)
