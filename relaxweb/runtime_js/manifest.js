// validateManifest: check a bundle's manifest.json before anything in it is used.
//
// The twin of relaxweb/runtime/manifest.py (the Python runtime): the same schema file
// (manifest-schema.json), the same checks in the same order, the same messages, so a tampered
// bundle is refused with one line that reads alike in Python and in the browser.

import SCHEMA from "./manifest-schema.json" with { type: "json" };

const SHOWN_CHARACTERS = 80;
/** bytes per element of every dtype the schema allows (`dtypes` entries must agree) */
/** @type {Record<string, number>} */
const DTYPE_BYTES = {
  float16: 2, float32: 4, float64: 8, int8: 1, int16: 2, int32: 4, int64: 8, uint8: 1, uint16: 2, uint32: 4, bool: 1,
};
const ARTICLED = { number: "an integer", string: "a string", array: "an array", object: "an object" };

/**
 * Throw an Error with the first problem of `manifest` ("manifest.json: path: what is wrong").
 * @param {any} manifest
 */
export function validateManifest(manifest) {
  const problem = manifestProblem(manifest);
  if (problem !== null) throw new Error(`manifest.json: ${problem}`);
}

/**
 * The first problem of `manifest` as "path: what is wrong", or null.
 * @param {any} manifest
 * @returns {string|null}
 */
export function manifestProblem(manifest) {
  return check(manifest, SCHEMA.manifest, "", manifest) ?? factProblem(manifest);
}

/** @param {any} value */
function describeValue(value) {
  if (typeof value === "string") {
    const characters = [...value]; // code points, as Python counts
    const text = JSON.stringify(characters.slice(0, SHOWN_CHARACTERS).join(""));
    return characters.length > SHOWN_CHARACTERS ? `${text}...` : text;
  }
  return typeName(value);
}

/** @param {any} value */
function typeName(value) {
  if (value === null) return "null";
  if (typeof value === "boolean") return "a boolean";
  if (typeof value === "number") return "a number";
  if (typeof value === "string") return "a string";
  if (Array.isArray(value)) return "an array";
  return "an object";
}

/** @param {any} value */
const jsonType = (value) => typeName(value).split(" ").at(-1);
/** @param {string} kind */
const jsonTypeOfSchema = (kind) => ({ integer: "number", index: "number", key: "string", enum: "string" })[kind] ?? kind;
/** @param {any} value */
const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
/** @param {string} path @param {string} key */
const join = (path, key) => (path ? `${path}.${key}` : key);
/** @param {string} pattern @param {string} text */
const fullMatch = (pattern, text) => new RegExp(pattern, "u").test(text);
/** @param {string[]} values */
const quoted = (values) => values.map((v) => JSON.stringify(v)).join(", ");

/**
 * Why `value` at `path` does not fit `schema`, or null.
 * @param {any} value @param {any} schema @param {string} path @param {any} manifest
 * @returns {string|null}
 */
