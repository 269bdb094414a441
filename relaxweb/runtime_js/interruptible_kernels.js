// Kernels that can be stopped on the page's thread: a kernels.wasm rewritten so that a call
// that runs past its deadline throws, for pages that are not cross-origin isolated (no
// SharedArrayBuffer, so no worker can share the model's memory and be terminated).
//
// The rewrite gives the module a fuel counter (a mutable i64 global) and one import,
// "relaxweb" "deadline" () -> i32, and spends fuel:
// - one unit at the start of every loop's body (every iteration of every loop) and at the
//   entry of every function that calls another (a tree of calls with no loop can run long);
// - one unit per KiB moved by memory.copy, memory.fill and memory.init (one instruction can
//   move gigabytes).
// When the fuel is at or below zero the code calls the import, which throws once the kernel
// call is past its deadline and otherwise returns the fuel to spend until it asks again.
// Nothing else changes (but for counted loops, below): a branch keeps its depth (the check is
// a closed `if`), functions are renumbered by one (the import comes before them) in calls,
// exports and the start function, and the "name" section and any code metadata, whose numbers
// would be stale, are dropped. A branch hint section ("metadata.code.branch_hint") says of
// every check that its fuel is unlikely to run out, so that an engine that reads it (Chromium
// 136 on) keeps the call out of the loop's way.
//
// What it costs: a decrement, a compare and a branch in every iteration of every loop. On one
// thread in Node 20's V8 the convolutional benchmark models take 1.2-1.25x their time, the
// transformers 1.03-1.14x (docs/benchmarks.md, "The deadline on a page that is not isolated");
// in Chromium the branch hints took MobileNetV3 and ResNet-50 from 1.18-1.28 to 0.90-1.05 of
// onnxruntime-web's time. A counted loop (one that counts a local down to zero at its end, as
// the packed matmuls' micro-kernels do) is charged its trip count where it is entered and runs
// without the check; a second copy that checks runs where the count is more than the fuel
// left (`countedLoops`). A 4 x 8 micro-kernel's loop ran at 0.8x its speed as written with the
// check; counted, at its speed (the loop and its branches to outer labels sit one `if` deeper).
// Neither a form without a branch of its own (a `select` in the loop's closing `br_if`) nor
// charging loops that count up (`br_if (i < n)`) on entry measured better, when the models'
// time was in short loops entered often. An isolated page pays nothing: its workers run the
// bundle's kernels.wasm as written, and are terminated.
//
// It is the runtime that rewrites, from whatever bytes it was given, so a damaged or hostile
// kernels.wasm is stopped as surely as one relaxweb wrote; an instruction the rewrite does not
// know is refused (relaxweb's kernels use the core instructions, SIMD, bulk memory and atomics).
// Python needs none of this: wasmtime interrupts a call by its epochs (runtime/wasm_backend.py).
// The browser runtime rewrites the bundle's host.wasm the same way (page_host.js): it runs on
// the page's thread too, every call under a limit.

/** The module and field of the import a rewritten kernels.wasm calls when its fuel runs out. */
export const DEADLINE_IMPORT = ["relaxweb", "deadline"];
/** Fuel given at a time: about a millisecond of a tight loop between two looks at the clock. */
export const FUEL_REFILL = 1 << 20;

/**
 * The deadline of a call into a rewritten module on the page's thread: `deadline` is the import
 * the module calls when its fuel runs out. It throws `late(timeoutMs)` once the call is past its
 * deadline and otherwise gives more fuel. The wasm backend's kernel calls and the host module's
 * calls (page_host.js) each have one.
 */
export class DeadlineClock {
  /** @param {(timeoutMs: number) => Error} late */
  constructor(late) {
    this.endsAt = Infinity;
    this.timeoutMs = Infinity;
    this.deadline = () => {
      if (performance.now() <= this.endsAt) return FUEL_REFILL;
      throw late(this.timeoutMs);
    };
  }

