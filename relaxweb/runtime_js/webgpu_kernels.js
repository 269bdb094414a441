// The kernels of a model on WebGPU: which shaders the kernels with a variant compile (the CPU
// ones on a CPU adapter, the f16 ones where the adapter has "shader-f16"), their sources, the
// compiled modules and the compute pipelines, and the ragged forms batches use. The twin of
// relaxweb/runtime/webgpu_kernels.py.

import { fetchOk } from "./bundle_files.js";

/** The shader stage the kernels' bindings are visible to (GPUShaderStage.COMPUTE). */
const COMPUTE_STAGE = 0x4;

/** The WebGPU feature the kernels' f16 shaders (the manifest's `f16_file`) need. */
export const SHADER_F16 = "shader-f16";

/**
 * Which shaders the kernels with a variant compile (relaxweb/wgsl/variants.py; the Python
 * runtime's choose_kernels): for "auto", "cpu" on a CPU adapter (`isFallbackAdapter` or
 * SwiftShader: matmuls without workgroup memory, whose barriers cost a CPU adapter more than
 * they save), else "f16" where the bundle has f16 shaders and the adapter (or the given
 * device) offers "shader-f16" (factors multiplied in f16, summed in f32), else "gpu". A
 * forced "f16" falls back to "gpu" with a `warning` where it cannot be had.
 * @param {"auto"|"gpu"|"cpu"|"f16"} kernels the load option
 * @param {{features?: {has(name: string): boolean}, info?: any, adapterInfo?: any}|null} gpu
 *   the GPUAdapter, or the GPUDevice given to load()
 * @param {any} manifest
 * @returns {{kernels: "gpu"|"cpu"|"f16", warning: string|null}}
 */
export function chooseKernels(kernels, gpu, manifest) {
  const hasF16Shaders = manifest.kernels.some((/** @type {any} */ k) => k.f16_file);
  const f16 = hasF16Shaders && Boolean(gpu?.features?.has(SHADER_F16));
  const given = gpu !== null && "adapterInfo" in gpu; // a device has adapterInfo, an adapter info
  if (kernels === "auto") {
    const info = given ? gpu.adapterInfo : gpu?.info;
    const cpu = Boolean(info && (info.isFallbackAdapter || info.architecture === "swiftshader"));
    return { kernels: cpu ? "cpu" : f16 ? "f16" : "gpu", warning: null };
  }
  if (kernels === "f16" && !f16) {
    const reason = hasF16Shaders ? `the ${given ? "given device" : "adapter"} does not offer ${SHADER_F16}` : "the bundle has no f16 shaders";
    return { kernels: "gpu", warning: `kernels "f16": ${reason}; compiling the f32 shaders` };
  }
  return { kernels, warning: null };
}

/**
 * chooseKernels, its warning on the console.
 * @param {"auto"|"gpu"|"cpu"|"f16"} kernels the load option
 * @param {GPUAdapter|GPUDevice|null} gpu the adapter, or the device given to load()
 * @param {any} manifest
 * @returns {"gpu"|"cpu"|"f16"}
 */
export function chosenKernels(kernels, gpu, manifest) {
  const choice = chooseKernels(kernels, gpu, manifest);
  if (choice.warning) console.warn(`relaxweb: ${choice.warning}`);
  return choice.kernels;
}

/**
 * The file of a kernel's shader for a variant: the CPU (f16) one where `variant` is "cpu"
 * ("f16") and the kernel has one, else its own.
 * @param {any} kernel @param {"gpu"|"cpu"|"f16"} variant @returns {string}
 */
export function kernelFile(kernel, variant) {
  return (variant === "cpu" && kernel.cpu_file) || (variant === "f16" && kernel.f16_file) || kernel.file;
}

/**
 * The file of a kernel's ragged form (its `batch_file`, or `batch_cpu_file` where the model
 * compiled the CPU variants).
 * @param {any} kernel @param {"gpu"|"cpu"|"f16"} variant @returns {string}
 */