function check(value, schema, path, manifest) {
  if ("ref" in schema) {
    const { ref, ...rest } = schema;
    return check(value, { ...SCHEMA.definitions[ref], ...rest }, path, manifest);
  }
  if (value === null && schema.nullable) return null;
  const where = path || "the manifest";
  switch (schema.type) {
    case "object": {
      if (!isObject(value)) return `${where}: expected an object, got ${typeName(value)}`;
      for (const [key, inner] of Object.entries(schema.required ?? {})) {
        if (!Object.hasOwn(value, key)) return `${where}: has no '${key}'`;
        const problem = check(value[key], inner, join(path, key), manifest);
        if (problem) return problem;
      }
      for (const [key, inner] of Object.entries(schema.optional ?? {})) {
        if (!Object.hasOwn(value, key)) continue;
        const problem = check(value[key], inner, join(path, key), manifest);
        if (problem) return problem;
      }
      return null;
    }
    case "array": {
      if (!Array.isArray(value)) return `${where}: expected an array, got ${typeName(value)}`;
      if ("length" in schema && value.length !== schema.length) {
        return `${where}: has ${value.length} items, expected ${schema.length}`;
      }
      if ("max_items" in schema && value.length > schema.max_items) {
        return `${where}: has ${value.length} items, at most ${schema.max_items} allowed`;
      }
      for (let index = 0; index < value.length; index++) {
        const problem = check(value[index], schema.items, `${path}[${index}]`, manifest);
        if (problem) return problem;
      }
      return null;
    }
    case "map": {
      if (!isObject(value)) return `${where}: expected an object, got ${typeName(value)}`;
      const entries = Object.entries(value);
      if (entries.length > schema.max_items) {
        return `${where}: has ${entries.length} entries, at most ${schema.max_items} allowed`;
      }
      for (const [key, item] of entries) {
        if (!fullMatch(schema.keys_pattern, key)) {
          return `${where}: the key ${describeValue(key)} is not allowed (it must match ${schema.keys_pattern})`;
        }
        const problem = check(item, schema.values, `${path}[${JSON.stringify(key)}]`, manifest);
        if (problem) return problem;
      }
      return null;
    }
    case "integer":
    case "index": {
      if (typeof value !== "number" || !Number.isSafeInteger(value)) {
        return `${where}: expected an integer, got ${typeName(value)}`;
      }
      if (schema.type === "index") {
        const target = isObject(manifest) ? manifest[schema.of] : undefined;
        const count = Array.isArray(target) ? target.length : 0;
        if (!(value >= 0 && value < count)) return `${where}: ${value} is not an index of ${schema.of} (it has ${count})`;
        return null;
      }
      if (!(value >= schema.min && value <= schema.max)) return `${where}: ${value} is outside ${schema.min}..${schema.max}`;
      return null;
    }
    case "number": {
      if (typeof value !== "number" || !Number.isFinite(value)) return `${where}: expected a number, got ${typeName(value)}`;
      if (!(value >= schema.min && value <= schema.max)) return `${where}: a number outside ${schema.min}..${schema.max}`;
      return null;
    }
    case "string":
    case "key":
    case "enum": {
      if (typeof value !== "string") {
        const expected = schema.type === "enum" ? `one of ${quoted(schema.values)}` : "a string";
        return `${where}: expected ${expected}, got ${typeName(value)}`;
      }
      if (schema.type === "enum" && !schema.values.includes(value)) {
        return `${where}: ${describeValue(value)} is not one of ${quoted(schema.values)}`;
      }
      if (schema.type === "key") {
        const table = isObject(manifest) ? manifest[schema.of] : undefined;
        if (!isObject(table) || !Object.hasOwn(table, value)) return `${where}: ${describeValue(value)} is not in ${schema.of}`;
      }
      const length = [...value].length; // code points, as Python counts
      if ("max_length" in schema && length > schema.max_length) {
        return `${where}: a string of ${length} characters, at most ${schema.max_length} allowed`;
      }
      if ("pattern" in schema && !fullMatch(schema.pattern, value)) {
        return `${where}: ${describeValue(value)} is not allowed (it must match ${schema.pattern})`;
      }
      return null;
    }
    case "one_key": {
      const keys = Object.keys(schema.keys);
      const given = isObject(value) ? Object.keys(value) : [];
      if (given.length !== 1 || !keys.includes(given[0])) {
        return `${where}: expected an object with exactly one of ${keys.map((k) => `'${k}'`).join(", ")}`;
      }
      return check(value[given[0]], schema.keys[given[0]], join(path, given[0]), manifest);
    }
    case "union": {
      for (const option of schema.options) {
        if (jsonType(value) === jsonTypeOfSchema(option.type)) return check(value, option, path, manifest);
      }
      const expected = schema.options.map((/** @type {any} */ o) => ARTICLED[jsonTypeOfSchema(o.type)]).join(" or ");
      return `${where}: expected ${expected}, got ${typeName(value)}`;
    }
    case "expression":
      return expressionProblem(value, schema, where);
    default:
      throw new Error(`manifest schema: unknown type ${schema.type}`);
  }
}

/**
 * Why `value` is not an expression tree of `schema` (its nodes depth first, each operator's
 * operands in order), or null. A loop, not recursion: the limits are what is being checked.
 * @param {any} value @param {any} schema @param {string} where
 * @returns {string|null}
 */
