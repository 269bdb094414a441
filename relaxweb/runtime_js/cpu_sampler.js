// The next token of `generate` picked on the CPU: sampler.wgsl's algorithm in JavaScript, for the
// wasm backend (which has no GPU to run sampler.wgsl on). The twin of relaxweb/runtime/sampler.py.
//
// The same steps in the same float32 arithmetic (Math.fround after each operation): the
// repetition penalty (a logit of a seen token divided by it, multiplied where negative), greedy
// (the first largest logit; NaN never picked, a row of NaNs gives 0), the top `topK` in order
// (larger first, the smaller index among equals), top-p inside the top-k by thread 0's
// sequential sum, top-p over the row by the shader's bisection of the 2^32 float keys, then the
// pick by the inverse cumulative probability at the token's uniform. Sums are taken in the
// shader's order (each of its 256 threads' strided or contiguous chunk in sequence, then the
// tree or sequential reduction), so only `exp` differs (WGSL's is not correctly rounded): a
// draw within a few ulps of a boundary may pick the neighbouring token; greedy never differs.

const THREADS = 256;
const MAX_TOP_K = 256;
const NONE = 0xffffffff;
const f32 = Math.fround;

/**
 * The seen-token bits of a new generation: the prompt's when there is a repetition penalty.
 * @param {number} vocab @param {{repetitionPenalty: number}} sampling @param {number[]} prompt
 * @returns {Uint32Array}
 */
export function seenBits(vocab, sampling, prompt) {
  const seen = new Uint32Array(Math.ceil(vocab / 32));
  if (sampling.repetitionPenalty !== 1) for (const id of prompt) seen[id >>> 5] |= 1 << (id & 31);
  return seen;
}

/** A u32 that orders as the float32 does (sampler.wgsl's order_key). @param {Float32Array} values @returns {Uint32Array} */
function orderKeys(values) {
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  return bits.map((b) => ((b & 0x80000000) !== 0 ? ~b >>> 0 : (b | 0x80000000) >>> 0));
}

/**
 * sampler.wgsl's weight_from reduction of the weights whose key is at least `cutoff`: thread t
 * adds t, t + THREADS, ... in order, then the threads' sums are added in a tree.
 * @param {Float32Array} weights @param {Uint32Array|null} keys @param {number} cutoff @returns {number}
 */
function strideSum(weights, keys, cutoff) {
  const sums = new Float32Array(THREADS);
  for (let i = 0; i < weights.length; i++) {
    if (keys === null || keys[i] >= cutoff) sums[i % THREADS] = sums[i % THREADS] + weights[i];
  }
  for (let stride = THREADS / 2; stride > 0; stride >>= 1) for (let t = 0; t < stride; t++) sums[t] = sums[t] + sums[t + stride];
  return sums[0];
}

/**
 * The token sampler.wgsl picks from `row` (float32 logits) at `uniform`, with the penalty on the
 * ids marked in `seen` (which then marks the token picked).
 * @param {Float32Array} row
 * @param {Uint32Array} seen
 * @param {{temperature: number, topK: number, topP: number, repetitionPenalty: number}} sampling
 * @param {number} uniform
 * @returns {number}
 */
export function sampleRow(row, seen, sampling, uniform) {
  const values = Float32Array.from(row);
  if (sampling.repetitionPenalty !== 1) {
    const penalty = f32(sampling.repetitionPenalty);
    for (let i = 0; i < values.length; i++) {
      if ((seen[i >>> 5] >>> (i & 31)) & 1) values[i] = values[i] < 0 ? values[i] * penalty : values[i] / penalty;
    }
  }
  const token = pick(values, sampling, f32(uniform));
  seen[token >>> 5] |= 1 << (token & 31);
  return token;
}

/**
 * @param {Float32Array} values @param {{temperature: number, topK: number, topP: number}} sampling
 * @param {number} uniform @returns {number}
 */
function pick(values, { temperature, topK, topP }, uniform) {
  const greedy = temperature === 0;
  const rounds = greedy || topK === 0 ? 1 : Math.min(topK, MAX_TOP_K);
  const top = topCandidates(values, rounds);
  if (top.length === 0) return 0;
  if (greedy) return top[0];
  const largest = values[top[0]];
  const t = f32(temperature);
  const p = f32(topP);
  const weight = (/** @type {number} */ value) => f32(Math.exp(f32(f32(value - largest) / t)));
  if (topK > 0) return pickInTopK(top, top.map((i) => weight(values[i])), p, uniform);
  const weights = values.map((value) => (value === value ? weight(value) : 0));
  if (topP < 1) {
    const keys = orderKeys(values);
    const cutoff = topPCutoff(weights, keys, p);
    for (let i = 0; i < weights.length; i++) if (keys[i] < cutoff) weights[i] = 0;
  }
  return pickInRow(weights, top[0], uniform);
}

/**
 * The `rounds` largest values in order (larger first, the smaller index among equals; NaN never).
 * @param {Float32Array} values @param {number} rounds @returns {number[]}
 */
