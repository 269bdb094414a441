// Installed by bench/run.py with Playwright's add_init_script, so it runs in every page before
// any of the page's own scripts: before relaxweb or onnxruntime-web can touch WebGPU.
// It wraps the WebGPU calls the benchmark counts, identically for every system:
//   GPUDevice.prototype.createComputePipeline / createComputePipelineAsync -> pipelines
//   GPUDevice.prototype.createBuffer                                        -> buffers, bytes
//   GPUBuffer.prototype.destroy                                             -> live bytes
//   GPUComputePassEncoder.prototype.dispatchWorkgroups(Indirect)            -> dispatches
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
  };
  window.__bench = { snapshot: () => ({ ...counts }) };
  if (typeof GPUDevice === "undefined") return; // no WebGPU: the page reports it
  const sizes = new WeakMap(); // live buffer -> its size

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
  });
  wrap(GPUBuffer.prototype, "destroy", (buffer) => {
    const size = sizes.get(buffer);
    if (size !== undefined) {
      counts.liveBytes -= size;
      sizes.delete(buffer);
    }
  });
  wrap(GPUComputePassEncoder.prototype, "dispatchWorkgroups", () => { counts.dispatches += 1; });
  wrap(GPUComputePassEncoder.prototype, "dispatchWorkgroupsIndirect", () => { counts.dispatches += 1; });
})();