function expressionProblem(value, schema, where) {
  /** @type {[any, string, number][]} */
  const pending = [[value, where, 1]];
  let nodes = 0;
  while (pending.length > 0) {
    const [node, at, depth] = /** @type {[any, string, number]} */ (pending.pop());
    nodes += 1;
    if (nodes > schema.max_nodes) return `${where}: an expression of more than ${schema.max_nodes} nodes`;
    if (depth > schema.max_depth) return `${at}: an expression nested deeper than ${schema.max_depth} levels`;
    if (Array.isArray(node)) {
      if (node.length !== 3) return `${at}: expected [operator, a, b], got ${node.length} items`;
      if (typeof node[0] !== "string" || !schema.operators.includes(node[0])) {
        return `${at}[0]: ${describeValue(node[0])} is not one of ${quoted(schema.operators)}`;
      }
      pending.push([node[2], `${at}[2]`, depth + 1], [node[1], `${at}[1]`, depth + 1]);
    } else if (typeof node === "string") {
      const length = [...node].length; // code points, as Python counts
      if (length > schema.max_length) return `${at}: a string of ${length} characters, at most ${schema.max_length} allowed`;
    } else if (typeof node !== "number" || !Number.isSafeInteger(node)) {
      return `${at}: expected an integer, a string or an array, got ${typeName(node)}`;
    }
  }
  return null;
}

/**
 * The names an expression tree (valid by the schema) uses, each with where it is.
 * @param {any} tree @param {string} where
 * @returns {[string, string][]}
 */
export function expressionNames(tree, where) {
  if (typeof tree === "string") return [[tree, where]];
  if (Array.isArray(tree)) return [...expressionNames(tree[1], `${where}[1]`), ...expressionNames(tree[2], `${where}[2]`)];
  return [];
}

/**
 * What the schema cannot say: sizes and counts that must agree across fields.
 * @param {any} manifest
 * @returns {string|null}
 */
