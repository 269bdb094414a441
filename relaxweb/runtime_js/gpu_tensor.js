// Tensors that stay on the GPU between runs, and the counters of what moves to and from it
// (the Python runtime's relaxweb/runtime/gpu_tensor.py).
//
// `model.run(inputs, {keepOnGpu: [...] | true})` gives a GpuTensor for each kept output: a
// buffer of its own (never a storage the next run overwrites), which `run` accepts back as an
// input and copies GPU-to-GPU into the input's storage. A disposed tensor's buffer goes to its
// model's BufferPool, where the next kept output of that size finds it, so a decode loop that
// disposes the previous step's tensors creates no buffers once warm.
//
// A model's KV cache output (manifest "caches") kept on the GPU is a *view* instead: a GpuTensor
// over the cache's own storage (its logical shape; no buffer, no copy), which the next run takes
// back as that cache's past without moving anything. Every run writes every cache, so a view is
// valid until the next run ends: given to that run it is current (its past), afterwards it is
// stale and refused wherever it is used (read() it first to keep its values). Any other past
// (data, another tensor) is written into the cache's rows, one write or copy per block.

/**
 * [source offset, cache offset, bytes] of each block of a tensor of `shape` along the cache's
 * axis: its rows, `capacity` rows apart in the cache, dense in the source (null) or `capacity`
 * rows apart in the `source` cache's layout.
 * @param {{axis: number, capacity: number}} cache @param {number[]} shape @param {number} itemSize
 * @param {{capacity: number}|null} source
 * @returns {[number, number, number][]}
 */
export function cacheBlockCopies(cache, shape, itemSize, source) {
  const product = (/** @type {number[]} */ dims) => dims.reduce((a, b) => a * b, 1);
  const outer = product(shape.slice(0, cache.axis));
  const row = product(shape.slice(cache.axis + 1)) * itemSize;
  const size = shape[cache.axis] * row;
  const sourceStride = source === null ? size : source.capacity * row;
  /** @type {[number, number, number][]} */
  const copies = [];
  for (let block = 0; size > 0 && block < outer; block++) copies.push([block * sourceStride, block * cache.capacity * row, size]);
  return copies;
}

/**
 * What a span of a model's life (its lifetime, or one run) did to GPU memory.
 * @typedef {{buffersCreated: number, inputBytesWritten: number, paramsBytesWritten: number,
 *   weightBytesWritten: number, bytesRead: number}} TransferCounts
 */

/** @returns {TransferCounts} */
const zeroCounts = () => ({ buffersCreated: 0, inputBytesWritten: 0, paramsBytesWritten: 0, weightBytesWritten: 0, bytesRead: 0 });

/**
 * A model's counters of its real GPU calls: `total` since it was created (load included),
 * `lastRun` since its last run started (that run, and reads of GpuTensors after it: a decode
 * loop's `lastRun` is one token's), and `liveGpuBytes`: the bytes of its GPU buffers that exist
 * now (created and not destroyed; pooled buffers of disposed GpuTensors count), so that a test
 * can show memory stays flat.
 */
export class TransferStats {
  constructor() {
    /** @type {TransferCounts} */
    this.total = zeroCounts();
    /** @type {TransferCounts} */
    this.lastRun = zeroCounts();
    this.liveGpuBytes = 0;
  }

  /**
   * Count a new buffer's bytes in `liveGpuBytes` until it is destroyed (its `destroy` is wrapped).
   * @param {GPUBuffer} buffer
   */
  trackBuffer(buffer) {
    const { size } = buffer;
    const destroy = buffer.destroy.bind(buffer);
    let live = true;
    this.liveGpuBytes += size;
    buffer.destroy = () => {
      if (live) this.liveGpuBytes -= size;
      live = false;
      destroy();
    };
  }

  startRun() {
    this.lastRun = zeroCounts();
  }

  /** @param {keyof TransferCounts} counter @param {number} [amount] */
  add(counter, amount = 1) {
    this.total[counter] += amount;
    this.lastRun[counter] += amount;
  }
}

/** Idle GPU buffers kept for reuse: those of disposed GpuTensors, and readback buffers. */
export class BufferPool {
  constructor() {
    /** @type {GPUBuffer[]} */
    this.free = [];
    this.closed = false;
  }

  /**
   * The smallest free buffer of at least `size` bytes (taken out of the pool), or null.
   * @param {number} size
   * @returns {GPUBuffer|null}
   */
  take(size) {
    let best = -1;
    this.free.forEach((buffer, k) => {
      if (buffer.size >= size && (best < 0 || buffer.size < this.free[best].size)) best = k;
    });
    return best < 0 ? null : this.free.splice(best, 1)[0];
  }

  /** Keep `buffer` for later (destroyed at once when the pool is closed). @param {GPUBuffer} buffer */
  give(buffer) {
    if (this.closed) buffer.destroy();
    else this.free.push(buffer);
  }

  /** Destroy every buffer in the pool, and every buffer given back from now on. */
  close() {
    this.closed = true;
    for (const buffer of this.free.splice(0)) buffer.destroy();
  }
}

/**
 * An output kept on the GPU by `model.run(inputs, {keepOnGpu})`: `name` is the output's,
 * `dtype` its model dtype (the GPU holds int64 as int32 and so on, as for any tensor), `shape`
 * its shape in that run. Pass it to `run` as an input of the same dtype and rank (of a model on
 * the same device) to copy it on the GPU; `await read()` gives `{data, shape}` as an output
 * would be; `dispose()` gives its buffer back to its model for later kept outputs.
 */
export class GpuTensor {
  /**
   * @param {{device: GPUDevice, readGpuTensor: (tensor: GpuTensor) => Promise<any>, gpuTensorPool: BufferPool}} model
   * @param {string} name @param {string} dtype @param {number[]} shape
   * @param {GPUBuffer} buffer @param {number} byteLength bytes of its values as the GPU holds them
   * @param {{cache: any, run: number}|null} [cacheView] set for a view of a KV cache (its buffer is the cache's)
   */
  constructor(model, name, dtype, shape, buffer, byteLength, cacheView = null) {
    this.name = name;
    this.dtype = dtype;
    this.shape = shape;
    this.byteLength = byteLength;
    this.model = model;
    /** @type {GPUBuffer|null} */
    this.gpuBuffer = buffer;
    this.cacheView = cacheView;
  }

  get disposed() {
    return this.gpuBuffer === null;
  }

  /** Its buffer; throws once it is disposed. @returns {GPUBuffer} */
  buffer() {
    if (!this.gpuBuffer) throw new Error(`GPU tensor '${this.name}' was disposed and cannot be used any more`);
    return this.gpuBuffer;
  }

  /** Its values, read back: `{data, shape}` like an output of `run`. */
  read() {
    return this.model.readGpuTensor(this);
  }

  /** Give its buffer back to its model; using it afterwards is an error. Twice does nothing. */
  dispose() {
    if (this.gpuBuffer && !this.cacheView) this.model.gpuTensorPool.give(this.gpuBuffer);
    this.gpuBuffer = null;
  }
}
