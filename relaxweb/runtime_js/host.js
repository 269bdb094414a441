// The host module of a relaxweb bundle (host.wasm), wrapped for JavaScript.
//
// No GPU here: this file only does shape checks, shape arithmetic and reads the command
// list, so it runs the same in Node and in browsers. The ABI is described in
// docs/bundle-format.md ("host.wasm", and "Values read back" for read records, read
// values and resume()).

import { GpuTensor } from "./gpu_tensor.js";

// What a device must offer and which kernel shaders it compiles live with the WebGPU device
// and kernels; "./host" (package.json) still exports them.
export {
  PART_ALIGNMENT, deviceShortfalls, loadTimeLimits, smallestPartBytes, storageNote, storageSizeProblem, weightPartSizes,
} from "./webgpu_device.js";
export { SHADER_F16, chooseKernels } from "./webgpu_kernels.js";

/** The bundle format version this runtime reads (the manifest's `version`). */
export const FORMAT_VERSION = 3;

/** Opcode of a command record: dispatch `call_sites[callSite]` over a workgroup grid. */
export const OPCODE_DISPATCH = 1;
/** Opcode of a command record: read an i32 back from a storage (always a list's last record). */
export const OPCODE_READ = 2;
/** Opcode of a command record: submit, then resume() with nothing to read (a loop's iteration; always a list's last record). */
export const OPCODE_RESUME = 3;

/**
 * Typed array class of each dtype a bundle's inputs and outputs may have. float16 data is a
 * Uint16Array of IEEE half-precision bit patterns (an input may also be a Float16Array where
 * the JS engine has one); outputs are always Uint16Array bits (halfBitsToFloat reads them).
 */
export const TYPED_ARRAY_OF_DTYPE = {
  float32: Float32Array,
  float64: Float64Array,
  float16: Uint16Array,
  int32: Int32Array,
  int16: Int16Array,
  int8: Int8Array,
  uint32: Uint32Array,
  uint16: Uint16Array,
  uint8: Uint8Array,
  int64: BigInt64Array,
  bool: Uint8Array,
};

/**
 * Other typed array classes accepted for an input of a dtype: int64 data that is already
 * int32 (as the GPU holds it), float16 data as a Float16Array where one exists.
 * @type {Record<string, Function[]>}
 */
const ALSO_ACCEPTED = {
  int64: [Int32Array],
  float16: /** @type {any} */ (globalThis).Float16Array ? [/** @type {any} */ (globalThis).Float16Array] : [],
};

/**
 * A dtype's entry in the manifest's `dtypes` table (docs/bundle-format.md): its bytes per
 * element in the model, its kind, the dtype (and bytes) it has in GPU memory, and the dtype
 * (and bytes) it has in kernels.wasm's memory (int64 as int64; tensors.js's wasmManifest
 * gives the wasm backend a table whose device_dtype and device_bytes are these).
 * @typedef {{bytes: number, kind: "float"|"int"|"uint"|"bool", device_dtype: string, device_bytes: number,
 *   wasm_dtype: string, wasm_bytes: number}} DtypeInfo
 */

const halfView = new DataView(new ArrayBuffer(4));

/**
 * The float value of IEEE half-precision bits.
 * @param {number} bits 0..65535
 * @returns {number}
 */
export function halfBitsToFloat(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * fraction * 2 ** -24;
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}

/**
 * The IEEE half-precision bits of a float (rounded to nearest even, like numpy's astype):
 * beyond the half range it is infinity.
 * @param {number} value
 * @returns {number}
 */
