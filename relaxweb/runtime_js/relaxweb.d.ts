// Types of the public API of the relaxweb browser runtime (relaxweb.js): what `import ... from
// "relaxweb"` gives (the npm package; a bundle's runtime/ folder carries the same files).
//
// Self-contained: they compile under `tsc --strict` with nothing else installed, on every
// TypeScript from 5.0. WebGPU's own types are not referenced here: TypeScript 6 and later have
// them in lib.dom, and @webgpu/types (for earlier ones; an optional peer dependency) declares
// the same names again, so a reference to it would break every newer compiler. A GPUDevice
// below is the consumer's GPUDevice where it has one (lib.dom of TypeScript 6+, or
// @webgpu/types in its tsconfig's "types"), an opaque object where it has none.

/** The environment's `GPUDevice` type (see the top of this file), else `object`. */
export type WebGPUDevice = typeof globalThis extends { GPUDevice: { prototype: infer Device } } ? Device : object;

/**
 * Typed arrays a tensor's data may be, by dtype: float32 Float32Array, float64 Float64Array
 * (float32 on the GPU), float16 Uint16Array of IEEE half bits (an input may also be a
 * Float16Array where the engine has one; outputs are always Uint16Array bits; float32 on the
 * GPU), int32 Int32Array, int16 Int16Array, int8 Int8Array, uint32 Uint32Array, uint16
 * Uint16Array, uint8 Uint8Array (narrow ints are int32/uint32 on the GPU; outputs keep the low
 * bits, like numpy's astype), int64 BigInt64Array (an input may also be an Int32Array; on
 * WebGPU values must fit in int32, as int64 tensors are int32 on the GPU; the wasm backend holds
 * them as int64, exactly), bool Uint8Array (0/1; non-zero is true).
 */
export type TensorData =
  | Float32Array | Float64Array | Int32Array | Int16Array | Int8Array | Uint32Array | Uint16Array
  | BigInt64Array | Uint8Array;

/** A tensor passed to or returned by `Model.run`: row-major data and its shape. */
export interface Tensor {
  data: TensorData;
  shape: number[];
}

/**
 * An input or output as the manifest describes it; shape entries may be symbolic ("batch * 4").
 * How the GPU holds it is the manifest's `dtypes[dtype]` (a DtypeInfo).
 */
export interface TensorSpec {
  name: string;
  dtype: "float32" | "float64" | "float16" | "int32" | "int16" | "int8" | "uint32" | "uint16" | "uint8" | "int64" | "bool" | string;
  shape: (number | string)[];
  storage: number;
}

/**
 * A dtype's entry in the manifest's `dtypes` table: bytes per element in the model, its kind,
 * the dtype it has in GPU memory ("int32" for int64/int16/int8, "uint32" for
 * uint16/uint8/bool, "float32" for float16/float64, else the dtype itself) with its bytes, and
 * the dtype it has in kernels.wasm's memory (the device dtype, but "int64" for int64) with its bytes.
 */
export interface DtypeInfo {
  bytes: number;
  kind: "float" | "int" | "uint" | "bool";
  device_dtype: "float32" | "int32" | "uint32";
  device_bytes: number;
  wasm_dtype: "float32" | "int32" | "uint32" | "int64";
  wasm_bytes: number;
}

/** A symbolic var; `bound` is the bound in effect (the build's, or a tighter one from `load`), null for none. */
export interface SymbolicVar {
  name: string;
  bound: number | null;
}

/** Weight bytes fetched so far, and in all. */
export interface Progress {
  loaded: number;
  total: number;
}