  /** A call starts now, to run at most `timeoutMs`. @param {number} timeoutMs */
  start(timeoutMs) {
    this.timeoutMs = timeoutMs;
    this.endsAt = performance.now() + timeoutMs;
  }
}
/** log2 of the bytes of a bulk memory instruction that cost one unit of fuel. */
const BYTES_PER_FUEL_SHIFT = 10;

const SECTION = { custom: 0, type: 1, import: 2, function: 3, global: 6, export: 7, start: 8, element: 9, code: 10 };
/** Where each known section goes, in the order the binary format requires (tag 13 before global, data count 12 before code). */
const SECTION_ORDER = new Map([[1, 1], [2, 2], [3, 3], [4, 4], [5, 5], [13, 6], [6, 7], [7, 8], [8, 9], [9, 10], [12, 11], [10, 12], [11, 13]]);
const VALUE_TYPES = new Set([0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f]);
const I32 = 0x7f;
const I64 = 0x7e;

/**
 * `bytes` (a kernels.wasm) rewritten so that every call can be stopped: see the file's comment.
 * Throws naming what it cannot rewrite (not a module, an instruction or section it does not know).
 * @param {ArrayBuffer|Uint8Array} bytes
 * @returns {Uint8Array}
 */
export function interruptibleKernels(bytes) {
  const data = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const header = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
  if (data.length < 8 || header.some((byte, i) => data[i] !== byte)) throw new Error("not a WebAssembly module (version 1)");
  const sections = sectionsOf(data);
  for (const { id } of sections) {
    if (id !== SECTION.custom && !SECTION_ORDER.has(id)) throw new Error(`kernels.wasm has a section relaxweb does not know (id ${id})`);
    if (id === SECTION.element) throw new Error("kernels.wasm has an element section (a table of functions), which relaxweb's kernels never have");
  }
  const find = (/** @type {number} */ id) => sections.find((s) => s.id === id);

  const types = readTypes(find(SECTION.type)?.body);
  const imports = readImports(find(SECTION.import)?.body);
  const firstDefined = imports.functions; // the import's index; defined functions move up by one
  const deadlineType = types.length;
  const renumber = (/** @type {number} */ f) => (f >= firstDefined ? f + 1 : f);
  const functionTypes = readVector(find(SECTION.function)?.body, (reader) => reader.leb());
  const globalCount = imports.globals + readCount(find(SECTION.global)?.body);

  const replaced = new Map();
  /** @type {Uint8Array|null} */
  let hints = null; // the branch hint section's body: every fuel check unlikely to run out
  replaced.set(SECTION.type, appendToVector(find(SECTION.type)?.body, [0x60, 0x00, 0x01, I32]));
  replaced.set(SECTION.import, appendToVector(find(SECTION.import)?.body,
    [...name(DEADLINE_IMPORT[0]), ...name(DEADLINE_IMPORT[1]), 0x00, ...leb(deadlineType)]));
  replaced.set(SECTION.global, appendToVector(find(SECTION.global)?.body, [I64, 0x01, 0x42, ...sleb(FUEL_REFILL), 0x0b]));
  if (find(SECTION.export)) replaced.set(SECTION.export, renumberExports(find(SECTION.export).body, renumber));
  if (find(SECTION.start)) replaced.set(SECTION.start, leb(renumber(new Reader(find(SECTION.start).body).leb())));
  if (find(SECTION.code)) {
    const context = { fuel: globalCount, deadline: firstDefined, renumber };
    const bodies = readVector(find(SECTION.code).body, (reader) => reader.bytes(reader.leb()));
    if (bodies.length !== functionTypes.length) throw new Error("kernels.wasm's function and code sections disagree");
    const code = new Bytes(leb(bodies.length));
    /** @type {[number, number[]][]} */
    const hinted = []; // [function index, offsets of its fuel checks' `if`s]
    bodies.forEach((body, f) => {
      const rewritten = rewriteBody(body, types[functionTypes[f]]?.params ?? fail("a function of an unknown type"), context);
      code.append(leb(rewritten.body.length)).append(rewritten.body);
      if (rewritten.checks.length) hinted.push([firstDefined + 1 + f, rewritten.checks]);
    });
    replaced.set(SECTION.code, code.array());
    if (hinted.length) hints = branchHints(hinted);
  }

  const out = new Bytes(header);
  const emit = (/** @type {number} */ id, /** @type {ArrayLike<number>} */ body) => out.append([id, ...leb(body.length)]).append(body);
  const pending = new Map(replaced);
  for (const { id, body } of sections) {
    if (id === SECTION.custom) { // the names and any code metadata name places that have moved
      const title = new Reader(body).name();
      if (title !== "name" && !title.startsWith("metadata.code.")) emit(id, body);
      continue;
    }
    if (id === SECTION.code && hints) emit(SECTION.custom, hints); // before the code section, as it must be
    for (const [missing, missingBody] of pending) { // a section the module lacked goes before the first that follows it
      if (!sections.some((s) => s.id === missing) && SECTION_ORDER.get(missing) < SECTION_ORDER.get(id)) {
        emit(missing, missingBody);
        pending.delete(missing);
      }
    }
    emit(id, pending.get(id) ?? body);
    pending.delete(id);
  }
  for (const [id, body] of pending) emit(id, body); // sections the module lacked, after all of its own
  return out.array();
}