export function floatToHalfBits(value) {
  halfView.setFloat32(0, value);
  const f = halfView.getUint32(0);
  const sign = (f >>> 16) & 0x8000;
  const exponent = (f >>> 23) & 0xff;
  const mantissa = f & 0x7fffff;
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa ? 0x200 : 0); // inf, NaN
  const e = exponent - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow: infinity
  if (e <= 0) { // subnormal half (or zero)
    if (e < -10) return sign;
    const m = mantissa | 0x800000;
    const shift = 14 - e;
    let half = m >>> shift;
    const rest = m & ((1 << shift) - 1);
    const halfway = 1 << (shift - 1);
    if (rest > halfway || (rest === halfway && (half & 1))) half += 1;
    return sign | half;
  }
  let half = (e << 10) | (mantissa >>> 13);
  const rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (half & 1))) half += 1; // may carry into the exponent: correct
  return sign | half;
}

/**
 * The entry of a tensor's dtype in the manifest's `dtypes` table.
 * @param {any} manifest
 * @param {{name: string, dtype: string}} spec an input, output or weight of the manifest
 * @returns {DtypeInfo}
 */
export function dtypeInfo(manifest, spec) {
  const info = manifest.dtypes?.[spec.dtype];
  if (!info) throw new Error(`the manifest's dtypes table has no entry for ${spec.dtype} (the dtype of '${spec.name}')`);
  return info;
}

/**
 * An input's data as the GPU holds it (`info.device_dtype`): int64 -> int32 (an
 * InputShapeError naming the input when a value does not fit; where the device holds int64
 * as int64, kernels.wasm, an int64 input is kept and an Int32Array widened), bool -> uint32 0/1, float16
 * (Uint16Array bits or Float16Array) and float64 -> float32 (rounded), int8/int16 -> int32,
 * uint8/uint16 -> uint32; float32, int32 and uint32 unchanged.
 * @param {{name: string, dtype: string}} spec
 * @param {DtypeInfo} info the dtype's entry in the manifest (dtypeInfo)
 * @param {ArrayBufferView & {length: number}} data already checked by checkInputs
 * @returns {ArrayBufferView}
 */
export function toDeviceData(spec, info, data) {
  const target = info.device_dtype;
  if (target === "int64" && data instanceof Int32Array) {
    // int32 data for an int64 input where the device holds int64 (kernels.wasm): sign-extended
    return BigInt64Array.from(data, (v) => BigInt(v));
  }
  if (target === spec.dtype || data instanceof Int32Array && target === "int32") return data;
  if (data instanceof BigInt64Array) {
    // a 64-bit integer on a 32-bit device: every value must fit
    const converted = new Int32Array(data.length);
    for (let i = 0; i < data.length; i++) {
      const value = data[i];
      if (value < -2147483648n || value > 2147483647n) {
        throw new InputShapeError(
          `input '${spec.name}': value ${value} at flat index ${i} does not fit in ${target} (${spec.dtype} tensors are ${target} on the GPU)`,
        );
      }
      converted[i] = Number(value);
    }
    return converted;
  }
  if (info.kind === "bool") {
    const converted = new Uint32Array(data.length);
    const bytes = /** @type {Uint8Array} */ (data);
    for (let i = 0; i < bytes.length; i++) converted[i] = bytes[i] !== 0 ? 1 : 0;
    return converted;
  }
  if (spec.dtype === "float16" && data instanceof Uint16Array) {
    return Float32Array.from(data, halfBitsToFloat);
  }
  // float64 -> float32 (rounded), a Float16Array -> float32, int8/int16 -> int32,
  // uint8/uint16 -> uint32: every value fits.
  const deviceClass = TYPED_ARRAY_OF_DTYPE[/** @type {"float32"} */ (target)];
  return deviceClass.from(/** @type {ArrayLike<number>} */ (/** @type {unknown} */ (data)));
}

/**
 * An output read back from the GPU (held as `info.device_dtype`), in its model dtype: int32
 * -> BigInt64Array for int64, uint32 -> Uint8Array (0/1) for bool, float32 -> Uint16Array of
 * half bits for float16 (rounded to nearest even) and Float64Array for float64, int32 ->
 * Int8Array/Int16Array and uint32 -> Uint8Array/Uint16Array (the low bits, like numpy's astype).
 * @param {{dtype: string}} spec
 * @param {DtypeInfo} info the dtype's entry in the manifest (dtypeInfo)
 * @param {ArrayBuffer} bytes the output's bytes as the GPU holds them
 * @returns {ArrayBufferView & {length: number}}
 */
