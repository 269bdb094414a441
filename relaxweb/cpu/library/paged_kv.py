"""The WebAssembly of the paged KV cache's two kernels (``relaxweb/library/paged_kv.py``), for
kernels.wasm.

``paged_kv_write``: one unit per head of the pool, which copies that head's row of every
token into the token's page in token order (``memory.copy``), so a later token's row wins
where two land on one row (repeated or clamped positions), as in the reference, however the
units are split.

``paged_attention``: one unit per query row ``(b, h, t)`` (the output's row order), alone:
its keys ``0 .. position`` page by page through its page table (the address arithmetic per
page; a page's rows of one head are contiguous).  Per page: the scores of its keys, four at
a time in an f32x4 (dot products along ``head`` in f32x4 words, a transposing sum), into the
thread's scratch; one online softmax step (the page's maximum, one correction of the
accumulators and the running sum, the scores replaced by their weights); then the
accumulators (``value_head`` floats in scratch) times the correction plus the weights times
the page's value rows, up to :data:`VALUE_CHUNK` words of them in registers at a time.
"""

from __future__ import annotations

import numpy as np

from ...ir.dtype import dtype_info
from ...ir.library_kernel import LibraryKernel
from ...ir.params_block import ParamsLayout
from ...ir.symbolic import simplify
from ...library.paged_kv import paged_title
from ..emit import element_shift
from .attention import exp_nonpositive
from .wat import (
    IndexText,
    LibraryWat,
    element,
    index_helpers,
    kernel_text,
    loop,
    params_field,
    repeat,
    shuffle,
)

#: Value words (f32x4) of the accumulators held in registers at a time while a page's weights
#: times its value rows are added to them (8 accumulators, a weight and a value word: within
#: x86's 16 vector registers).
VALUE_CHUNK = 8


def _index(kernel: LibraryKernel) -> IndexText:
    """Index expressions over the kernel's params block (its size variables)."""
    layout = ParamsLayout(tuple(var.name for var in kernel.size_vars))
    return IndexText(lambda var: params_field(layout, var))


def _clamp(value: str, high: int) -> str:
    """``value`` (a WAT i32 expression) clamped to ``[0, high]``."""
    return f"(call $main_min (call $main_max {value} (i32.const 0)) (i32.const {high}))"


def _token_row(kernel: LibraryKernel) -> list[str]:
    """``$row``: token ``$n``'s position clamped to ``[0, table_pages * page_size)``, and
    ``$table``: the address of its page table row."""
    arguments = kernel.arguments
    table_pages, page_size = arguments["table_pages"], arguments["page_size"]
    position = f"(i32.load {element('positions', '(local.get $n)')})"
    table = element("page_table", f"(i32.mul (local.get $n) (i32.const {table_pages}))")
    return [
        f"(local.set $row {_clamp(position, table_pages * page_size - 1)})",
        f"(local.set $table {table})",
    ]


# -- paged_kv_write ------------------------------------------------------------------------------