export interface LoadOptions {
  /**
   * What runs the kernels: "webgpu" (the WGSL shaders), "wasm" (the bundle's kernels.wasm,
   * WebAssembly SIMD on the CPU; rejects for a bundle without one), or "auto" (the default):
   * WebGPU where `navigator.gpu` gives an adapter (or `device` is given) that meets the
   * bundle's required limits and features, else wasm when the bundle has kernels.wasm (wasm,
   * without asking for an adapter, when the manifest says WebGPU cannot run the bundle:
   * `webgpu.unavailable`, an int64 weight outside int32; "webgpu" then rejects with that reason).
   * `model.backend` says which, `model.backendReason` why "auto" did not take WebGPU; a console line too.
   */
  backend?: "auto" | "webgpu" | "wasm";
  /**
   * Threads of the wasm backend, an integer from 1 to 256 (default:
   * min(navigator.hardwareConcurrency, 4)). Used only where the page is cross-origin isolated
   * (`crossOriginIsolated`: served with COOP same-origin and COEP require-corp, as `relaxweb
   * serve` does); elsewhere the backend runs on the page's thread alone, without an error, and
   * load's console line says why.
   */
  threads?: number;
  /**
   * The wasm backend's deadline for one kernel call, in milliseconds (default
   * `KERNEL_TIMEOUT_MS`, 10 000): on a cross-origin isolated page every kernel call runs on
   * worker threads, and one that passes it has its workers stopped; where the page is not
   * isolated, kernels run on the page's thread from a kernels.wasm rewritten to look at the
   * clock as it loops, and one that passes it throws. Either way the run rejects and the model
   * must be loaded again.
   */
  kernelTimeoutMs?: number;
  /**
   * The wasm backend's multiply-adds with relaxed SIMD (fused): by default where the engine
   * compiles it; false lowers them to plain SIMD128 at load (results the same on every
   * machine), true insists. `model.relaxedSimd` says which runs.
   */
  relaxedSimd?: boolean;
  /**
   * The wasm backend calls every kernel with no units at load, so that the engine compiles it
   * for speed before the first run: by default for models of 4 MiB of weights and more.
   */
  warmUp?: boolean;
  /** Tighter bounds for symbolic vars: smaller buffers; a bound above the build's is an error. */
  bounds?: Record<string, number>;
  /** Called as the weight shards arrive, first with `loaded: 0`, last with `loaded === total`. */
  onProgress?: (progress: Progress) => void;
  /** A WebGPU device to use instead of requesting one (it must meet the bundle's limits and features). */
  device?: WebGPUDevice;
  /**
   * Keep the weight shards in the Cache API (`caches`): `true` uses the cache named
   * `DEFAULT_CACHE_NAME`, a string names the cache. The manifest, host.wasm and kernels are
   * always fetched. Every shard, cached or not, is checked against the manifest's size and
   * sha256 on every load: a cached copy that fails is dropped and fetched again once; a
   * fetched shard that fails rejects the load, naming the shard. Ignored where there is no
   * Cache API (an insecure context).
   */
  cache?: boolean | string;
  /**
   * Request the adapter's "timestamp-query" feature when it offers one, so that
   * `Model.profile` times each kernel on the GPU (otherwise it submits each dispatch alone
   * and measures wall time). Never requested without this option. Ignored with `device`.
   */
  profile?: boolean;
  /**
   * For kernels with a second shader (the manifest's `cpu_file`: matmuls without workgroup
   * memory, for CPU adapters; `f16_file`: matmuls with factors in f16, for adapters with
   * "shader-f16"), which to compile: "auto" (the default) takes the CPU one on a CPU adapter
   * such as SwiftShader (`isFallbackAdapter`), else the f16 one where the adapter offers
   * "shader-f16" (and then requests it), else the f32 one; "gpu", "cpu" or "f16" force one
   * ("f16" falls back to "gpu", with a console warning, without the feature).
   * `Model.kernels` says which.
   */
  kernels?: "auto" | "gpu" | "cpu" | "f16";
  /**
   * Lower buffer size limits to split the weights the bundle binds in parts at (a weight above
   * 128 MiB, WebGPU's guaranteed `maxStorageBufferBindingSize`), as a device that offers only
   * these would: e.g. `{maxStorageBufferBindingSize: 134217728}` on an adapter that binds more.
   * Storages keep the device's own limits. See docs/bundle-format.md, "Weights in parts".
   */
  limits?: { maxStorageBufferBindingSize?: number; maxBufferSize?: number };
}

/** One kernel's dispatches in a profiled run, added up. */
export interface ProfileRow {
  /** The kernel's name (the manifest's `kernels[k].name`). */
  kernel: string;
  /** Its dispatches in the run. */
  calls: number;
  /** Their time in milliseconds, and its share of the time of all dispatches (0 to 100). */
  totalMs: number;
  percent: number;
  /**
   * Scalar operations and bytes of its calls, from the manifest's `cost` trees evaluated with
   * each call's params; bytes count each input and output buffer once (a lower bound).
   * null for a kernel without a cost (a hand-written library kernel).
   */
  flops: number | null;
  bytes: number | null;
  /** flops and bytes per second of `totalMs`, in 10^9; null without a cost or a time. */
  gflopsPerSecond: number | null;
  gbytesPerSecond: number | null;
}