export function fromDeviceData(spec, info, bytes) {
  const stored = new (TYPED_ARRAY_OF_DTYPE[/** @type {"float32"} */ (info.device_dtype)])(bytes);
  if (spec.dtype === info.device_dtype) return stored;
  if (info.kind === "bool") return Uint8Array.from(stored, (v) => (v !== 0 ? 1 : 0));
  if (spec.dtype === "int64") return BigInt64Array.from(/** @type {Int32Array} */ (stored), (v) => BigInt(v));
  if (spec.dtype === "float16") return Uint16Array.from(stored, floatToHalfBits);
  // float32 -> Float64Array; int32 -> Int8Array/Int16Array, uint32 -> Uint8Array/Uint16Array
  // keep the low bits, like numpy's astype.
  const modelClass = TYPED_ARRAY_OF_DTYPE[/** @type {"float32"} */ (spec.dtype)];
  return modelClass.from(/** @type {ArrayLike<number>} */ (stored));
}

/**
 * A problem with the inputs given to a run: a missing input, a wrong dtype, a wrong rank,
 * or a dimension that the host's checks reject (a fixed size mismatch, a bound exceeded).
 */
export class InputShapeError extends Error {
  /**
   * @param {string} message complete, readable on its own
   * @param {{code?: number, value?: number, expected?: number}} [details]
   *   for a host check: the error code and the two numbers of its error info
   */
  constructor(message, details = {}) {
    super(message);
    this.name = "InputShapeError";
    this.code = details.code;
    this.value = details.value;
    this.expected = details.expected;
  }
}

/**
 * @typedef {Object} DispatchCommand
 * @property {1} opcode           OPCODE_DISPATCH
 * @property {number} callSite    index into manifest.call_sites
 * @property {[number, number, number]} workgroups  the grid (x, y, z)
 */

/**
 * The last record of a command list that stops for a value computed on the GPU: read the
 * i32 at `byteOffset` of storage `storage`, write it with writeReadValue(slot, value), and
 * call resume().
 * @typedef {Object} ReadCommand
 * @property {2} opcode           OPCODE_READ
 * @property {number} storage     index into manifest.storages
 * @property {number} byteOffset  where the i32 is in that storage (a multiple of 4)
 * @property {number} slot        index into the host's read values
 */

/**
 * The last record of a command list after which the host writes new params for the same
 * call sites (a loop's next iteration): submit the list and call resume(), reading nothing.
 * @typedef {Object} ResumeCommand
 * @property {3} opcode           OPCODE_RESUME
 */

/** @typedef {DispatchCommand | ReadCommand | ResumeCommand} Command */

/**
 * @typedef {Object} InputTensor
 * @property {Float32Array|Int32Array|Uint32Array} data
 * @property {number[]} shape
 */

/** The instantiated host module of one bundle, with readers for everything it exports. */
export class Host {
  /**
   * Compile and instantiate host.wasm.
   * @param {BufferSource} wasmBytes the bytes of host.wasm
   * @param {any} manifest the parsed manifest.json of the same bundle
   * @returns {Promise<Host>}
   */
  static async instantiate(wasmBytes, manifest) {
    const { instance } = await WebAssembly.instantiate(wasmBytes, {});
    return new Host(instance, manifest);
  }

  /**
   * @param {WebAssembly.Instance} instance
   * @param {any} manifest
   */
  constructor(instance, manifest) {
    this.exports = /** @type {any} */ (instance.exports);
    this.manifest = manifest;
    this.maxRank = manifest.max_rank;
    /** How many values a run may read back (0 for bundles without reads, or from before them). */
    this.readSlots = /** @type {number} */ (manifest.read_slots ?? 0);
    if (this.readSlots > 0) {
      const missing = ["read_values", "resume"].filter((name) => typeof this.exports[name] !== "function");
      if (missing.length > 0) {
        throw new Error(
          `the bundle's manifest has ${this.readSlots} read slot(s) but its host.wasm does not export ${missing.join(" or ")}`,
        );
      }
    }
  }