/**
 * A module's sections in order (after its header). @param {Uint8Array} data
 * @returns {{id: number, body: Uint8Array}[]}
 */
function sectionsOf(data) {
  const sections = [];
  for (let position = 8; position < data.length;) {
    const id = data[position];
    const [size, start] = readLeb(data, position + 1);
    if (start + size > data.length) throw new Error("kernels.wasm is truncated");
    sections.push({ id, body: data.subarray(start, start + size) });
    position = start + size;
  }
  return sections;
}

/**
 * How many counted loops (see countedLoops: charged on entry, no check inside) each function
 * of `bytes` has, in order of the code section: what the tests hold the compiler's
 * micro-kernels to.
 * @param {Uint8Array} bytes @returns {number[]}
 */
export function countedLoopsPerFunction(bytes) {
  const code = sectionsOf(bytes).find((s) => s.id === SECTION.code)?.body;
  return readVector(code, (reader) => {
    const body = reader.bytes(reader.leb());
    const locals = new Reader(body);
    for (let groups = locals.leb(); groups > 0; groups--) {
      locals.leb();
      locals.byte();
    }
    return countedLoops(body, locals.position).size;
  });
}

/**
 * The body of a "metadata.code.branch_hint" custom section (the branch hinting proposal,
 * Chromium 136 on) saying of each fuel check's `if` that its condition is likely false: the
 * engine then lays out and allocates registers for the loop without the call to the deadline
 * import, which it places out of the loop's way.
 * @param {[number, number[]][]} functions [function index, offsets of `if`s from the start of its locals], by index
 * @returns {Uint8Array}
 */
function branchHints(functions) {
  const section = new Bytes(name("metadata.code.branch_hint")).append(leb(functions.length));
  for (const [index, offsets] of functions) {
    section.append(leb(index)).append(leb(offsets.length));
    for (const offset of offsets) section.append(leb(offset)).append([0x01, 0x00]); // size 1, "likely false"
  }
  return section.array();
}

/** @param {string} message @returns {never} */
function fail(message) {
  throw new Error(`kernels.wasm cannot be made interruptible: ${message}`);
}

/**
 * A function body with fuel spent at its loops (and its entry, when it calls), bulk memory
 * instructions charged, and calls renumbered.
 *
 * The body spends from a local copy of the fuel, which the engine keeps in a register (the
 * global itself in every loop measured 1.5x the time of mobilenet_v3_large, the local 1.25x):
 * it takes the global's value on entry and after each call, and gives its own back before
 * each call and wherever the function returns (`return`, a branch to the body's own label,
 * its last `end`), so that a callee's loops count against its caller's.
 *
 * A counted loop (:func:`countedLoops`: one that repeats by counting a local down to zero)
 * is charged its trip count where it is entered, in one subtraction, and then runs as
 * written; only where its count is more than the fuel left does a second copy of it run,
 * spending at each iteration. Its iterations still cost one unit each, so the clock is
 * looked at as often as before: it is the check in the loop that goes.
 * @param {Uint8Array} body @param {number} params
 * @param {{fuel: number, deadline: number, renumber: (f: number) => number}} context
 * @returns {{body: Uint8Array, checks: number[]}} the body, and where its fuel checks' `if`s are (from its start)
 */