/** A profiled run: how it was timed, and one row per kernel dispatched, slowest first. */
export interface Profile {
  /**
   * "timestamp queries" (a compute pass per dispatch, GPU timestamps at its start and end: the
   * device has "timestamp-query") or "per-dispatch submits" (each dispatch submitted alone,
   * wall time until `onSubmittedWorkDone`, so submit overhead is included) on WebGPU; "wall
   * clock per kernel call" on the wasm backend (each dispatch's kernel calls on all threads,
   * timed by the page's clock).
   */
  method: "timestamp queries" | "per-dispatch submits" | "wall clock per kernel call";
  /** Dispatches of the run (the sum of the rows' calls). */
  dispatches: number;
  /** The sum of the rows' totalMs. */
  totalMs: number;
  rows: ProfileRow[];
}

/** The Cache API cache that `cache: true` uses: "relaxweb". */
export const DEFAULT_CACHE_NAME: string;

/**
 * An input was missing, had the wrong dtype or rank, a dimension the bundle rejects, or (on
 * WebGPU) an int64 value outside the int32 range.
 */
export class InputShapeError extends Error {
  name: "InputShapeError";
  /** For a host check: its error code and the two numbers of its error info. */
  code?: number;
  value?: number;
  expected?: number;
}

/**
 * A check of the run's data inside a kernel failed (an index out of range of its axis): the
 * message names the model's node, the index and the extent, as the Python runtime's
 * `RunCheckError` (`node 'Gather_3' (Gather): index 7 is out of range for axis 0 of extent 4`).
 */
export class RunCheckError extends Error {
  name: "RunCheckError";
}

/**
 * An output kept on the GPU by `Model.run(inputs, {keepOnGpu})`: a buffer of its own (never a
 * storage the next run overwrites). Pass it to `run` as an input of the same dtype and rank (of
 * a model on the same device): its dimensions go to the bundle's shape checks like an array's,
 * and its bytes are copied GPU-to-GPU into the input's storage. A disposed tensor, or one from
 * another device, is refused with an Error naming the input.
 *
 * A KV cache output (the manifest's `caches`: `present` = concat(`past`, new)) kept on the GPU is
 * a *view* of the cache's storage instead (`cacheView` set; no buffer, no copy): given back as
 * that cache's past in the next run, nothing moves. It is valid until the next run ends; after
 * that it is refused with an Error (read it first to keep its values).
 */
export class GpuTensor {
  /** The output's name. */
  readonly name: string;
  /** The output's model dtype (the GPU holds its `device_dtype`, as for any tensor). */
  readonly dtype: string;
  /** Its shape in the run that made it. */
  readonly shape: number[];
  /** Bytes of its values as the GPU holds them (its buffer may be larger: sized at the bound). */
  readonly byteLength: number;
  /** Whether `dispose()` was called. */
  readonly disposed: boolean;
  /** Set for a view of a KV cache: the manifest's cache entry and the run that wrote it. */
  readonly cacheView: { cache: { input: number; output: number; axis: number; capacity: number; storage: number }; run: number } | null;
  /** Its values, read back: `{data, shape}` as `run` gives an output. Rejects once disposed. */
  read(): Promise<Tensor>;
  /**
   * Give its buffer back to its model, for later kept outputs (a decode loop that disposes the
   * previous step's tensors creates no buffers once warm). Using it afterwards is an error;
   * disposing twice does nothing.
   */
  dispose(): void;
}

/** Options of `Model.run`. */
export interface RunOptions {
  /** Outputs to keep on the GPU, as GpuTensors: their names, or true for every output but sequences. */
  keepOnGpu?: boolean | readonly string[];
}

/**
 * A run's outputs by name, read back (a sequence output, in the rare models that have one, is
 * an array of Tensors instead: cast it).
 */
export type Outputs = Record<string, Tensor>;

/** A run's outputs with `keepOnGpu: [names]`: those names as GpuTensors, the others read back. */
export type KeptOutputs<K extends string> = { [P in K]: GpuTensor } & Record<string, Tensor | GpuTensor>;

