// Inputs and outputs as a device holds them, for both backends (relaxweb.js on WebGPU,
// wasm_backend.js on WebAssembly): the checks of a run's inputs and their conversion to the
// manifest's device dtypes (on the wasm backend, wasmManifest's: int64 stays int64), and
// sequence outputs split back into their elements.

import { TYPED_ARRAY_OF_DTYPE, checkInputs, checkSequence, dtypeInfo, isSequence, toDeviceData } from "./host.js";
import { GpuTensor } from "./gpu_tensor.js";
import { shortened, shown } from "./run_status.js";

/**
 * An input ready for a device: its values in the device dtype (a copy the caller cannot
 * change any more), or the GpuTensor to copy on the GPU; `shape` as checked.
 * @typedef {{data?: Int32Array|Uint32Array|Float32Array|BigInt64Array, gpuTensor?: GpuTensor, shape: number[]}} DeviceInput
 */

/**
 * Check a run's inputs against the manifest (InputShapeError naming the input otherwise) and
 * convert them to the device dtypes: int64 -> int32 (range-checked), bool -> uint32, ...
 * Checked and copied now: a run may wait for earlier ones, and what it uses then must be
 * what was checked, whatever the caller does to its arrays meanwhile.
 * @param {any} manifest
 * @param {Record<string, any>} inputs name -> {data, shape}, a GpuTensor, or a sequence's elements
 * @param {InputCopies|null} [copies] where the copies come from (default: new arrays)
 * @returns {{shapes: number[][], sequences: Record<number, number[][]|null>, deviceInputs: Record<string, DeviceInput>}}
 *   the shapes (sequences: []), the element shapes of sequence inputs by input index (null:
 *   none), and the inputs by name
 */
export function prepareInputs(manifest, inputs, copies = null) {
  const shapes = checkInputs(manifest, inputs).map((shape) => [...shape]);
  /** @type {Record<number, number[][]|null>} */
  const sequences = {};
  const deviceInputs = Object.fromEntries(manifest.inputs.map((/** @type {any} */ spec, /** @type {number} */ k) => {
    if (isSequence(spec)) {
      const elements = /** @type {any[]|null} */ (inputs[spec.name]);
      sequences[k] = checkSequence(spec, elements);
      return [spec.name, { data: sequenceData(spec, dtypeInfo(manifest, spec), elements ?? []), shape: [] }];
    }
    const tensor = inputs[spec.name];
    if (tensor instanceof GpuTensor) return [spec.name, { gpuTensor: tensor, shape: shapes[k] }]; // copied on the GPU
    const given = tensor.data;
    const converted = toDeviceData(spec, dtypeInfo(manifest, spec), given);
    const data = converted !== given ? converted : copies ? copies.copy(spec.name, given) : given.slice();
    return [spec.name, { data, shape: shapes[k] }];
  }));
  return { shapes, sequences, deviceInputs };
}

/**
 * The arrays of a model's input copies, kept for its later runs: copying a decoder step's past
 * keys and values (24 arrays, 9.4 MB at GPT-2's 128 positions) into new arrays took 3.9 ms in
 * Node 20, into the last run's 1.3 ms (fresh memory is zeroed and faulted in page by page).
 * An array is taken by one run (prepareInputs) and given back once the run has written its
 * inputs to the device (release): a run prepared while another holds it gets a new one.
 */
export class InputCopies {
  constructor() {
    /** @type {Map<string, any>} the arrays free to take, by input name */
    this.spare = new Map();
  }

  /**
   * A copy of `data` for input `name`: into the spare array of that input where it is of the
   * same type and length, else a new one.
   * @template {Int32Array|Uint32Array|Float32Array|BigInt64Array|Uint8Array|Uint16Array} T
   * @param {string} name @param {T} data @returns {T}
   */
  copy(name, data) {
    const spare = this.spare.get(name);
    if (!spare || spare.constructor !== data.constructor || spare.length !== data.length) return /** @type {T} */ (data.slice());
    this.spare.delete(name);
    spare.set(data);
    return spare;
  }

  /**
   * A run's input arrays free again (its inputs are on the device): the next run's copies go there.
   * @param {Record<string, DeviceInput>} deviceInputs
   */
  release(deviceInputs) {
    for (const [name, input] of Object.entries(deviceInputs)) if (input.data) this.spare.set(name, input.data);
  }
}

/**
 * The manifest as the wasm backend holds tensors: a shallow copy whose `dtypes` entries say
 * kernels.wasm's form (`device_dtype`, `device_bytes` replaced by the entry's `wasm_dtype`,
 * `wasm_bytes`: int64 is int64 there, every other dtype as on the GPU). Every conversion by the
 * dtypes table (prepareInputs, fromDeviceData, byte counts) then converts for that memory: the
 * wasm backend uses this copy where WebGPU uses the manifest. The weights' shard bytes are
 * already this form (WebGPU narrows an int64 weight: webgpuWeightBytes). The twin of runtime/tensors.py's wasm_manifest.
 * @param {any} manifest @returns {any}
 */