function rewriteBody(body, params, { fuel, deadline, renumber }) {
  const reader = new Reader(body);
  const localGroups = reader.leb();
  let locals = params;
  /** @type {number[]} */
  const declarations = [];
  for (let g = 0; g < localGroups; g++) {
    const count = reader.leb();
    const type = reader.byte();
    locals += count;
    declarations.push(...leb(count), type);
  }
  const counted = countedLoops(body, reader.position);
  const left = locals; // an i64 local added: the fuel this call has left
  const scratch = locals + 1; // an i32 local added: a bulk instruction's byte count
  const trips = locals + 2; // an i64 local added: a counted loop's iterations
  const load = [0x23, ...leb(fuel), 0x21, ...leb(left)]; // left = fuel
  const store = [0x20, ...leb(left), 0x24, ...leb(fuel)]; // fuel = left
  const decrement = [0x20, ...leb(left), 0x42, 0x01, 0x7d, 0x22, ...leb(left), 0x42, 0x00, 0x57]; // left -= 1; left <= 0
  const spend = [...decrement, 0x04, 0x40, // if left <= 0
    0x10, ...leb(deadline), 0xad, 0x21, ...leb(left), 0x0b]; //   left = deadline() (it throws past the deadline)
  /** @type {number[]} */
  const checks = []; // where each loop's fuel check has its `if`, from the start of `code`
  const charge = [0x22, ...leb(scratch), 0x20, ...leb(left), 0x20, ...leb(scratch), 0xad, // left -= bytes >> 10, the count kept
    0x42, BYTES_PER_FUEL_SHIFT, 0x88, 0x7d, 0x21, ...leb(left)];
  const code = new Bytes();
  let calls = false;
  let depth = 0; // blocks open inside the body: a branch to label `depth` leaves the function
  /**
   * One instruction from `reader`, rewritten. `wrapped`: inside a counted loop's copy, which
   * sits in an `if` the body did not have, the depth of that loop; branches to labels outside
   * it (below that depth) count one more label.
   * @param {number|null} wrapped
   */
  const rewriteNext = (wrapped) => {
    const start = reader.position;
    const opcode = reader.byte();
    const copy = () => code.append(body.subarray(start, reader.position));
    if (opcode === 0x02 || opcode === 0x04) { // block, if
      reader.blockType();
      depth += 1;
      copy();
    } else if (opcode === 0x03 && counted.has(start)) { // a counted loop: charged on entry
      const { counter, end } = counted.get(start) ?? fail("a counted loop went missing");
      reader.blockType();
      const first = reader.position;
      code.append([0x20, ...leb(counter), 0x41, 0x01, 0x6b, 0xad, 0x42, 0x01, 0x7c, 0x21, ...leb(trips)]) // trips = u64(counter - 1) + 1
        .append([0x20, ...leb(left), 0x20, ...leb(trips), 0x55, 0x04, 0x40]) // if left > trips
        .append([0x20, ...leb(left), 0x20, ...leb(trips), 0x7d, 0x21, ...leb(left)]); //   left -= trips
      for (const checked of [false, true]) {
        if (checked) code.append([0x05]); // else
        reader.position = first;
        depth += 1;
        code.append([0x03, 0x40]);
        if (checked) {
          checks.push(code.length + decrement.length);
          code.append(spend);
        }
        while (reader.position < end) rewriteNext(depth);
        depth -= 1;
        code.append([0x0b]);
      }
      reader.position = end + 1; // the loop's end
      code.append([0x0b]); // the if's
    } else if (opcode === 0x03) { // loop: spend at the top of its body
      reader.blockType();
      depth += 1;
      copy();
      checks.push(code.length + decrement.length);
      code.append(spend);
    } else if (opcode === 0x0b) { // end: of a block, or of the body (a return)
      if (depth === 0) code.append(store);
      depth -= 1;
      copy();
    } else if (opcode === 0x0f) { // return
      code.append(store);
      copy();
    } else if (opcode === 0x0c || opcode === 0x0d || opcode === 0x0e) { // br, br_if, br_table
      const labels = opcode === 0x0e ? Array.from({ length: reader.leb() + 1 }, () => reader.leb()) : [reader.leb()];
      if (labels.includes(depth)) code.append(store);
      if (wrapped === null) {
        copy();
      } else {
        const moved = labels.map((label) => (depth - label < wrapped ? label + 1 : label));
        code.append([opcode, ...(opcode === 0x0e ? leb(moved.length - 1) : []), ...moved.flatMap(leb)]);
      }
    } else if (opcode === 0x10 || opcode === 0x12) { // call, return_call
      code.append(store).append([opcode, ...leb(renumber(reader.leb()))]);
      if (opcode === 0x10) code.append(load);
      calls = true;
    } else if (opcode === 0x11 || opcode === 0x13) { // call_indirect, return_call_indirect
      skipImmediates(reader, opcode);
      code.append(store);
      copy();
      if (opcode === 0x11) code.append(load);
      calls = true;
    } else if (opcode === 0xd2) { // ref.func
      code.append([opcode, ...leb(renumber(reader.leb()))]);
    } else if (opcode === 0xfc && [8, 10, 11].includes(new Reader(body, reader.position).leb())) { // memory.init, copy, fill
      skipImmediates(reader, opcode);
      code.append(charge);
      copy();
    } else {
      skipImmediates(reader, opcode);
      copy();
    }
  };
  while (!reader.done()) rewriteNext(null);
  if (depth !== -1) fail("a function's blocks do not end");
  const head = [...leb(localGroups + 3), ...declarations, 0x01, I64, 0x01, I32, 0x01, I64, ...load];
  const entry = calls ? [head.length + decrement.length] : [];
  return {
    body: new Bytes(head).append(calls ? spend : []).append(code.array()).array(),
    checks: [...entry, ...checks.map((at) => at + head.length + (calls ? spend.length : 0))],
  };
}