/** What a span of a model's life did to GPU memory: real calls counted. */
export interface TransferCounts {
  /** `createBuffer` calls: weights, storages, params, readback and staging buffers, kept outputs. */
  buffersCreated: number;
  /** Bytes of inputs written by `writeBuffer` (a GpuTensor input writes none: it is copied on the GPU). */
  inputBytesWritten: number;
  /** Bytes of params blocks (the kernels' sizes) written by `writeBuffer`. */
  paramsBytesWritten: number;
  /** Bytes of weights written at load. */
  weightBytesWritten: number;
  /** Bytes of mapped buffers read: outputs, values read mid-run, `GpuTensor.read()`, profile timestamps. */
  bytesRead: number;
}

/** A model's counters: since load began, and since its last run started (that run and the reads after it). */
export interface TransferStats {
  readonly total: TransferCounts;
  readonly lastRun: TransferCounts;
  /** Bytes of the model's GPU buffers that exist now: created and not destroyed (pooled buffers of disposed GpuTensors count). */
  readonly liveGpuBytes: number;
}

/** Options of `Model.generate`. */
export interface GenerateOptions {
  /** New tokens at most (default 64; fewer when the bundle's bounds on the sequence length are reached). */
  maxNewTokens?: number;
  /** 0 (default): greedy, the largest logit; above 0: sample from softmax(logits / temperature). */
  temperature?: number;
  /** With a temperature: sample among the topK largest logits only (1..256; 0, the default: all). */
  topK?: number;
  /** Seed of the random numbers (default 0): the same seed gives the same tokens (in the Python runtime too). */
  seed?: number;
  /** Token ids that end generation, not included in the result (default: the tokenizer's EOS ids). */
  stopTokens?: number[];
  /**
   * Called once per new token, with the text so far (complete characters only); returning
   * `false` stops generation (`stopped: "aborted"`). On a paged KV cache an error it throws
   * rejects its own generation only.
   */
  onToken?: (token: number, textSoFar: string) => void | boolean;
  /**
   * Aborting stops generation before its next step (`stopped: "aborted"`); everything is
   * disposed. On a paged KV cache its pages go back to the pool (a queued request leaves the queue).
   */
  signal?: AbortSignal;
  /**
   * On a paged KV cache (a bundle built with `--kv-pages`): whether a request whose pages
   * (`ceil(min(prompt + maxNewTokens - 1, capacity) / pageSize)`) are promised to live
   * sequences waits in the queue until they are free (true, the default), or is refused at
   * once ("the KV cache's pages are taken: ..."). Ignored without one.
   */
  waitForPages?: boolean;
}

/**
 * Options of `generateMany`: `generate`'s, with a seed and a callback per prompt. A signal
 * aborts every prompt of the call.
 */
export interface GenerateManyOptions extends Omit<GenerateOptions, "seed" | "onToken"> {
  /** Prompt i draws from seed `seeds[i]` (default, or where null: i); as many as the prompts. */
  seeds?: (number | null | undefined)[];
  /** Prompt i streams to `onTokens[i]` (none where null); as many as the prompts. */
  onTokens?: (((token: number, textSoFar: string) => void | boolean) | null | undefined)[];
}

/**
 * What a paged KV cache's scheduler holds now (`generationStats`): `live` sequences, `queued`
 * requests, `pagesInUse` of `pages` (of `pageSize` positions each), the positions the live
 * sequences hold (`positionsLive`), and the tokens made per second over the `steps` so far.
 */
export interface GenerationStats {
  live: number;
  queued: number;
  pagesInUse: number;
  pages: number;
  pageSize: number;
  positionsLive: number;
  tokensGenerated: number;
  steps: number;
  tokensPerSecond: number;
  /** Tokens made by the steps that read no prompt chunk, their seconds, and the two's ratio. */
  decodeTokens: number;
  decodeSeconds: number;
  decodeTokensPerSecond: number;
}

/** What `Model.generate` resolves with. */
export interface Generation {
  /** The new tokens (a stop token not included; the prompt's not either). */
  tokens: number[];
  /** Their text (the tokenizer's decoding; the bytes as UTF-8 without a tokenizer). */
  text: string;
  /** Why it stopped: a stop token, `maxNewTokens` (or the bundle's bound), or the signal. */
  stopped: "eos" | "length" | "aborted";
  /** Tokens after the first per second of their runs. */
  tokensPerSecond: number;
  /** Milliseconds of the prompt's run and the first token's sampling. */
  prefillMs: number;
}