export function wasmManifest(manifest) {
  const dtypes = Object.fromEntries(Object.entries(manifest.dtypes).map(([name, /** @type {any} */ entry]) =>
    [name, { ...entry, device_dtype: entry.wasm_dtype, device_bytes: entry.wasm_bytes }]));
  return { ...manifest, dtypes };
}

/**
 * A weight's bytes as the GPU holds it, from its shard bytes (its wasm form): the same bytes, or
 * for an int64 weight (little-endian int64 in the shard) each value narrowed to int32. A value
 * outside int32 is an error naming the weight: a bundle built with one says so in its manifest's
 * `webgpu.unavailable`, and WebGPU refuses it before any shard is read, so only a damaged bundle
 * gets here. The twin of runtime/tensors.py's webgpu_weight_bytes.
 * @param {any} weight the manifest's entry @param {Uint8Array} bytes
 * @param {import("./host.js").DtypeInfo} info the weight's dtype entry (the manifest's, not wasmManifest's)
 * @returns {Uint8Array}
 */
export function webgpuWeightBytes(weight, bytes, info) {
  if (info.wasm_dtype === info.device_dtype) return bytes;
  if (info.device_dtype !== "int32" || info.wasm_dtype !== "int64") {
    throw new Error(`a ${info.wasm_dtype} weight cannot be held as ${info.device_dtype} on the GPU`); // the manifest check refuses it first
  }
  const wide = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const narrow = new Uint8Array(bytes.byteLength / 2);
  const out = new DataView(narrow.buffer);
  for (let i = 0; i < bytes.byteLength / 8; i++) {
    const value = wide.getBigInt64(8 * i, true);
    if (value < -2147483648n || value > 2147483647n) {
      throw new Error(`weight '${shortened(shown(weight.name))}' (${weight.dtype}) holds ${value}, outside the int32 range the GPU ` +
        `holds ${weight.dtype} tensors in, and the manifest does not say that WebGPU cannot run it (webgpu.unavailable): the bundle is damaged`);
    }
    out.setInt32(4 * i, Number(value), true);
  }
  return narrow;
}

/**
 * The indices of the outputs a run's `keepOnGpu` names (true: every output but sequences), for
 * either backend; an Error for a name that is not an output's.
 * @param {any} manifest @param {boolean|string[]|undefined} keepOnGpu
 * @returns {Set<number>}
 */
export function keptOutputIndices(manifest, keepOnGpu) {
  const outputs = manifest.outputs;
  if (keepOnGpu === true) return new Set(outputs.flatMap((/** @type {any} */ o, /** @type {number} */ k) => (isSequence(o) ? [] : [k])));
  if (!keepOnGpu) return new Set();
  if (!Array.isArray(keepOnGpu)) throw new Error(`keepOnGpu must be true or an array of output names, got ${String(keepOnGpu).slice(0, 40)}`);
  const names = outputs.map((/** @type {any} */ o) => o.name);
  const unknown = keepOnGpu.filter((name) => !names.includes(name));
  if (unknown.length > 0) {
    throw new Error(`keepOnGpu names unknown output ${unknown.map((n) => `'${n}'`).join(", ")}; the model's outputs are ${names.map((n) => `'${n}'`).join(", ")}`);
  }
  const sequences = keepOnGpu.filter((name) => isSequence(outputs[names.indexOf(name)]));
  if (sequences.length > 0) throw new Error(`output ${sequences.map((n) => `'${n}'`).join(", ")} is a sequence: only tensors can be kept on the GPU`);
  return new Set(keepOnGpu.map((name) => names.indexOf(name)));
}

/**
 * A sequence input's elements as the device holds them: their values one after another.
 * @param {any} spec @param {any} info @param {{data: any, shape: number[]}[]} elements
 * @returns {Int32Array|Uint32Array|Float32Array|BigInt64Array}
 */
function sequenceData(spec, info, elements) {
  const empty = toDeviceData(spec, info, new TYPED_ARRAY_OF_DTYPE[/** @type {keyof TYPED_ARRAY_OF_DTYPE} */ (spec.dtype)](0));
  const parts = elements.map((element) => toDeviceData(spec, info, element.data));
  const data = new (/** @type {any} */ (empty.constructor))(parts.reduce((total, part) => total + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    data.set(part, offset);
    offset += part.length;
  }
  return data;
}

/**
 * A sequence output's elements, from the flat array of their values.
 * @param {any} data @param {number[][]} shapes @returns {{data: any, shape: number[]}[]}
 */
export function splitElements(data, shapes) {
  let offset = 0;
  return shapes.map((shape) => {
    const count = shape.reduce((a, b) => a * b, 1);
    offset += count;
    return { data: data.slice(offset - count, offset), shape };
  });
}