function factProblem(manifest) {
  for (const [name, entry] of Object.entries(manifest.dtypes)) {
    if (entry.bytes !== DTYPE_BYTES[name] || entry.device_bytes !== DTYPE_BYTES[entry.device_dtype]) {
      return `dtypes[${JSON.stringify(name)}]: bytes ${entry.bytes} and device_bytes ${entry.device_bytes} ` +
        `are not those of ${name} and ${entry.device_dtype}`;
    }
    // kernels.wasm holds a tensor as the GPU does, but an int64 as int64
    if (entry.wasm_dtype !== entry.device_dtype && !(name === "int64" && entry.wasm_dtype === "int64")) {
      return `dtypes[${JSON.stringify(name)}]: wasm_dtype ${entry.wasm_dtype} is not its device_dtype ` +
        `${entry.device_dtype} (only int64 may be int64 in kernels.wasm)`;
    }
    if (entry.wasm_bytes !== DTYPE_BYTES[entry.wasm_dtype]) {
      return `dtypes[${JSON.stringify(name)}]: wasm_bytes ${entry.wasm_bytes} is not the size of its wasm_dtype ` +
        `${entry.wasm_dtype} (${DTYPE_BYTES[entry.wasm_dtype]} bytes)`;
    }
  }
  const inputStorages = manifest.inputs.map((/** @type {any} */ entry) => entry.storage);
  const caches = manifest.caches ?? [];
  const cached = new Set(caches.map((/** @type {any} */ cache) => cache.input));
  for (const [index, storage] of inputStorages.entries()) {
    const role = cached.has(index) ? "cache" : "input";
    if (manifest.storages[storage].role !== role || inputStorages.filter((/** @type {number} */ s) => s === storage).length > 1) {
      return `inputs[${index}].storage: storage ${storage} is not ${cached.has(index) ? "a cache" : "an input"} storage of its own`;
    }
  }
  for (const [index, cache] of caches.entries()) {
    const entry = manifest.inputs[cache.input];
    const output = manifest.outputs[cache.output];
    if (entry.storage !== cache.storage || output.storage !== cache.storage ||
        manifest.storages[cache.storage].size_at_bounds === null ||
        (entry.kind ?? "tensor") !== "tensor" || (output.kind ?? "tensor") !== "tensor" ||
        output.ndim !== entry.shape.length || cache.axis >= entry.shape.length || output.dtype !== entry.dtype ||
        caches.filter((/** @type {any} */ c) => c.input === cache.input || c.output === cache.output).length > 1) {
      return `caches[${index}]: input ${cache.input} and output ${cache.output} are not tensors of one ` +
        `dtype and rank above axis ${cache.axis} in storage ${cache.storage} (sized at load), each in one cache`;
    }
  }
  const pool = manifest.kv_pool;
  if (pool !== undefined) {
    const table = manifest.inputs[pool.page_table];
    if ((table.kind ?? "tensor") !== "tensor" || table.dtype !== "int32" || table.shape.length !== 3 ||
        table.shape[2] !== pool.pages_per_sequence) {
      return `kv_pool.page_table: input ${pool.page_table} is not an int32 tensor of 3 dimensions whose last is ` +
        `pages_per_sequence (${pool.pages_per_sequence})`;
    }
  }
  for (const kind of ["inputs", "outputs"]) {
    for (const [index, entry] of manifest[kind].entries()) {
      if ((entry.kind === "sequence" || entry.kind === "optional_sequence") && (
        !("sequence" in entry) || !("element_ndim" in entry) || !("sequence_capacity" in manifest))) {
        return `${kind}[${index}]: a sequence needs its sequence and element_ndim, ` +
          "and the manifest its sequence_capacity";
      }
    }
  }
  for (const [index, weight] of manifest.weights.entries()) {
    const shard = manifest.shards[weight.shard];
    if (weight.offset % 4 || weight.offset + weight.nbytes > shard.nbytes) {
      return `weights[${index}]: bytes ${weight.offset}..${weight.offset + weight.nbytes} ` +
        `are not inside shard ${weight.shard} (${shard.nbytes} bytes, 4-byte aligned)`;
    }
    const elements = weight.shape.reduce((/** @type {number} */ a, /** @type {number} */ b) => a * b, 1);
    const expected = elements * manifest.dtypes[weight.dtype].wasm_bytes; // the shards hold the wasm form
    if (weight.nbytes !== expected) {
      return `weights[${index}]: nbytes is ${weight.nbytes}, but its shape and dtype make ${expected}`;
    }
  }
  for (const [index, kernel] of manifest.kernels.entries()) {
    const bindings = kernel.bindings;
    if (!bindings.length || bindings[0] !== "uniform" || bindings.slice(1).includes("uniform")) {
      return `kernels[${index}].bindings: binding 0 and only binding 0 must be "uniform"`;
    }
    const fields = kernel.params ?? [];
    for (const part of "cost" in kernel ? ["flops", "bytes"] : []) {
      for (const [name, at] of expressionNames(kernel.cost[part], `kernels[${index}].cost.${part}`)) {
        if (!fields.includes(name)) return `${at}: ${describeValue(name)} is not one of the kernel's params`;
      }
    }
  }
  const tokenizerFact = tokenizerProblem(manifest.tokenizer);
  if (tokenizerFact) return tokenizerFact;
  if ("wasm" in manifest) {
    const keys = Object.keys(manifest.wasm)
      .filter((key) => ["file", "relaxed_madd_sites", "scratch_bytes", "unavailable"].includes(key)).sort();
    if (!["file,scratch_bytes", "file,relaxed_madd_sites,scratch_bytes", "unavailable"].includes(keys.join(","))) {
      return "wasm: expected either file and scratch_bytes (and maybe relaxed_madd_sites) or unavailable";
    }
    const prepacked = prepackedProblem(manifest);
    if (prepacked) return prepacked;
  }
  for (const [index, site] of manifest.call_sites.entries()) {
    const end = site.params_offset + site.params_size;
    if (site.params_offset % 256 || site.params_size % 16 || end > manifest.params_bytes) {
      return `call_sites[${index}]: params bytes ${site.params_offset}..${end} are not a 16-byte ` +
        `multiple at a 256-byte boundary inside params_bytes (${manifest.params_bytes})`;
    }
    const fields = manifest.kernels[site.kernel].params ?? [];
    if (4 * fields.length > site.params_size) {
      return `call_sites[${index}].params_size: ${site.params_size} bytes, but kernel ${site.kernel} ` +
        `declares ${fields.length} params of 4 bytes`;
    }
    const bindings = manifest.kernels[site.kernel].bindings;
    if (site.buffers.length !== bindings.length - 1) {
      return `call_sites[${index}].buffers: ${site.buffers.length} buffers, but kernel ${site.kernel} declares ${bindings.length - 1}`;
    }
    const partsProblem = weightPartsProblem(manifest, site.buffers, `call_sites[${index}].buffers`);
    if (partsProblem) return partsProblem;
    const written = site.buffers.filter((/** @type {any} */ _, /** @type {number} */ b) => bindings[b + 1] === "storage")
      .map((/** @type {any} */ b) => b.storage);
    for (const buffer of site.buffers) {
      const storage = buffer.storage;
      if (storage !== undefined && written.includes(storage) &&
          site.buffers.filter((/** @type {any} */ b) => b.storage === storage).length > 1) {
        return `call_sites[${index}].buffers: storage ${storage} is both written and bound again`;
      }
    }
  }
  return null;
}