  /** A fresh view of the memory (a new view after the module grows its memory). */
  get view() {
    return new DataView(this.exports.memory.buffer);
  }

  /**
   * Read `count` little-endian i64 values at `address`, as numbers.
   * @param {number} address
   * @param {number} count
   * @returns {number[]}
   */
  readInt64s(address, count) {
    const view = this.view;
    return Array.from({ length: count }, (_, i) => Number(view.getBigInt64(address + 8 * i, true)));
  }

  /**
   * Write little-endian i64 values at `address`.
   * @param {number} address
   * @param {number[]} values
   */
  writeInt64s(address, values) {
    const view = this.view;
    values.forEach((value, i) => view.setBigInt64(address + 8 * i, BigInt(value), true));
  }

  /**
   * The bound of each symbolic var (manifest order) currently in the host; null for none.
   * @returns {(number|null)[]}
   */
  varBounds() {
    const count = this.manifest.symbolic_vars.length;
    return this.readInt64s(this.exports.var_bounds(), count).map((b) => (b < 0 ? null : b));
  }

  /**
   * Tighten the bounds of some symbolic vars. A bound may not exceed the build's bound.
   * @param {Record<string, number>} bounds var name -> new bound
   */
  setBounds(bounds) {
    const vars = this.manifest.symbolic_vars;
    const current = this.varBounds();
    for (const [name, bound] of Object.entries(bounds)) {
      const index = vars.findIndex((/** @type {{name: string}} */ v) => v.name === name);
      if (index < 0) {
        const known = vars.map((/** @type {{name: string}} */ v) => v.name).join(", ") || "none";
        throw new Error(`bounds: unknown symbolic var '${name}' (the model's vars: ${known})`);
      }
      if (!Number.isInteger(bound) || bound < 0) {
        throw new Error(`bounds: the bound of '${name}' must be a non-negative integer, got ${bound}`);
      }
      const buildBound = current[index];
      if (buildBound !== null && bound > buildBound) {
        throw new Error(
          `bounds: the bound of '${name}' is ${bound}, above the bound ${buildBound} the bundle was built with`,
        );
      }
      this.writeInt64s(this.exports.var_bounds() + 8 * index, [bound]);
    }
  }

  /**
   * Write every input's `[ndim, dims...]` into the host's input_shapes area.
   * @param {number[][]} shapes one shape per manifest input, in manifest order
   */
  writeInputShapes(shapes) {
    const base = this.exports.input_shapes();
    const stride = 8 * (1 + this.maxRank);
    shapes.forEach((shape, k) => {
      if (shape.length > this.maxRank) {
        const name = this.manifest.inputs[k].name;
        throw new InputShapeError(`input '${name}': rank ${shape.length} is above the bundle's max rank ${this.maxRank}`);
      }
      this.writeInt64s(base + k * stride, [shape.length, ...shape]);
    });
  }

  /**
   * Run the host's checks and shape arithmetic on the input shapes written last.
   * @returns {number} 0, or an error code (manifest.errors[].code)
   */
  run() {
    return this.exports.run();
  }

  /**
   * Write the input shapes and run; throw an InputShapeError when the host rejects them.
   * @param {number[][]} shapes one shape per manifest input, in manifest order
   */
  runOrThrow(shapes) {
    this.writeInputShapes(shapes);
    const code = this.run();
    if (code !== 0) throw this.errorFor(code);
  }

