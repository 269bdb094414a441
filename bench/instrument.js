// Installed by bench/run.py with Playwright's add_init_script, so it runs in every page before
// any of the page's own scripts: before relaxweb or onnxruntime-web can touch WebGPU.
// It wraps the WebGPU calls the benchmark counts, identically for every system:
//   GPUDevice.prototype.createComputePipeline / createComputePipelineAsync -> pipelines
//   GPUDevice.prototype.createBuffer                                        -> buffers, bytes
//   GPUBuffer.prototype.destroy                                             -> live bytes
//   GPUComputePassEncoder.prototype.dispatchWorkgroups(Indirect)            -> dispatches
//   GPUQueue.prototype.writeBuffer                                          -> bytes written
//   GPUBuffer.prototype.mapAsync / getMappedRange / unmap                   -> bytes read or written
// Bytes "written" are what JavaScript hands to the GPU: writeBuffer's bytes, and the mapped
// ranges of buffers mapped for writing (mappedAtCreation, MAP_WRITE); bytes "read" are the
// mapped ranges of buffers mapped for reading (MAP_READ). Writes into UNIFORM buffers (shader
// parameters: shapes, offsets) are also counted apart, as uniformBytesWritten.
// window.__bench.snapshot() returns a copy of the counters; differences of two snapshots
// give what happened in between.
(() => {
  const counts = {
    pipelines: 0,        // compute pipelines created (sync + async)
    buffers: 0,          // GPU buffers created
    bufferBytes: 0,      // bytes of all GPU buffers created
    liveBytes: 0,        // bytes of created buffers not destroyed yet
    peakLiveBytes: 0,    // the most liveBytes ever was
    dispatches: 0,       // dispatchWorkgroups + dispatchWorkgroupsIndirect calls
    writes: 0,           // queue.writeBuffer calls
    maps: 0,             // buffer.mapAsync calls
    bytesWritten: 0,     // bytes from JavaScript to the GPU (writeBuffer, ranges mapped for writing)
    uniformBytesWritten: 0, // of bytesWritten, those into UNIFORM buffers
    bytesRead: 0,        // bytes from the GPU to JavaScript (ranges mapped for reading)
  };
  // With record(true), every transfer is also listed ({kind: "write"|"read", bytes, uniform})
  // until record(false) returns the list: what one decode step moved, for the JSON.
  let transfers = null;
  window.__bench = {
    snapshot: () => ({ ...counts }),
    record(on) {
      const list = transfers;
      transfers = on ? [] : null;
      return list;
    },
  };
  if (typeof GPUDevice === "undefined") return; // no WebGPU: the page reports it
  const sizes = new WeakMap(); // live buffer -> its size
  const uniforms = new WeakSet(); // buffers created with the UNIFORM usage
  const mapping = new WeakMap(); // mapped buffer -> "write" or "read"
  const transfer = (kind, bytes, uniform) => {
    if (kind === "write") {
      counts.bytesWritten += bytes;
      if (uniform) counts.uniformBytesWritten += bytes;
    } else {
      counts.bytesRead += bytes;
    }
    transfers?.push({ kind, bytes, uniform });
  };

  const wrap = (proto, name, before) => {
    const original = proto[name];
    if (typeof original !== "function") return;
    proto[name] = function (...args) {
      const result = original.apply(this, args);
      before(this, args, result);
      return result;
    };
  };
  wrap(GPUDevice.prototype, "createComputePipeline", () => { counts.pipelines += 1; });
  wrap(GPUDevice.prototype, "createComputePipelineAsync", () => { counts.pipelines += 1; });
  wrap(GPUDevice.prototype, "createBuffer", (_device, [descriptor], buffer) => {
    const size = Number(descriptor?.size ?? 0);
    counts.buffers += 1;
    counts.bufferBytes += size;
    counts.liveBytes += size;
    counts.peakLiveBytes = Math.max(counts.peakLiveBytes, counts.liveBytes);
    sizes.set(buffer, size);
    if (Number(descriptor?.usage ?? 0) & GPUBufferUsage.UNIFORM) uniforms.add(buffer);
    if (descriptor?.mappedAtCreation) mapping.set(buffer, "write");
  });
  wrap(GPUBuffer.prototype, "destroy", (buffer) => {
    const size = sizes.get(buffer);
    if (size !== undefined) {
      counts.liveBytes -= size;
      sizes.delete(buffer);
    }
  });
  wrap(GPUQueue.prototype, "writeBuffer", (_queue, [buffer, , data, dataOffset = 0, size]) => {
    // offsets and sizes count elements for a typed array, bytes for an ArrayBuffer / DataView
    const element = ArrayBuffer.isView(data) ? (data.BYTES_PER_ELEMENT ?? 1) : 1;
    counts.writes += 1;
    transfer("write", size !== undefined ? Number(size) * element : data.byteLength - Number(dataOffset) * element,
      uniforms.has(buffer));
  });
  wrap(GPUBuffer.prototype, "mapAsync", (buffer, [mode]) => {
    counts.maps += 1;
    mapping.set(buffer, mode & GPUMapMode.READ ? "read" : "write");
  });
  wrap(GPUBuffer.prototype, "getMappedRange", (buffer, _args, range) => {
    const kind = mapping.get(buffer);
    if (kind) transfer(kind, range.byteLength, uniforms.has(buffer));
  });
  wrap(GPUBuffer.prototype, "unmap", (buffer) => { mapping.delete(buffer); });
  wrap(GPUComputePassEncoder.prototype, "dispatchWorkgroups", () => { counts.dispatches += 1; });
  wrap(GPUComputePassEncoder.prototype, "dispatchWorkgroupsIndirect", () => { counts.dispatches += 1; });
})();