def render_paged_kv_write(kernel: LibraryKernel) -> LibraryWat:
    """``pool[page(n, pos), h, pos % page_size, :] = value[b, h, t, :]``: unit h copies head
    h's row of every token, in token order."""
    arguments = kernel.arguments
    heads, head, page_size = arguments["heads"], arguments["head"], arguments["page_size"]
    index = _index(kernel)
    row_bytes = head << element_shift(kernel.output.dtype)
    entry = f"(i32.add (local.get $table) (i32.shl (i32.div_u (local.get $row) (i32.const {page_size})) (i32.const 2)))"
    body = [
        f"(local.set $batch {index(arguments['batch'])})",
        f"(local.set $length {index(arguments['length'])})",
        "(local.set $h (local.get $first))",
        *loop("heads", "(i32.ge_s (local.get $h) (local.get $end))", [
            ";; head h of every token n = b * length + t, in order",
            "(local.set $n (i32.const 0))",
            "(local.set $b (i32.const 0))",
            *loop("batch", "(i32.ge_s (local.get $b) (local.get $batch))", [
                ";; value[b, h, 0, :]: the sequence's rows of head h follow one another",
                f"(local.set $from (i32.add (local.get $value) (i32.mul (i32.mul (i32.add (i32.mul (local.get $b) "
                f"(i32.const {heads})) (local.get $h)) (local.get $length)) (i32.const {row_bytes}))))",
                "(local.set $t (i32.const 0))",
                *loop("tokens", "(i32.ge_s (local.get $t) (local.get $length))", [
                    ";; its position (clamped), then its page (clamped): the row to write",
                    *_token_row(kernel),
                    f"(local.set $page {_clamp(f'(i32.load {entry})', arguments['pages'] - 1)})",
                    "(memory.copy",
                    f"  (i32.add (local.get $out) (i32.mul (i32.add (i32.mul (i32.add (i32.mul (local.get $page) "
                    f"(i32.const {heads})) (local.get $h)) (i32.const {page_size})) (i32.rem_u (local.get $row) "
                    f"(i32.const {page_size}))) (i32.const {row_bytes})))",
                    "  (local.get $from)",
                    f"  (i32.const {row_bytes}))",
                    f"(local.set $from (i32.add (local.get $from) (i32.const {row_bytes})))",
                    "(local.set $n (i32.add (local.get $n) (i32.const 1)))",
                    "(local.set $t (i32.add (local.get $t) (i32.const 1)))",
                ]),
                "(local.set $b (i32.add (local.get $b) (i32.const 1)))",
            ]),
            "(local.set $h (i32.add (local.get $h) (i32.const 1)))",
        ]),
    ]
    title = (f"{paged_title(kernel)}: one unit per head, its token rows in token order (a later token wins a "
             "shared row)")
    bindings = [buffer.name for buffer in kernel.inputs] + ["out"]
    int_locals = ["batch", "length", "h", "b", "t", "n", "row", "table", "page", "from"]
    return LibraryWat(kernel_text(title, bindings, [f"(i32.const {heads})"], [(name, "i32") for name in int_locals],
                                  body, index_helpers("\n".join(body))))


# -- paged_attention -----------------------------------------------------------------------------


def render_paged_attention(kernel: LibraryKernel) -> LibraryWat:
    """The paged attention kernel's WAT and its scratch bytes."""
    return PagedAttentionWat(kernel).render()


def _splat(value: str) -> str:
    return f"(v128.const f32x4 {value} {value} {value} {value})"