/**
 * The counted loops of a function's code (from `codeStart`, after its locals): by the offset
 * of their `loop`, the local they count down and the offset of their `end`.
 *
 * A counted loop has no result or parameters and ends with `counter = counter - 1; br_if 0
 * (counter)` (`local.get c  i32.const 1  i32.sub  local.set c  local.get c  br_if 0`, or
 * with `local.tee c`); nothing else in it writes the counter or branches back to its top,
 * and it holds no loop, call or bulk memory instruction. So it runs at most
 * u32(counter - 1) + 1 iterations from its entry (2^32 from 0), fewer where it branches out.
 * relaxweb's micro-kernels (the packed matmuls' reduction steps) are written so.
 * @param {Uint8Array} body @param {number} codeStart
 * @returns {Map<number, {counter: number, end: number}>}
 */
function countedLoops(body, codeStart) {
  /** @type {{start: number, opcode: number, immediate: number, labels: number[]}[]} */
  const instructions = [];
  const reader = new Reader(body, codeStart);
  while (!reader.done()) {
    const start = reader.position;
    const opcode = reader.byte();
    let immediate = -1;
    let labels = /** @type {number[]} */ ([]);
    if (opcode === 0x03) {
      immediate = reader.data[reader.position]; // the block type's first byte: 0x40 for none
      reader.blockType();
    } else if (opcode >= 0x20 && opcode <= 0x22) { // local.get, set, tee
      immediate = reader.leb();
    } else if (opcode === 0x41) {
      immediate = reader.data[reader.position] === 0x01 ? 1 : -1; // i32.const 1 (one byte), or something else
      reader.sleb();
    } else if (opcode === 0x0c || opcode === 0x0d || opcode === 0x0e) {
      labels = opcode === 0x0e ? Array.from({ length: reader.leb() + 1 }, () => reader.leb()) : [reader.leb()];
    } else if (opcode === 0xfc) {
      immediate = new Reader(body, reader.position).leb();
      skipImmediates(reader, opcode);
    } else {
      skipImmediates(reader, opcode);
    }
    instructions.push({ start, opcode, immediate, labels });
  }
  /** @type {Map<number, {counter: number, end: number}>} */
  const loops = new Map();
  /** @type {number[]} */
  const open = []; // the instruction index of each open block, loop and if
  instructions.forEach((instruction, index) => {
    if (instruction.opcode >= 0x02 && instruction.opcode <= 0x04) open.push(index);
    if (instruction.opcode !== 0x0b) return;
    const first = open.pop();
    if (first === undefined || instructions[first].opcode !== 0x03 || instructions[first].immediate !== 0x40) return;
    const counter = countedTail(instructions.slice(first + 1, index));
    if (counter !== null) loops.set(instructions[first].start, { counter, end: instruction.start });
  });
  return loops;
}