function topCandidates(values, rounds) {
  /** @type {number[]} */
  const top = [];
  for (let i = 0; i < values.length; i++) {
    const value = values[i];
    if (value !== value) continue;
    if (top.length === rounds && !(value > values[top[rounds - 1]])) continue; // equal: the earlier index stays
    let at = top.length;
    while (at > 0 && value > values[top[at - 1]]) at--;
    top.splice(at, 0, i);
    if (top.length > rounds) top.pop();
  }
  return top;
}

/**
 * Thread 0's pick among the top-k cut to top_p: keep j while those before it weigh less than
 * top_p of their total, then the inverse cumulative probability.
 * @param {number[]} top @param {number[]} weights @param {number} topP @param {number} uniform @returns {number}
 */
function pickInTopK(top, weights, topP, uniform) {
  let total = 0;
  for (const w of weights) total = f32(total + w);
  let kept = 0;
  let keptWeight = 0;
  while (kept < top.length && (kept === 0 || keptWeight < f32(topP * total))) keptWeight = f32(keptWeight + weights[kept++]);
  const threshold = f32(uniform * keptWeight);
  let cumulative = 0;
  for (let j = 0; j < kept; j++) {
    cumulative = f32(cumulative + weights[j]);
    if (cumulative > threshold) return top[j];
  }
  return top[kept - 1];
}

/**
 * The smallest key whose tokens keep top_p of the probability (sampler.wgsl's bisection).
 * @param {Float32Array} weights @param {Uint32Array} keys @param {number} topP @returns {number}
 */
function topPCutoff(weights, keys, topP) {
  const total = strideSum(weights, null, 0);
  let low = 0;
  let high = NONE;
  for (let round = 0; round < 32 && low < high; round++) {
    const middle = low + Math.floor((high - low) / 2);
    if (strideSum(weights, keys, middle + 1) < f32(topP * total)) high = middle;
    else low = middle + 1;
  }
  return low;
}

/**
 * The pick over the whole row (`weights` 0 where a token is cut): each thread sums a contiguous
 * chunk in order, thread 0 finds the chunk where the running sum crosses uniform * total, then
 * the token inside it; `first` (the largest) where none crosses.
 * @param {Float32Array} weights @param {number} first @param {number} uniform @returns {number}
 */
function pickInRow(weights, first, uniform) {
  const vocab = weights.length;
  const chunk = Math.ceil(vocab / THREADS);
  const chunkSums = new Float32Array(THREADS);
  for (let i = 0; i < vocab; i++) chunkSums[Math.floor(i / chunk)] = chunkSums[Math.floor(i / chunk)] + weights[i];
  let total = 0;
  for (const sum of chunkSums) total = f32(total + sum);
  const threshold = f32(uniform * total);
  let cumulative = 0;
  for (let t = 0; t < THREADS; t++) {
    if (f32(cumulative + chunkSums[t]) > threshold) {
      for (let i = t * chunk; i < Math.min((t + 1) * chunk, vocab); i++) {
        if (weights[i] === 0) continue; // cut (or a weight of 0, which adds nothing)
        cumulative = f32(cumulative + weights[i]);
        if (cumulative > threshold) return i;
      }
      return first;
    }
    cumulative = f32(cumulative + chunkSums[t]);
  }
  return first;
}

/**
 * The token sampler of one generate on the wasm backend: its sampling options and the ids seen
 * (the prompt's with a penalty, then each token picked), as sampler.wgsl keeps them on the GPU.
 */
export class CpuSampler {
  /**
   * @param {number} vocab
   * @param {{temperature: number, topK: number, topP: number, repetitionPenalty: number}} sampling
   * @param {number[]} prompt
   */
  constructor(vocab, sampling, prompt) {
    this.vocab = vocab;
    this.sampling = sampling;
    this.seen = seenBits(vocab, sampling, prompt);
  }

  /**
   * The next token from the last row of the kept `logits` ([1, seq, vocab], float32 as held).
   * @param {{deviceData(): Float32Array}} logits @param {number} uniform @returns {Promise<number>}
   */
  async sample(logits, uniform) {
    const data = logits.deviceData();
    return sampleRow(data.subarray(data.length - this.vocab), this.seen, this.sampling, uniform);
  }

  /**
   * Each sampler's next token from its row of the kept `logits` ([1, T, vocab], float32 as
   * held; `picks`: sampler, row, uniform): a paged KV cache's step (paged_generate.js).
   * @param {{deviceData(): Float32Array}} logits @param {[CpuSampler, number, number][]} picks @returns {number[]}
   */
  static sampleRows(logits, picks) {
    const data = logits.deviceData();
    return picks.map(([sampler, row, uniform]) =>
      sampleRow(data.subarray(row * sampler.vocab, (row + 1) * sampler.vocab), sampler.seen, sampler.sampling, uniform));
  }

  /** Nothing to release: the seen ids go with the sampler. */
  close() {}
}