export function raggedKernelFile(kernel, variant) {
  return (variant === "cpu" && kernel.batch_cpu_file) || kernel.batch_file;
}

/**
 * Every kernel's WGSL for a variant (kernelFile), with the file each came from and the variant.
 * @param {any} manifest
 * @param {(file: string) => URL} fileUrl
 * @param {"gpu"|"cpu"|"f16"} variant
 * @returns {Promise<{kernelSources: string[], kernelFiles: string[], kernels: "gpu"|"cpu"|"f16"}>}
 */
export async function fetchKernelSources(manifest, fileUrl, variant) {
  const kernelFiles = manifest.kernels.map((/** @type {any} */ k) => kernelFile(k, variant));
  const kernelSources = await Promise.all(kernelFiles.map((/** @type {string} */ file) => fetchOk(fileUrl(file)).then((r) => r.text())));
  return { kernelSources, kernelFiles, kernels: variant };
}

/**
 * Compile every kernel's WGSL; reject with the compiler's messages (file:line:column) when
 * one does not compile.
 * @param {GPUDevice} device
 * @param {any} manifest
 * @param {string[]} sources WGSL code per kernel
 * @param {string[]} files the file each came from, for messages
 * @returns {Promise<GPUShaderModule[]>}
 */
export async function compileKernels(device, manifest, sources, files) {
  device.pushErrorScope("validation");
  const modules = manifest.kernels.map((/** @type {any} */ kernel, /** @type {number} */ k) =>
    device.createShaderModule({ label: kernel.name, code: sources[k] }));
  const scopeError = device.popErrorScope();
  await Promise.all(modules.map(async (/** @type {GPUShaderModule} */ module, /** @type {number} */ k) => {
    const kernel = manifest.kernels[k];
    const errors = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
    if (errors.length > 0) {
      const lines = errors.map((m) => `  ${files[k]}:${m.lineNum}:${m.linePos}: ${m.message}`).join("\n");
      throw new Error(`kernel ${kernel.name} does not compile:\n${lines}`);
    }
  })).catch((error) => {
    scopeError.catch(() => {}); // the compiler's messages say more
    throw error;
  });
  const error = await scopeError;
  if (error) throw new Error(`WebGPU validation error while compiling the kernels: ${error.message}`);
  return modules;
}

/**
 * Create one compute pipeline per kernel, with explicit bind group layouts. The GPU calls
 * are made now, in kernel order; each returned promise settles when its pipeline is ready,
 * and rejects naming the kernel when it cannot be created or the device is lost meanwhile.
 * @param {import("./webgpu_device.js").WebGpuDevice} gpu
 * @param {any} manifest
 * @param {GPUShaderModule[]} modules compiled WGSL per kernel
 * @returns {Promise<GPUComputePipeline>[]}
 */
export function createPipelines(gpu, manifest, modules) {
  const device = gpu.device;
  return manifest.kernels.map((/** @type {any} */ kernel, /** @type {number} */ k) => {
    const bindGroupLayout = device.createBindGroupLayout({
      label: kernel.name,
      entries: kernel.bindings.map((/** @type {GPUBufferBindingType} */ type, /** @type {number} */ binding) => ({
        binding, visibility: COMPUTE_STAGE, buffer: { type },
      })),
    });
    return gpu.compiling(kernel.name, device.createComputePipelineAsync({
      label: kernel.name,
      layout: device.createPipelineLayout({ bindGroupLayouts: [bindGroupLayout] }),
      compute: { module: modules[k], entryPoint: kernel.entry_point },
    }));
  });
}

/**
 * A model's compute pipelines: one per kernel, each set when it is ready (a run starts as soon
 * as the pipelines it needs first are ready, while the others keep compiling), and the
 * kernels' ragged forms, compiled on the first runBatch.
 */