/**
 * The local a loop's body counts down (see countedLoops), or null where it is not counted.
 * @param {{opcode: number, immediate: number, labels: number[]}[]} inside the instructions between the loop and its end
 * @returns {number|null}
 */
function countedTail(inside) {
  const is = (/** @type {number} */ at, /** @type {number} */ opcode, /** @type {number} */ immediate) =>
    at >= 0 && inside[at].opcode === opcode && inside[at].immediate === immediate;
  const last = inside.length - 1;
  if (last < 0 || inside[last].opcode !== 0x0d || inside[last].labels[0] !== 0) return null;
  const counter = inside[last - 1]?.immediate ?? -1;
  let head;
  if (inside[last - 1]?.opcode === 0x22) head = last - 4; // local.get c, i32.const 1, i32.sub, local.tee c, br_if 0
  else if (inside[last - 1]?.opcode === 0x20 && is(last - 2, 0x21, counter)) head = last - 5; // ..., local.set c, local.get c, br_if 0
  else return null;
  if (!is(head, 0x20, counter) || !is(head + 1, 0x41, 1) || inside[head + 2]?.opcode !== 0x6b) return null;
  let nesting = 0; // blocks open inside the loop's body: label `nesting` is the loop
  for (const { opcode, immediate, labels } of inside.slice(0, head)) {
    if (opcode === 0x03 || (opcode >= 0x10 && opcode <= 0x13) || (opcode === 0xfc && [8, 10, 11].includes(immediate))) return null;
    if ((opcode === 0x21 || opcode === 0x22) && immediate === counter) return null;
    if (labels.includes(nesting)) return null;
    if (opcode === 0x02 || opcode === 0x04) nesting += 1;
    if (opcode === 0x0b) nesting -= 1;
  }
  return nesting === 0 ? counter : null;
}

/**
 * Move `reader` past the immediates of the instruction `opcode` (already read); an opcode it
 * does not know is refused.
 * @param {Reader} reader @param {number} opcode
 */