/** A bundle loaded on WebGPU. */
/**
 * How the last `runBatch` ran: `mode` "ragged" (one dispatch of each kernel's ragged form per
 * call site for all the instances that run it, each instance in its own slice of every
 * storage) or "one by one" (`reason` says why: the wasm backend, a kernel without a ragged
 * form, KV caches, sequences, GpuTensor inputs); the dispatches it made, its rounds (a read
 * of a value computed on the GPU ends a round) and, when ragged, each instance's symbolic sizes.
 */
export interface BatchReport {
  mode: "ragged" | "one by one";
  reason: string;
  instances: number;
  dispatches: number;
  rounds: number;
  /** output elements the ragged dispatches computed (each instance at its own sizes: exactly what the instances need); null when one by one */
  elements?: number | null;
  varValues?: Record<string, number>[];
}

export class Model {
  readonly backend: "webgpu";
  /** Why `backend: "auto"` did not take WebGPU: always null on WebGPU. */
  readonly backendReason: null;
  readonly inputs: TensorSpec[];
  readonly outputs: TensorSpec[];
  readonly symbolicVars: SymbolicVar[];
  readonly device: WebGPUDevice;
  /**
   * For each weight the bundle binds in parts (above 128 MiB), by name, the byte sizes of the
   * buffers it was loaded into: one when the device binds it whole, else its parts.
   */
  readonly weightPartSizes: Record<string, number[]>;
  /** Which shaders the kernels with a variant were compiled from (see `LoadOptions.kernels`). */
  readonly kernels: "gpu" | "cpu" | "f16";
  /** The parsed manifest.json. */
  readonly manifest: unknown;
  /** Dispatches the last completed run made, over all its steps. */
  readonly lastDispatchCount: number;
  /** Values the last completed run read back from the GPU mid-run (0 for bundles without reads). */
  readonly lastReadCount: number;
  /** How the last completed runBatch ran (null before the first). */
  readonly lastBatch: BatchReport | null;
  /** Buffers created, bytes written and read: since load began, and since the last run started. */
  readonly stats: TransferStats;
  /** The bundle's tokenizer, or null when its manifest has none. */
  readonly tokenizer: Tokenizer | null;
  /**
   * Resolves when every kernel's pipeline is ready. `load` does not wait for it: pipelines
   * keep compiling in the background, and the first run submits each dispatch as soon as
   * its own pipeline is ready. Rejects (as does the run that needs it) when a pipeline
   * cannot be created.
   */
  readonly ready: Promise<void>;
  /**
   * Run once. Rejects with an InputShapeError for bad inputs (or when the bundle rejects a
   * value read back from the GPU mid-run), with an Error for WebGPU validation /
   * out-of-memory errors or a lost device (never hangs on one: a device destroyed or lost
   * mid-life rejects the run in progress, if it depends on the GPU, and every later run).
   * Per run without mid-run reads (and once every pipeline is ready): one params upload,
   * one upload per input, one submit; bind
   * groups are made on a call site's first use and again only when a storage it binds grows.
   * Concurrent calls take turns. With `keepOnGpu`, those outputs are GpuTensors (nothing of
   * them read back; when every output is kept, no readback at all); GpuTensor inputs are
   * copied on the GPU in the run's first command encoder.
   */
  run(inputs: Record<string, Tensor | GpuTensor>, options?: { keepOnGpu?: false }): Promise<Outputs>;
  run<K extends string>(inputs: Record<string, Tensor | GpuTensor>, options: { keepOnGpu: readonly K[] }): Promise<KeptOutputs<K>>;
  run(inputs: Record<string, Tensor | GpuTensor>, options: { keepOnGpu: true }): Promise<Record<string, GpuTensor>>;
  run(inputs: Record<string, Tensor | GpuTensor>, options?: RunOptions): Promise<Record<string, Tensor | GpuTensor>>;
  /**
   * Run a batch of instances, each its own inputs with its own values of the symbolic sizes
   * (its own `seq`), and return each instance's outputs in order. Every instance's inputs are
   * checked and its host module run before any GPU work: an error names the instance
   * (`instance K of the batch: ...`, an InputShapeError for rejected inputs), as does a batch
   * whose packed storages exceed the device's buffer limits. `lastBatch` says how it ran.
   */
  runBatch(instances: Record<string, Tensor>[], options?: RunOptions): Promise<Record<string, Tensor>[]>;
  /**
   * Run `warmup` times (default 1: drivers compile a pipeline on its first use), then once
   * more timing every dispatch; resolve with that run's outputs (the same as `run` gives)
   * and its profile. Timed by timestamp queries when the device has "timestamp-query"
   * (`load(url, {profile: true})`), else by one submit per dispatch. Rejects like `run`.
   */
  profile(inputs: Record<string, Tensor>, options?: { warmup?: number }): Promise<{ outputs: Record<string, Tensor>; profile: Profile }>;
  /**
   * Generate text with a decoder bundle (inputs `input_ids`, `past_key_values.*`, optionally
   * `attention_mask` and `position_ids`; outputs `logits` and `present.*`; else it rejects
   * naming everything missing). `prompt` is text (needs the bundle's tokenizer) or token ids.
   * The prompt runs once with an empty past, then one run per token with `present` and `logits`
   * kept on the GPU and the presents fed back as the past; the next token is picked on the GPU
   * (runtime/sampler.wgsl) and only it is read back (4 bytes per token). Every GpuTensor it
   * makes is disposed before it settles. Rejects with "the model was disposed during generate"
   * when `dispose()` is called before it settles. Generations on one model (`generate`,
   * `generateMany`, `chat`) take turns: a call made while another runs starts when it has
   * settled. On a bundle with a paged KV cache (built with `--kv-pages`; inputs
   * `kv_page_table`, no `attention_mask`) they do not: every call joins the steps of the
   * model's one scheduler, each step one run over every live sequence's next tokens (decoding
   * tokens first, then prompt chunks within the bound of `input_ids`' second dimension) and one
   * submit and one read of all their picks; a request waits in the queue while its pages are
   * taken (see `waitForPages`); a failed run rejects every live generation with its error.
   */
  generate(prompt: string | number[], options?: GenerateOptions): Promise<Generation>;
  /**
   * One Generation per prompt, in order, with `generate`'s options and a seed and callback per
   * prompt (`seeds`, `onTokens`). Every prompt and option is checked before anything runs. On a
   * paged KV cache the prompts advance together (all queued, or none when one is refused with
   * `waitForPages: false`); otherwise one after another, each as `generate` alone.
   */
  generateMany(prompts: (string | number[])[], options?: GenerateManyOptions): Promise<Generation[]>;
  /** The paged KV cache's scheduler now; null without a paged KV cache, or before its first generation. */
  readonly generationStats: GenerationStats | null;
  /** Free the GPU buffers (and the device, when `load` requested it); later runs reject. */
  dispose(): void;
  /** Whether `dispose()` was called. */
  readonly disposed: boolean;
}