/**
 * Why a call site's weight references do not fit the weights' `parts` (a part that does not
 * exist, a weight in parts bound whole), or null. The twin of runtime/manifest.py's.
 * @param {any} manifest @param {any[]} buffers @param {string} where
 * @returns {string|null}
 */
function weightPartsProblem(manifest, buffers, where) {
  const weights = manifest.weights;
  for (const [position, buffer] of buffers.entries()) {
    if ("weight_part" in buffer) {
      const [weight, part] = buffer.weight_part;
      if (weight >= weights.length || part >= (weights[weight].parts ?? 1)) {
        return `${where}[${position}].weight_part: weight ${weight} has no part ${part}`;
      }
    } else if ("weight" in buffer && (weights[buffer.weight].parts ?? 1) > 1) {
      return `${where}[${position}].weight: weight ${buffer.weight} is bound in parts (weight_part)`;
    }
  }
  return null;
}

/**
 * What is wrong with `wasm.prepacked` beyond the schema: an entry without a kernels.wasm, a call
 * site named twice, params that do not fit the call site's params block (Python's _prepacked_problem).
 * @param {any} manifest @returns {string|null}
 */
function prepackedProblem(manifest) {
  const regions = manifest.wasm.prepacked ?? [];
  if (regions.length && !("file" in manifest.wasm)) return "wasm.prepacked: the bundle has no kernels.wasm";
  const seen = new Set();
  for (const [index, region] of regions.entries()) {
    const site = region.call_site;
    if (seen.has(site)) return `wasm.prepacked[${index}].call_site: call site ${site} is named twice`;
    seen.add(site);
    const size = manifest.call_sites[site].params_size;
    if (4 * region.params.length > size) {
      return `wasm.prepacked[${index}].params: ${4 * region.params.length} bytes, more than call site ${site}'s params_size (${size})`;
    }
  }
  return null;
}

/**
 * What the schema cannot say of the tokenizer entry: a byte tokenizer has the 256 bytes and
 * its special ids below vocab_size; a huggingface one has its tokenizer.json.
 * @param {any} tokenizer @returns {string|null}
 */
function tokenizerProblem(tokenizer) {
  if (tokenizer === undefined) return null;
  if (tokenizer.kind === "byte") {
    if (tokenizer.vocab_size < 256) return `tokenizer.vocab_size: a byte tokenizer has at least 256 ids (one per byte), got ${tokenizer.vocab_size}`;
    for (const name of ["bos_token_id", "eos_token_id"]) {
      if (name in tokenizer && tokenizer[name] >= tokenizer.vocab_size) {
        return `tokenizer.${name}: ${tokenizer[name]} is not below vocab_size (${tokenizer.vocab_size})`;
      }
    }
  } else if (!(tokenizer.files ?? []).includes("tokenizer.json")) {
    return "tokenizer.files: a huggingface tokenizer has its tokenizer.json";
  }
  return null;
}