  /**
   * Write a value read back from the GPU into read slot `slot` (as an i64), before resume().
   * @param {number} slot
   * @param {number} value an i32
   */
  writeReadValue(slot, value) {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.readSlots) {
      throw new Error(`read slot ${slot} does not exist: the bundle has ${this.readSlots} read slot(s)`);
    }
    this.writeInt64s(this.exports.read_values() + 8 * slot, [value]);
  }

  /**
   * The values in the read slots, as last written by writeReadValue.
   * @returns {number[]}
   */
  readValues() {
    return this.readSlots === 0 ? [] : this.readInt64s(this.exports.read_values(), this.readSlots);
  }

  /**
   * Continue after a read: the host writes the next command list, the storage sizes and
   * (after a run's last read) the output shapes.
   * @returns {number} 0, or an error code (manifest.errors[].code)
   */
  resume() {
    if (typeof this.exports.resume !== "function") {
      throw new Error("the bundle's host.wasm has no resume export, so its command lists cannot contain reads");
    }
    return this.exports.resume();
  }

  /** Resume; throw an InputShapeError with the manifest's message when the host returns an error code. */
  resumeOrThrow() {
    const code = this.resume();
    if (code !== 0) throw this.errorFor(code);
  }

  /**
   * The error info `[code, value, expected]` of the last failed run or resume.
   * @returns {{code: number, value: number, expected: number}}
   */
  errorInfo() {
    const [code, value, expected] = this.readInt64s(this.exports.error_info(), 3);
    return { code, value, expected };
  }

  /**
   * The error for a code returned by run(): its manifest template filled with the error info.
   * @param {number} code
   * @returns {InputShapeError}
   */
  errorFor(code) {
    const { value, expected } = this.errorInfo();
    const template = this.manifest.errors.find((/** @type {any} */ e) => e.code === code);
    const message = template
      ? template.message.replaceAll("{value}", String(value)).replaceAll("{expected}", String(expected))
      : `the inputs were rejected by host.wasm with unknown error code ${code} (value ${value}, expected ${expected})`;
    return new InputShapeError(message, { code, value, expected });
  }

  /**
   * The value of each symbolic var (manifest order) as bound by the last run.
   * @returns {number[]}
   */
  varValues() {
    return this.readInt64s(this.exports.var_values(), this.manifest.symbolic_vars.length);
  }

  /**
   * Bytes each storage needs for the last run (or for the last sizesAtBounds call).
   * @returns {number[]}
   */
  storageSizes() {
    return this.readInt64s(this.exports.storage_sizes(), this.manifest.storages.length);
  }

  /**
   * Bytes each storage needs with every var at its bound; null when some storage size
   * uses a var without a bound.
   * @returns {number[]|null}
   */
  sizesAtBounds() {
    return this.exports.sizes_at_bounds() === 0 ? this.storageSizes() : null;
  }

  /**
   * The shape of each output (manifest order), computed by the last run.
   * @returns {number[][]}
   */
  outputShapes() {
    const base = this.exports.output_shapes();
    const stride = 8 * (1 + this.maxRank);
    return this.manifest.outputs.map((/** @type {any} */ _, /** @type {number} */ k) => {
      const [ndim] = this.readInt64s(base + k * stride, 1);
      return this.readInt64s(base + k * stride + 8, ndim);
    });
  }

  /**
   * The address of sequence table `sequence` (docs/bundle-format.md "Sequences") and a
   * table's capacity.
   * @param {number} sequence
   * @returns {{address: number, capacity: number}}
   */
  sequenceTable(sequence) {
    const capacity = this.manifest.sequence_capacity;
    if (typeof this.exports.sequences !== "function") {
      throw new Error("the bundle's manifest has sequences but its host.wasm does not export sequences: the bundle is inconsistent");
    }
    const tableBytes = Math.ceil((8 + capacity * (1 + this.maxRank) * 8) / 16) * 16;
    return { address: this.exports.sequences() + sequence * tableBytes, capacity };
  }

  /**
   * Write a sequence input's table: its length and its elements' shapes (null: an optional
   * sequence that is none, length -1).
   * @param {string} name @param {number} sequence @param {number[][]|null} shapes
   */
  writeSequence(name, sequence, shapes) {
    const { address, capacity } = this.sequenceTable(sequence);
    if (shapes === null) { // an optional sequence that is none
      this.writeInt64s(address, [-1]);
      return;
    }
    if (shapes.length > capacity) {
      throw new InputShapeError(`input '${name}' has ${shapes.length} elements, above the ${capacity} a sequence can hold`);
    }
    this.writeInt64s(address, [shapes.length]);
    const stride = 8 * (1 + this.maxRank);
    shapes.forEach((shape, k) => this.writeInt64s(address + 8 + k * stride, [shape.length, ...shape]));
  }

  /**
   * The shapes of a sequence's elements, as the last run left its table (null: an optional
   * sequence that is none).
   * @param {number} sequence @param {boolean} optional @returns {number[][]|null}
   */
  readSequence(sequence, optional) {
    const { address, capacity } = this.sequenceTable(sequence);
    const [length] = this.readInt64s(address, 1);
    if (optional && length === -1) return null;
    if (!(length >= 0 && length <= capacity)) {
      throw new Error(`the bundle's host module wrote a sequence of ${length} elements: the bundle is damaged`);
    }
    const stride = 8 * (1 + this.maxRank);
    return Array.from({ length }, (_, k) => {
      const [ndim] = this.readInt64s(address + 8 + k * stride, 1);
      const shape = this.readInt64s(address + 16 + k * stride, Math.min(Math.max(ndim, 0), this.maxRank));
      if (ndim < 0 || ndim > this.maxRank || shape.some((d) => d < 0)) {
        throw new Error("the bundle's host module wrote a malformed sequence table: the bundle is damaged");
      }
      return shape;
    });
  }

  /**
   * A copy of the params block written by the last run (manifest.params_bytes bytes).
   * @returns {Uint8Array}
   */
  params() {
    const address = this.exports.params();
    return new Uint8Array(this.exports.memory.buffer, address, this.manifest.params_bytes).slice();
  }

  /**
   * The command list written by the last run or resume, in execution order: dispatches,
   * possibly followed by one read or resume record (decodeCommands of the words at the
   * module's `commands` address). Throws on an unknown opcode or a malformed record.
   * @returns {Command[]}
   */
  commands() {
    const address = this.exports.commands();
    const view = this.view;
    if (!(address >= 0 && address + 4 <= view.byteLength)) {
      throw new Error(`the bundle's host module points outside its memory (bytes ${address}..${address + 4}): the bundle is damaged`);
    }
    const count = view.getInt32(address, true);
    const callSites = this.manifest.call_sites.length;
    checkCommandCount(count, callSites);
    if (address + 4 + 20 * count > view.byteLength) throw new Error(malformedCount(count, callSites));
    const words = Array.from({ length: 1 + 5 * count }, (_, i) => view.getInt32(address + 4 * i, true));
    return decodeCommands(words, callSites, this.manifest.storages.length, this.readSlots);
  }
}