class PagedAttentionWat:
    """The WAT of one paged attention kernel, a method per phase (see the module doc).

    Scratch: the ``value_head`` accumulators (rounded up to f32x4 words, ``acc_bytes``), then
    the scores (then weights) of one page's keys (rounded up to a group of 4)."""

    def __init__(self, kernel: LibraryKernel) -> None:
        arguments = kernel.arguments
        if dtype_info(kernel.output.dtype).wasm_dtype != "float32" or element_shift(kernel.output.dtype) != 2:
            raise NotImplementedError(f"{kernel.name}: paged attention in kernels.wasm computes float32 buffers, "
                                      f"not {kernel.output.dtype}")
        self.kernel = kernel
        self.heads, self.kv_heads = arguments["heads"], arguments["kv_heads"]
        self.head, self.value_head = arguments["head"], arguments["value_head"]
        self.pages, self.page_size = arguments["pages"], arguments["page_size"]
        self.scale = float(np.float32(arguments["scale"]))
        self.index = _index(kernel)
        self.words, self.value_words = self.head // 4, self.value_head // 4  # whole f32x4 words of a row
        self.acc_bytes = 16 * (-(-self.value_head // 4))
        self.scores = self.acc_bytes  # the scratch offset of the page's scores
        self.key_row, self.value_row = 4 * self.head, 4 * self.value_head  # bytes of a key / value row

    def key_word(self, u: int, byte: int, kind: str = "v128", at: bool = False) -> str:
        """Bytes ``byte ..`` (plus ``$at`` when ``at``) of key j + u of the group, from ``$k0``
        (past the page's keys, key j's when the page's rows are not a whole number of groups:
        no read leaves the page)."""
        whole = self.page_size % 4 == 0 or u == 0  # the group's rows all lie in the page
        pointer = "(local.get $k0)" if whole else f"(local.get $k{u})"
        if at:
            pointer = f"(i32.add {pointer} (local.get $at))"
        return f"({kind}.load offset={self.key_row * u * whole + byte} {pointer})"

    def lanes(self, values: list[str]) -> str:
        """An f32x4 of ``values[u]`` in lane u."""
        vector = f"(f32x4.splat {values[0]})"
        for u in range(1, 4):
            vector = f"(f32x4.replace_lane {u} {vector} {values[u]})"
        return vector

    def page_scores(self) -> list[str]:
        """The scores of the page's ``$keys`` keys (from ``$kp``) into scratch, 4 at a time,
        -inf past them; their lanes' maximum in ``$m``; ``$stop`` the end of the scores."""
        step = 2 if self.words % 2 == 0 else 1  # f32x4 words per step along the head
        d = [f"(local.get $d{u})" for u in range(4)]
        dot = [] if not self.words else [
            "(local.set $at (i32.const 0))",
            *repeat("dot", f"(i32.lt_u (local.get $at) (i32.const {16 * self.words}))", [
                *(line for w in range(step) for line in [
                    f"(local.set $word (v128.load offset={16 * w} (i32.add (local.get $q) (local.get $at))))",
                    *(f"(local.set $d{u} (f32x4.add (local.get $d{u}) (f32x4.mul (local.get $word) "
                      f"{self.key_word(u, 16 * w, at=True)})))"
                      for u in range(4))]),
                f"(local.set $at (i32.add (local.get $at) (i32.const {16 * step})))"])]
        return [
            ";; scores of the page's keys, 4 at a time: q . k * scale (-inf past the page's keys), into scratch",
            "(local.set $k0 (local.get $kp))",
            f"(local.set $sp (i32.add (local.get $scratch) (i32.const {self.scores})))",
            "(local.set $j (i32.const 0))",
            f"(local.set $m {_splat('-inf')})",
            *repeat("scores", "(i32.lt_s (local.get $j) (local.get $keys))", [
                *(f"(local.set $k{u} (select (i32.add (local.get $k0) (i32.const {self.key_row * u})) (local.get $k0) "
                  f"(i32.lt_s (i32.add (local.get $j) (i32.const {u})) (local.get $keys))))"
                  for u in range(1, 4) if self.page_size % 4),
                *(f"(local.set $d{u} (v128.const i32x4 0 0 0 0))" for u in range(4)),
                *dot,
                ";; (d0, d1, d2, d3) summed across lanes: lane u is key j + u's dot product",
                f"(local.set $d0 (f32x4.add {shuffle(d[0], d[1], (0, 1, 4, 5))} {shuffle(d[0], d[1], (2, 3, 6, 7))}))",
                f"(local.set $d2 (f32x4.add {shuffle(d[2], d[3], (0, 1, 4, 5))} {shuffle(d[2], d[3], (2, 3, 6, 7))}))",
                f"(local.set $s (f32x4.add {shuffle(d[0], d[2], (0, 2, 4, 6))} {shuffle(d[0], d[2], (1, 3, 5, 7))}))",
                *(f"(local.set $s (f32x4.add (local.get $s) (f32x4.mul (f32x4.splat (f32.load offset={4 * e} "
                  f"(local.get $q))) {self.lanes([self.key_word(u, 4 * e, 'f32') for u in range(4)])})))"
                  for e in range(4 * self.words, self.head)),  # the scalar tail of head % 4
                *([f"(local.set $s (f32x4.mul (local.get $s) {_splat(repr(self.scale))}))"] if self.scale != 1.0 else []),
                "(local.set $s (v128.bitselect (local.get $s) " + _splat("-inf"),
                "  (i32x4.lt_s (i32x4.add (i32x4.splat (local.get $j)) (v128.const i32x4 0 1 2 3)) "
                "(i32x4.splat (local.get $keys)))))",
                "(v128.store (local.get $sp) (local.get $s))",
                "(local.set $m (f32x4.max (local.get $m) (local.get $s)))",
                "(local.set $sp (i32.add (local.get $sp) (i32.const 16)))",
                f"(local.set $k0 (i32.add (local.get $k0) (i32.const {4 * self.key_row})))",
                "(local.set $j (i32.add (local.get $j) (i32.const 4)))"]),
            "(local.set $stop (local.get $sp))",
        ]

    def page_weights(self) -> list[str]:
        """The online softmax step of the page: the new running maximum, the correction of
        what came before, the scores replaced by their weights, the running sum."""
        m = "(local.get $m)"
        return [
            ";; the page's maximum joins the running one (f32x4.max and f32.max keep a NaN: the row is NaN)",
            f"(local.set $m (f32x4.max {m} {shuffle(m, m, (2, 3, 0, 1))}))",
            f"(local.set $new_max (f32.max (local.get $running_max) (f32x4.extract_lane 0 (f32x4.max {m} "
            f"{shuffle(m, m, (1, 0, 3, 2))}))))",
            ";; subtracted from the scores: the maximum, or 0 while every score is -inf (weights 0, not NaN)",
            "(local.set $shift (select (f32.const 0) (local.get $new_max) (f32.eq (local.get $new_max) (f32.const -inf))))",
            "(local.set $correction (call $exp_f32 (f32.sub (local.get $running_max) (local.get $shift))))",
            ";; weights exp(score - shift) in place of the scores, and their sum",
            "(local.set $c (f32x4.splat (local.get $shift)))",
            "(local.set $sum (v128.const i32x4 0 0 0 0))",
            f"(local.set $sp (i32.add (local.get $scratch) (i32.const {self.scores})))",
            *repeat("weights", "(i32.lt_u (local.get $sp) (local.get $stop))", [
                "(local.set $p (f32x4.sub (v128.load (local.get $sp)) (local.get $c)))",
                *exp_nonpositive("p"),
                "(v128.store (local.get $sp) (local.get $p))",
                "(local.set $sum (f32x4.add (local.get $sum) (local.get $p)))",
                "(local.set $sp (i32.add (local.get $sp) (i32.const 16)))"]),
            f"(local.set $sum (f32x4.add (local.get $sum) {shuffle('(local.get $sum)', '(local.get $sum)', (2, 3, 0, 1))}))",
            "(local.set $running_sum (f32.add (f32.mul (local.get $running_sum) (local.get $correction))",
            f"  (f32x4.extract_lane 0 (f32x4.add (local.get $sum) {shuffle('(local.get $sum)', '(local.get $sum)', (1, 0, 3, 2))}))))",
            "(local.set $running_max (local.get $new_max))",
        ]

    def page_values(self) -> list[str]:
        """The accumulators times the correction plus the page's weights times its value
        rows (from ``$vp``), :data:`VALUE_CHUNK` words at a time in registers ``$a{i}`` (the
        scalar tail of ``value_head % 4`` in ``$f{e}``, with the last chunk)."""
        chunks = [list(range(first, min(first + VALUE_CHUNK, self.value_words)))
                  for first in range(0, self.value_words, VALUE_CHUNK)] or [[]]
        tail = list(range(4 * self.value_words, self.value_head))
        lines = ["(local.set $c (f32x4.splat (local.get $correction)))"]
        for number, chunk in enumerate(chunks):
            first = chunk[0] if chunk else self.value_words
            scalars = tail if number == len(chunks) - 1 else []
            if not chunk and not scalars:
                continue
            base = 16 * first  # the chunk's first byte in a value row ($vw points there)
            lines += [
                f";; value words {first} .. {first + len(chunk) - 1}" + (" and the scalar tail" if scalars else "")
                + ": acc * correction + the weights times the page's value rows",
                *(f"(local.set $a{w - first} (f32x4.mul (v128.load offset={16 * w} (local.get $scratch)) (local.get $c)))"
                  for w in chunk),
                *(f"(local.set $f{e - tail[0]} (f32.mul (f32.load offset={4 * e} (local.get $scratch)) "
                  "(local.get $correction)))" for e in scalars),
                f"(local.set $sp (i32.add (local.get $scratch) (i32.const {self.scores})))",
                f"(local.set $vw (i32.add (local.get $vp) (i32.const {base})))",
                *repeat(f"values{number}", "(i32.lt_u (local.get $sp) (local.get $weights_end))", [
                    "(local.set $weight (f32.load (local.get $sp)))",
                    "(local.set $p (f32x4.splat (local.get $weight)))",
                    *(f"(local.set $a{w - first} (f32x4.add (local.get $a{w - first}) (f32x4.mul (local.get $p) "
                      f"(v128.load offset={16 * (w - first)} (local.get $vw)))))" for w in chunk),
                    *(f"(local.set $f{e - tail[0]} (f32.add (local.get $f{e - tail[0]}) (f32.mul (local.get $weight) "
                      f"(f32.load offset={4 * e - base} (local.get $vw)))))" for e in scalars),
                    "(local.set $sp (i32.add (local.get $sp) (i32.const 4)))",
                    f"(local.set $vw (i32.add (local.get $vw) (i32.const {self.value_row})))"]),
                *(f"(v128.store offset={16 * w} (local.get $scratch) (local.get $a{w - first}))" for w in chunk),
                *(f"(f32.store offset={4 * e} (local.get $scratch) (local.get $f{e - tail[0]}))" for e in scalars),
            ]
        return lines

    def unit(self) -> list[str]:
        """Query row ``$unit``: its keys page by page, then its output row."""
        group = self.heads // self.kv_heads
        key_page, value_page = self.page_size * self.key_row, self.page_size * self.value_row  # one head's rows
        pages = self.kernel.arguments["pages"] - 1
        return [
            ";; unit = (b * heads + h) * length + t, the query and output row; token n = b * length + t",
            "(local.set $t (i32.rem_u (local.get $unit) (local.get $length)))",
            "(local.set $bh (i32.div_u (local.get $unit) (local.get $length)))",
            f"(local.set $n (i32.add (i32.mul (i32.div_u (local.get $bh) (i32.const {self.heads})) (local.get $length)) "
            "(local.get $t)))",
            *_token_row(self.kernel),
            "(local.set $count (i32.add (local.get $row) (i32.const 1)))  ;; keys 0 .. row",
            f"(local.set $q {element('query', f'(i32.mul (local.get $unit) (i32.const {self.head}))')})",
            ";; key / value head h / (heads / kv_heads): its rows in each page",
            f"(local.set $kv (i32.div_u (i32.rem_u (local.get $bh) (i32.const {self.heads})) (i32.const {group})))",
            f"(local.set $key_head (i32.add (local.get $key) (i32.mul (local.get $kv) (i32.const {key_page}))))",
            f"(local.set $value_head (i32.add (local.get $value) (i32.mul (local.get $kv) (i32.const {value_page}))))",
            ";; accumulators 0, running maximum -inf, running sum 0",
            f"(memory.fill (local.get $scratch) (i32.const 0) (i32.const {self.acc_bytes}))",
            "(local.set $running_max (f32.const -inf))",
            "(local.set $running_sum (f32.const 0))",
            "(local.set $start (i32.const 0))",
            *repeat("pages", "(i32.lt_s (local.get $start) (local.get $count))", [
                ";; positions start .. start + keys - 1: rows 0 .. keys - 1 of page table[start / page_size] (clamped)",
                f"(local.set $page {_clamp('(i32.load (local.get $table))', pages)})",
                f"(local.set $keys (call $main_min (i32.sub (local.get $count) (local.get $start)) "
                f"(i32.const {self.page_size})))",
                f"(local.set $kp (i32.add (local.get $key_head) (i32.mul (local.get $page) "
                f"(i32.const {self.kv_heads * key_page}))))",
                f"(local.set $vp (i32.add (local.get $value_head) (i32.mul (local.get $page) "
                f"(i32.const {self.kv_heads * value_page}))))",
                *self.page_scores(),
                *self.page_weights(),
                "(local.set $weights_end (i32.add (local.get $scratch) (i32.add "
                f"(i32.const {self.scores}) (i32.shl (local.get $keys) (i32.const 2)))))",
                *self.page_values(),
                "(local.set $table (i32.add (local.get $table) (i32.const 4)))",
                f"(local.set $start (i32.add (local.get $start) (i32.const {self.page_size})))"]),
            ";; out = acc / sum",
            f"(local.set $o {element('out', f'(i32.mul (local.get $unit) (i32.const {self.value_head}))')})",
            "(local.set $p (f32x4.splat (local.get $running_sum)))",
            *(f"(v128.store offset={16 * w} (local.get $o) (f32x4.div (v128.load offset={16 * w} (local.get $scratch)) "
              "(local.get $p)))" for w in range(self.value_words)),
            *(f"(f32.store offset={4 * e} (local.get $o) (f32.div (f32.load offset={4 * e} (local.get $scratch)) "
              "(local.get $running_sum)))" for e in range(4 * self.value_words, self.value_head)),
        ]

    def render(self) -> LibraryWat:
        """The kernel's WAT and the scratch bytes ``$main`` needs per thread."""
        arguments = self.kernel.arguments
        body = [
            f"(local.set $length {self.index(arguments['length'])})",
            "(local.set $unit (local.get $first))",
            *loop("unit", "(i32.ge_s (local.get $unit) (local.get $end))", [
                *self.unit(),
                "(local.set $unit (i32.add (local.get $unit) (i32.const 1)))"]),
        ]
        units = [self.index(simplify(arguments["batch"] * self.heads * arguments["length"]))]
        int_locals = ["length", "unit", "t", "bh", "n", "row", "table", "count", "q", "kv", "key_head", "value_head",
                      "start", "page", "keys", "kp", "vp", "k0", *(["k1", "k2", "k3"] if self.page_size % 4 else []), "j",
                      "at", "sp", "stop", "weights_end", "vw", "o"]
        float_locals = ["running_max", "running_sum", "new_max", "shift", "correction", "weight",
                        *(f"f{e}" for e in range(self.value_head % 4))]
        vector_locals = ["word", "s", "m", "c", "p", "sum", "en", "er", "ek", "eh", *(f"d{u}" for u in range(4)),
                         *(f"a{w}" for w in range(min(VALUE_CHUNK, self.value_words)))]
        title = (f"{paged_title(self.kernel)}: one unit per query row, its keys page by page (scores 4 keys at a time, "
                 f"one online softmax step per page, {VALUE_CHUNK} accumulator words in registers at a time)")
        bindings = [buffer.name for buffer in self.kernel.inputs] + ["out"]
        text = kernel_text(title, bindings, units,
                           [*((n, "i32") for n in int_locals), *((n, "f32") for n in float_locals),
                            *((n, "v128") for n in vector_locals)],
                           body, index_helpers("\n".join([*units, *body])))
        return LibraryWat(text, self.acc_bytes + 16 * (-(-self.page_size // 4)))


__all__ = ["VALUE_CHUNK", "PagedAttentionWat", "render_paged_attention", "render_paged_kv_write"]