/**
 * A bundle loaded on the wasm backend (kernels.wasm): the same `run` results and errors as a
 * `Model` (input checks, the host module's InputShapeErrors, reads, loops, sequences, KV
 * caches, kept outputs, generate and chat). Memory: one WebAssembly.Memory (shared when threads
 * run) holding the params, the weights (copied once), the KV caches (placed once), the storages
 * and a scratch block per thread.
 */
export class WasmModel {
  readonly backend: "wasm";
  /**
   * Why `backend: "auto"` did not take WebGPU: no adapter, or the limits and features the adapter
   * lacks (a buffer size limit names the storage that needs it: what it holds, its size at the
   * bounds), or the bundle's own reason, whatever the GPU (the manifest's `webgpu.unavailable`:
   * "WebGPU cannot run this bundle: weight 'c' (int64) holds 9007199254740993, outside the int32
   * range the GPU holds int64 tensors in"); null when `backend: "wasm"` was asked for.
   */
  readonly backendReason: string | null;
  /** Threads a dispatch's units are split between: the pool's workers, or 1 (the page's thread, where the page is not cross-origin isolated). */
  readonly threads: number;
  /** Units the pool's workers have run since load (0 with one thread). */
  readonly unitsRunByWorkers: number;
  /** Whether the kernels run with relaxed SIMD (else lowered to plain SIMD128 at load; the `relaxedSimd` load option). */
  readonly relaxedSimd: boolean;
  /** The deadline of one kernel call in ms (the `kernelTimeoutMs` load option), on every page. */
  readonly kernelTimeoutMs: number;
  readonly inputs: TensorSpec[];
  readonly outputs: TensorSpec[];
  readonly symbolicVars: SymbolicVar[];
  readonly manifest: unknown;
  readonly tokenizer: Tokenizer | null;
  /** Dispatches the last completed run made, over all its steps. */
  readonly lastDispatchCount: number;
  /** Values the last completed run read back mid-run. */
  readonly lastReadCount: number;
  /** How the last completed runBatch ran (null before the first). */
  readonly lastBatch: BatchReport | null;
  /** Counts of what moved in and out of the memory (`buffersCreated`: regions laid out for storages; `liveGpuBytes` 0). */
  readonly stats: TransferStats;
  /**
   * Run once. Rejects with an InputShapeError for bad inputs, with an Error naming the kernel
   * and its call site's `binding` when a kernel traps, and with an Error for a WebGPU model's
   * GpuTensor. Concurrent calls take turns. With `keepOnGpu`, those outputs stay in this
   * model's memory as WasmTensors (a GpuTensor's interface), which `run` takes back as inputs:
   * a KV cache's present is a view of the cache (no copy; valid until the next run ends) that
   * goes back as its past without a byte written; any other kept output is a copy of its bytes.
   */
  run(inputs: Record<string, Tensor | GpuTensor>, options?: { keepOnGpu?: false }): Promise<Outputs>;
  run<K extends string>(inputs: Record<string, Tensor | GpuTensor>, options: { keepOnGpu: readonly K[] }): Promise<KeptOutputs<K>>;
  run(inputs: Record<string, Tensor | GpuTensor>, options: { keepOnGpu: true }): Promise<Record<string, GpuTensor>>;
  run(inputs: Record<string, Tensor | GpuTensor>, options?: RunOptions): Promise<Record<string, Tensor | GpuTensor>>;
  /** Run a batch of instances: on the wasm backend one after another (see `Model.runBatch`). */
  runBatch(instances: Record<string, Tensor>[], options?: RunOptions): Promise<Record<string, Tensor>[]>;
  /** `run` after `warmup` runs, each dispatch timed by the clock (method "wall clock per kernel call"). */
  profile(inputs: Record<string, Tensor>, options?: { warmup?: number }): Promise<{ outputs: Record<string, Tensor>; profile: Profile }>;
  /**
   * Generate text with a decoder bundle, as `Model.generate`: the same loop, the KV caches kept
   * in place in the memory, each token picked on the CPU by sampler.wgsl's algorithm
   * (runtime/cpu_sampler.js): greedy gives WebGPU's tokens, a seed the same draws. On a paged
   * KV cache, calls join one scheduler's steps, as on WebGPU (each sequence's token picked from
   * its row of the step's logits).
   */
  generate(prompt: string | number[], options?: GenerateOptions): Promise<Generation>;
  /** One Generation per prompt, as `Model.generateMany`. */
  generateMany(prompts: (string | number[])[], options?: GenerateManyOptions): Promise<Generation[]>;
  /** The paged KV cache's scheduler now, as `Model.generationStats`. */
  readonly generationStats: GenerationStats | null;
  /** Stop the workers and the host module; later runs reject (and a running generate, saying so). */
  dispose(): void;
  /** Whether `dispose()` was called. */
  readonly disposed: boolean;
}