export class KernelPipelines {
  /**
   * @param {import("./webgpu_device.js").WebGpuDevice} gpu
   * @param {any} manifest
   * @param {"gpu"|"cpu"|"f16"} variant which shaders the kernels with a variant were compiled from
   * @param {((file: string) => URL)|null} fileUrl the URL of a bundle file (the ragged forms are fetched on the first runBatch)
   */
  constructor(gpu, manifest, variant, fileUrl) {
    this.gpu = gpu;
    this.manifest = manifest;
    this.variant = variant;
    this.fileUrl = fileUrl;
    /** @type {GPUComputePipeline[]} one per kernel, each set when it is ready (start) */
    this.pipelines = [];
    /** @type {Promise<GPUComputePipeline>[]} one per kernel: settles when its pipeline is ready */
    this.pipelinePromises = [];
    /**
     * Resolves when every pipeline is ready; rejects if one cannot be created. A run does
     * not wait for it: each dispatch waits for its own kernel's pipeline only.
     * @type {Promise<void>}
     */
    this.ready = Promise.resolve();
    this.allReady = false;
    /** @type {Promise<GPUComputePipeline[]>|null} the kernels' ragged forms, compiled on the first runBatch */
    this.raggedPromise = null;
  }

  /**
   * Start creating one compute pipeline per kernel, in the order of their first call sites
   * (the order of the manifest's kernels), without waiting for them: `load()` returns once
   * the kernels compile and the weights are on the GPU.
   * @param {GPUShaderModule[]} modules
   */
  start(modules) {
    this.pipelinePromises = createPipelines(this.gpu, this.manifest, modules).map((promise, k) =>
      promise.then((pipeline) => {
        this.pipelines[k] = pipeline;
        return pipeline;
      }));
    for (const promise of this.pipelinePromises) promise.catch(() => {}); // reported by the run that needs it, and by `ready`
    this.ready = Promise.all(this.pipelinePromises).then(() => {
      this.allReady = true;
    });
    this.ready.catch(() => {});
  }

  /** The pipeline of call site `callSite`'s kernel (ready). @param {number} callSite @returns {GPUComputePipeline} */
  ofCallSite(callSite) {
    return this.pipelines[this.manifest.call_sites[callSite].kernel];
  }

  /**
   * The index of the first dispatch at or after `start` whose kernel's pipeline is not
   * ready yet (dispatches.length when there is none).
   * @param {import("./host.js").DispatchCommand[]} dispatches @param {number} start
   * @returns {number}
   */
  firstWithoutPipeline(dispatches, start) {
    if (this.allReady) return dispatches.length;
    for (let i = start; i < dispatches.length; i++) {
      if (!this.ofCallSite(dispatches[i].callSite)) return i;
    }
    return dispatches.length;
  }

  /** Wait for the pipeline of a dispatch's kernel (it rejects naming the kernel when the device is lost). @param {import("./host.js").DispatchCommand} dispatch */
  waitFor(dispatch) {
    return this.pipelinePromises[this.manifest.call_sites[dispatch.callSite].kernel];
  }

  /**
   * The ragged pipelines (raggedKernelFile of each kernel), compiled on the first call; a
   * failure lets the next call try again.
   * @returns {Promise<GPUComputePipeline[]>}
   */
  ragged() {
    if (!this.raggedPromise) {
      const fileUrl = this.fileUrl;
      if (!fileUrl) throw new Error("runBatch needs the bundle's URL: load the model with load()");
      const kernels = this.manifest.kernels.map((/** @type {any} */ k) => ({ ...k, name: `${k.name} (ragged form)` }));
      const files = this.manifest.kernels.map((/** @type {any} */ k) => raggedKernelFile(k, this.variant));
      const gpu = this.gpu;
      const device = gpu.device;
      this.raggedPromise = (async () => {
        const sources = await Promise.all(files.map((/** @type {string} */ file) => fetchOk(fileUrl(file)).then((r) => r.text())));
        const modules = await compileKernels(device, { kernels }, sources, files);
        return Promise.all(createPipelines(gpu, { kernels }, modules));
      })();
      this.raggedPromise.catch(() => { this.raggedPromise = null; }); // the next runBatch tries again
    }
    return this.gpu.orDeviceLoss(/** @type {Promise<GPUComputePipeline[]>} */ (this.raggedPromise));
  }
}