/** @param {number} count @param {number} callSites */
const malformedCount = (count, callSites) => `the bundle's command list is malformed: it has ${count} records for ${callSites} call sites`;

/**
 * Refuse a command list longer than every call site and a final read or resume.
 * @param {number} count @param {number} callSites
 */
export function checkCommandCount(count, callSites) {
  if (!(count >= 0 && count <= callSites + 1)) throw new Error(malformedCount(count, callSites));
}

/**
 * A command list from its i32 words (the record count, then five words per record: opcode
 * and four fields), for a bundle of `callSites` call sites, `storages` storages and
 * `readSlots` read slots: dispatches, possibly followed by one read or resume record (only
 * ever the last). A malformed list is an Error saying what is wrong (the messages of
 * relaxweb/runtime/host.py's decode_commands; the conformance corpus's command_lists pins them).
 * @param {ArrayLike<number>} words @param {number} callSites @param {number} storages @param {number} readSlots
 * @returns {Command[]}
 */
export function decodeCommands(words, callSites, storages, readSlots) {
  const count = words.length > 0 ? words[0] : 0;
  checkCommandCount(count, callSites);
  if (words.length < 1 + 5 * count) {
    throw new Error(`the bundle's command list is malformed: it has ${count} records but only ${Math.floor((words.length - 1) / 5)} were written`);
  }
  return Array.from({ length: count }, (_, i) => {
    const field = (/** @type {number} */ j) => words[1 + 5 * i + j];
    const opcode = field(0);
    if (opcode === OPCODE_DISPATCH) {
      const [callSite, x, y, z] = [field(1), field(2), field(3), field(4)];
      if (!(callSite >= 0 && callSite < callSites)) {
        throw new Error(
          `the bundle's command list is malformed: record ${i} dispatches call site ${callSite} over (${x}, ${y}, ${z}) workgroups; the bundle has ${callSites} call sites`,
        );
      }
      return /** @type {Command} */ ({ opcode, callSite, workgroups: [x, y, z] });
    }
    if (opcode === OPCODE_READ) {
      return checkedRead({ opcode, storage: field(1), byteOffset: field(2), slot: field(3) }, i, count, storages, readSlots);
    }
    if (opcode === OPCODE_RESUME) {
      if (i !== count - 1) {
        throw new Error(`the bundle's command list is malformed: its resume record is record ${i} of ${count}; a resume must be the last record`);
      }
      return /** @type {Command} */ ({ opcode });
    }
    throw new Error(`the bundle's command list has opcode ${opcode}, unknown to this runtime`);
  });
}