/** The wasm backend's default deadline for one kernel call (ms): the `kernelTimeoutMs` load option's default. */
export const KERNEL_TIMEOUT_MS: number;
/** `bytes` (a kernels.wasm) with its memory import made shared (limits flag 0x01 -> 0x03), for threads. */
export function sharedMemoryVariant(bytes: ArrayBuffer | Uint8Array): Uint8Array;

/** Units [0, units) as contiguous ranges, one per thread used (each of at least `minUnits`, default 4); the first is the calling thread's. */
export function splitUnits(units: number, threads: number, minUnits?: number): [number, number][];

/**
 * Fetch a bundle (its folder URL, or its manifest.json), verify its weights, set up WebGPU
 * (or the wasm backend: see `LoadOptions.backend`).
 * Rejects when the bundle has another format version than this runtime's (rebuild it), when
 * WebGPU, a required feature (`required_features`) or a required limit is missing (one
 * message naming each, with the needed and offered values), a shard is corrupt, or a kernel
 * does not compile. Resolves before the pipelines are ready (see `Model.ready`).
 */
export function load(url: string | URL, options: LoadOptions & { backend: "webgpu" }): Promise<Model>;
export function load(url: string | URL, options: LoadOptions & { backend: "wasm" }): Promise<WasmModel>;
export function load(url: string | URL, options?: LoadOptions): Promise<Model | WasmModel>;