function skipImmediates(reader, opcode) {
  if (opcode <= 0x01 || opcode === 0x05 || opcode === 0x0b || opcode === 0x0f || opcode === 0x1a || opcode === 0x1b ||
      (opcode >= 0x45 && opcode <= 0xc4) || opcode === 0xd1) return; // no immediates
  if (opcode >= 0x02 && opcode <= 0x04) return void reader.blockType(); // block, loop, if
  if (opcode === 0x0c || opcode === 0x0d || opcode === 0x10 || opcode === 0x12 || opcode === 0xd2 ||
      (opcode >= 0x20 && opcode <= 0x26)) return void reader.leb(); // br, br_if, call, locals, globals, tables
  if (opcode === 0x0e) { // br_table
    for (let n = reader.leb(); n >= 0; n--) reader.leb();
    return;
  }
  if (opcode === 0x11 || opcode === 0x13) return void (reader.leb(), reader.leb()); // call_indirect: type, table
  if (opcode === 0x1c) return void reader.bytes(reader.leb()); // select with types
  if (opcode >= 0x28 && opcode <= 0x3e) return reader.memarg();
  if (opcode === 0x3f || opcode === 0x40) return void reader.leb(); // memory.size, memory.grow
  if (opcode === 0x41 || opcode === 0x42) return void reader.sleb(); // i32.const, i64.const
  if (opcode === 0x43) return void reader.bytes(4);
  if (opcode === 0x44) return void reader.bytes(8);
  if (opcode === 0xd0) return void reader.byte(); // ref.null
  if (opcode === 0xfc) {
    const sub = reader.leb();
    if (sub <= 7) return; // saturating truncations
    if (sub === 8) return void (reader.leb(), reader.leb()); // memory.init
    if (sub === 9 || sub === 11 || sub === 13 || (sub >= 15 && sub <= 17)) return void reader.leb();
    if (sub === 10 || sub === 12 || sub === 14) return void (reader.leb(), reader.leb());
    fail(`it uses the instruction 0xfc ${sub}, which relaxweb does not know`);
  }
  if (opcode === 0xfd) { // SIMD
    const sub = reader.leb();
    if (sub <= 0x0b || sub === 0x5c || sub === 0x5d) return reader.memarg(); // loads, store, load zero
    if (sub === 0x0c || sub === 0x0d) return void reader.bytes(16); // v128.const, i8x16.shuffle
    if (sub >= 0x15 && sub <= 0x22) return void reader.byte(); // extract and replace lane
    if (sub >= 0x54 && sub <= 0x5b) return void (reader.memarg(), reader.byte()); // load and store lane
    if (sub <= 0x113) return; // the rest: no immediates (relaxed SIMD included)
    fail(`it uses the instruction 0xfd ${sub}, which relaxweb does not know`);
  }
  if (opcode === 0xfe) { // atomics
    const sub = reader.leb();
    if (sub === 0x03) return void reader.byte(); // atomic.fence
    if (sub <= 0x02 || (sub >= 0x10 && sub <= 0x4e)) return reader.memarg();
    fail(`it uses the instruction 0xfe ${sub}, which relaxweb does not know`);
  }
  fail(`it uses the instruction 0x${opcode.toString(16)}, which relaxweb does not know`);
}

/** Reads a module's bytes: LEB128 numbers, names, block types, memory arguments. */
class Reader {
  /** @param {Uint8Array} data @param {number} [position] */
  constructor(data, position = 0) {
    this.data = data;
    this.position = position;
  }

  done() {
    return this.position >= this.data.length;
  }

  byte() {
    if (this.position >= this.data.length) fail("it is truncated");
    return this.data[this.position++];
  }

  /** @param {number} n */
  bytes(n) {
    if (this.position + n > this.data.length) fail("it is truncated");
    return this.data.subarray(this.position, (this.position += n));
  }

  leb() {
    const [value, after] = readLeb(this.data, this.position);
    this.position = after;
    return value;
  }

  sleb() {
    for (let shift = 0; shift < 70; shift += 7) if (this.byte() < 0x80) return;
    fail("a number is too long");
  }

  name() {
    return new TextDecoder().decode(this.bytes(this.leb()));
  }

  blockType() {
    const first = this.data[this.position];
    if (first === 0x40 || VALUE_TYPES.has(first)) this.position++;
    else this.sleb(); // a type index
  }

  memarg() {
    const align = this.leb();
    if (align & 0x40) this.leb(); // a memory index
    this.leb(); // offset
  }
}

/**
 * The function types of a type section (only function types: relaxweb's kernels have no others).
 * @param {Uint8Array|undefined} body @returns {{params: number}[]}
 */
function readTypes(body) {
  return readVector(body, (reader) => {
    if (reader.byte() !== 0x60) fail("its type section holds a type that is not a function type");
    const params = reader.leb();
    reader.bytes(params);
    reader.bytes(reader.leb());
    return { params };
  });
}

/**
 * How many functions and globals a module imports.
 * @param {Uint8Array|undefined} body @returns {{functions: number, globals: number}}
 */