/**
 * `read` if it is well formed, else an Error saying what is wrong.
 * @param {ReadCommand} read @param {number} index its position in the list @param {number} count the list's length
 * @param {number} storages @param {number} readSlots
 * @returns {ReadCommand}
 */
function checkedRead(read, index, count, storages, readSlots) {
  let problem = null;
  if (index !== count - 1) problem = `is record ${index} of ${count}; a read must be the last record`;
  else if (read.slot < 0 || read.slot >= readSlots) problem = `uses slot ${read.slot}; the manifest has ${readSlots} read slot(s)`;
  else if (read.storage < 0 || read.storage >= storages) problem = `reads storage ${read.storage}; the bundle has ${storages}`;
  else if (read.byteOffset < 0 || read.byteOffset % 4 !== 0) problem = `reads at byte offset ${read.byteOffset}, not a multiple of 4`;
  if (problem) throw new Error(`the bundle's command list is malformed: its read record ${problem}`);
  return read;
}

/**
 * Check the inputs of a run against the manifest (names, dtypes, ranks, data lengths) and
 * return their shapes in manifest order. Throws an InputShapeError naming the input.
 * @param {any} manifest
 * @param {Record<string, InputTensor>} inputs
 * @returns {number[][]}
 */
export function checkInputs(manifest, inputs) {
  const names = manifest.inputs.map((/** @type {any} */ i) => i.name);
  for (const name of Object.keys(inputs ?? {})) {
    if (!names.includes(name)) {
      throw new InputShapeError(`unknown input '${name}' (the model's inputs: ${names.join(", ")})`);
    }
  }
  return manifest.inputs.map((/** @type {any} */ spec) =>
    isSequence(spec) ? (checkSequence(spec, inputs?.[spec.name]), []) : checkInput(spec, inputs?.[spec.name]));
}

/** Whether a manifest input or output is a sequence (or an optional one). @param {{kind?: string}} spec */
export function isSequence(spec) {
  return spec.kind === "sequence" || spec.kind === "optional_sequence";
}

/**
 * A sequence input: an array of tensors of its dtype (and of its elements' rank, when known);
 * null for an optional sequence that is none.
 * @param {{name: string, dtype: string, element_ndim: number, kind: string}} spec
 * @param {any} elements
 * @returns {number[][]|null} the elements' shapes
 */