// ---- Tokenizers, chat templates, chat and sampling (tokenizer.js, chat_template.js, generate.js) ----
// Declaration merging adds chat to Model and WasmModel, and top-p and the repetition penalty
// to GenerateOptions.

/** The bundle's tokenizer (manifest `tokenizer`), by its kind. */
export type Tokenizer = ByteTokenizer | HuggingFaceTokenizer;

/** Kind "byte": ids 0-255 are UTF-8 bytes, higher ids special. */
export interface ByteTokenizer {
  readonly kind: "byte";
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenId: number | null;
  /** A byte tokenizer has no chat template. */
  readonly chatTemplate: null;
  /** BOS (when there is one and `addSpecialTokens`, the default), then the UTF-8 bytes of `text`. */
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
  /** Special ids dropped, bytes decoded as UTF-8 (invalid sequences replaced by U+FFFD). */
  decode(ids: Iterable<number>): string;
  /** The ids that end generation by default: the EOS, when there is one. */
  readonly stopTokens: number[];
  /** No sampling defaults. */
  readonly generationDefaults: SamplingOptions;
}

/**
 * Kind "huggingface": the publisher's tokenizer.json, encoded and decoded by
 * @huggingface/tokenizers as the Python tokenizers library does, and its chat template.
 */
export interface HuggingFaceTokenizer {
  readonly kind: "huggingface";
  readonly vocabSize: number;
  /** Every EOS id of the model's configs (generation_config.json, tokenizer_config.json's eos_token). */
  readonly eosTokenIds: number[];
  /** The named special tokens a chat template sees (bos_token, eos_token, ...). */
  readonly specialTokens: Record<string, string>;
  readonly chatTemplate: ChatTemplate | null;
  /** The ids of `text`, with the post-processor's special tokens unless `addSpecialTokens` is false. */
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
  /** The text of `ids`, special tokens left out. */
  decode(ids: Iterable<number>): string;
  /** The ids that end generation by default: `eosTokenIds`. */
  readonly stopTokens: number[];
  /** The publisher's sampling options (generation_config.json, as transformers reads it). */
  readonly generationDefaults: SamplingOptions;
}

/** A publisher's chat template, rendered by @huggingface/jinja as transformers renders it. */
export interface ChatTemplate {
  readonly text: string;
  render(messages: ChatMessage[], options?: { addGenerationPrompt?: boolean }): string;
}

/** A message of a conversation: a role, content (text, or parts such as {type: "text", text}), any other JSON fields. */
export interface ChatMessage {
  role: string;
  content?: unknown;
  [field: string]: unknown;
}

/** How each token is picked; an option not given takes the bundle's default, else greedy / 0 / 1 / 1. */
export interface SamplingOptions {
  temperature?: number;
  topK?: number;
  /** With a temperature: sample among the most likely tokens that make up topP of the probability (above 0, at most 1; 1: all). */
  topP?: number;
  /** Logits of tokens already in the sequence (the prompt's too) divided by it, multiplied where negative (1: none). */
  repetitionPenalty?: number;
}

export interface GenerateOptions extends SamplingOptions {}

export interface Model {
  /**
   * The prompt text of a conversation: the bundle's chat template rendered as transformers'
   * `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` renders it.
   * Throws when the bundle has no chat template, for messages that are not a non-empty list
   * of objects, and with the template's own message when it refuses them.
   */
  applyChatTemplate(messages: ChatMessage[], options?: { addGenerationPrompt?: boolean }): string;
  /**
   * The assistant's reply to `messages`: `generate` (with the same options) after
   * `applyChatTemplate`'s prompt, encoded without adding special tokens (the template writes
   * them); `tokens` and `text` are the reply's.
   */
  chat(messages: ChatMessage[], options?: GenerateOptions): Promise<Generation>;
}

export interface WasmModel {
  /** The prompt text of a conversation (see `Model.applyChatTemplate`). */
  applyChatTemplate(messages: ChatMessage[], options?: { addGenerationPrompt?: boolean }): string;
  /** The assistant's reply to `messages`, as `Model.chat` (each token picked on the CPU). */
  chat(messages: ChatMessage[], options?: GenerateOptions): Promise<Generation>;
}
// ---- end of tokenizers, chat templates, chat and sampling ----