function readImports(body) {
  const counts = { functions: 0, globals: 0 };
  readVector(body, (reader) => {
    reader.name();
    reader.name();
    const kind = reader.byte();
    if (kind === 0x00) {
      reader.leb();
      counts.functions++;
    } else if (kind === 0x01 || kind === 0x02) { // table (a reference type, then limits), memory (limits)
      if (kind === 0x01) reader.byte();
      const flags = reader.byte();
      reader.leb();
      if (flags & 0x01) reader.leb();
    } else if (kind === 0x03) {
      reader.bytes(2);
      counts.globals++;
    } else {
      fail(`it imports something relaxweb does not know (kind ${kind})`);
    }
  });
  return counts;
}

/** The export section with function indices renumbered. @param {Uint8Array} body @param {(f: number) => number} renumber */
function renumberExports(body, renumber) {
  /** @type {number[]} */
  const out = [];
  const entries = readVector(body, (reader) => {
    const start = reader.position;
    reader.name();
    const named = Array.from(body.subarray(start, reader.position));
    const kind = reader.byte();
    const index = reader.leb();
    return [...named, kind, ...leb(kind === 0x00 ? renumber(index) : index)];
  });
  out.push(...leb(entries.length));
  for (const entry of entries) out.push(...entry);
  return out;
}

/**
 * Each entry of a vector section, read by `read`; [] for a missing section. The whole body must be read.
 * @template T @param {Uint8Array|undefined} body @param {(reader: Reader) => T} read @returns {T[]}
 */
function readVector(body, read) {
  if (!body) return [];
  const reader = new Reader(body);
  const entries = Array.from({ length: reader.leb() }, () => read(reader));
  if (!reader.done()) fail("a section has bytes after its entries");
  return entries;
}

/** @param {Uint8Array|undefined} body @returns {number} */
function readCount(body) {
  return body ? new Reader(body).leb() : 0;
}

/** A vector section with one more entry. @param {Uint8Array|undefined} body @param {number[]} entry @returns {Uint8Array} */
function appendToVector(body, entry) {
  if (!body) return new Uint8Array([0x01, ...entry]);
  const reader = new Reader(body);
  const count = reader.leb();
  return new Bytes(leb(count + 1)).append(body.subarray(reader.position)).append(entry).array();
}

/** A growing byte string (large modules: no spreading of big arrays). */
class Bytes {
  /** @param {ArrayLike<number>} [start] */
  constructor(start = []) {
    this.buffer = new Uint8Array(Math.max(1024, start.length * 2));
    this.length = 0;
    this.append(start);
  }

  /** @param {ArrayLike<number>} bytes @returns {Bytes} */
  append(bytes) {
    if (this.length + bytes.length > this.buffer.length) {
      const grown = new Uint8Array(Math.max(this.buffer.length * 2, this.length + bytes.length));
      grown.set(this.buffer.subarray(0, this.length));
      this.buffer = grown;
    }
    this.buffer.set(bytes, this.length);
    this.length += bytes.length;
    return this;
  }

  /** @returns {Uint8Array} */
  array() {
    return this.buffer.slice(0, this.length);
  }
}

/** @param {string} text @returns {number[]} */
function name(text) {
  const bytes = new TextEncoder().encode(text);
  return [...leb(bytes.length), ...bytes];
}

/** Unsigned LEB128. @param {number} value @returns {number[]} */
function leb(value) {
  const out = [];
  do {
    let byte = value % 128;
    value = Math.floor(value / 128);
    if (value > 0) byte |= 0x80;
    out.push(byte);
  } while (value > 0);
  return out;
}

/** Signed LEB128 of a non-negative number. @param {number} value @returns {number[]} */
function sleb(value) {
  const out = [];
  for (;;) {
    const byte = value % 128;
    value = Math.floor(value / 128);
    if (value === 0 && (byte & 0x40) === 0) return [...out, byte];
    out.push(byte | 0x80);
  }
}

/**
 * An unsigned LEB128 number at `position`: [value, position after it].
 * @param {Uint8Array} data @param {number} position @returns {[number, number]}
 */
export function readLeb(data, position) {
  let value = 0;
  for (let shift = 0; ; shift += 7) {
    if (position >= data.length || shift > 35) throw new Error("kernels.wasm is truncated or damaged");
    const byte = data[position++];
    value += (byte & 0x7f) * 2 ** shift;
    if (byte < 0x80) return [value, position];
  }
}