export function checkSequence(spec, elements) {
  if (elements === null && spec.kind === "optional_sequence") return null;
  if (!Array.isArray(elements)) {
    throw new InputShapeError(`input '${spec.name}' is a sequence: it must be an array of {data, shape} tensors`);
  }
  return elements.map((element, k) => {
    if (element instanceof GpuTensor) throw new InputShapeError(`input '${spec.name}' is a sequence: its elements must be {data, shape} tensors, not GPU tensors`);
    const rank = spec.element_ndim >= 0 ? spec.element_ndim : element?.shape?.length ?? 0;
    const shape = Array.from({ length: rank }, () => "?");
    return checkInput({ name: `${spec.name}[${k}]`, dtype: spec.dtype, shape }, element);
  });
}

/**
 * @param {{name: string, dtype: string, shape: (number|string)[]}} spec
 * @param {InputTensor|undefined} tensor
 * @returns {number[]}
 */
function checkInput(spec, tensor) {
  const name = spec.name;
  if (tensor === undefined || tensor === null) {
    throw new InputShapeError(`input '${name}' is missing`);
  }
  if (tensor instanceof GpuTensor) return checkGpuTensor(spec, tensor);
  const { data, shape } = tensor;
  const arrayClass = TYPED_ARRAY_OF_DTYPE[/** @type {keyof TYPED_ARRAY_OF_DTYPE} */ (spec.dtype)];
  if (!arrayClass) {
    throw new InputShapeError(`input '${name}': dtype ${spec.dtype} is not supported by this runtime`);
  }
  const accepted = [arrayClass, ...(ALSO_ACCEPTED[spec.dtype] ?? [])];
  if (!accepted.some((c) => data instanceof c)) {
    const given = data?.constructor?.name ?? typeof data;
    const names = accepted.map((c) => c.name).join(" or ");
    throw new InputShapeError(`input '${name}': expected ${spec.dtype} data (${names}), got ${given}`);
  }
  if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) {
    const bigints = Array.isArray(shape) && shape.some((d) => typeof d === "bigint");
    throw new InputShapeError(`input '${name}': shape must be an array of non-negative integers` +
      `${bigints ? " (numbers, not BigInts)" : ""}, got ${shownValue(shape)}`);
  }
  if (shape.length !== spec.shape.length) {
    throw new InputShapeError(
      `input '${name}': expected ${spec.shape.length} dimensions [${spec.shape.join(", ")}], got ${shape.length} [${shape.join(", ")}]`,
    );
  }
  const elements = shape.reduce((a, b) => a * b, 1);
  if (data.length !== elements) {
    throw new InputShapeError(`input '${name}': shape [${shape.join(", ")}] has ${elements} elements, but the data has ${data.length}`);
  }
  return shape;
}

/**
 * A GpuTensor given as an input: its dtype and rank must be the input's, like an array's
 * (its dimensions go to the host module's checks); returns its shape.
 * @param {{name: string, dtype: string, shape: (number|string)[]}} spec
 * @param {GpuTensor} tensor
 * @returns {number[]}
 */
function checkGpuTensor(spec, tensor) {
  if (tensor.dtype !== spec.dtype) {
    throw new InputShapeError(`input '${spec.name}': expected ${spec.dtype} data, got GPU tensor '${tensor.name}' of dtype ${tensor.dtype}`);
  }
  if (tensor.shape.length !== spec.shape.length) {
    throw new InputShapeError(
      `input '${spec.name}': expected ${spec.shape.length} dimensions [${spec.shape.join(", ")}], got ${tensor.shape.length} [${tensor.shape.join(", ")}]`,
    );
  }
  return [...tensor.shape];
}

/**
 * A value as a message shows it, whatever it is (JSON.stringify throws on a BigInt and on a
 * cycle): JSON with BigInts as `2n`, else its string; at most 100 characters.
 * @param {any} value @returns {string}
 */
function shownValue(value) {
  let text;
  try {
    text = JSON.stringify(value, (_, item) => (typeof item === "bigint" ? `${item}n` : item))?.replace(/"(-?\d+n)"/g, "$1");
  } catch {
    text = undefined;
  }
  text = text ?? String(value);
  return text.length > 100 ? `${text.slice(0, 97)}...` : text;
}
