// The next token of `generate`, picked on the GPU from one row of logits (both runtimes run
// this file: relaxweb/runtime/generate.py and runtime_js/generate.js). One workgroup of
// THREADS invocations; the result is one u32, the only value read back per token.
//
// In the order transformers applies them:
//   repetition_penalty     a logit of a token in `seen` (the prompt's and the generated ids) is
//                          divided by it (multiplied where negative); 1: no penalty
//   temperature == 0       greedy: the largest logit (the first of equals, as numpy's argmax)
//   top_k in 1..MAX_TOP_K  keep the top_k largest logits (0: the whole row)
//   top_p in (0, 1)        keep the most likely tokens whose probabilities, softmax(logit /
//                          temperature) over those kept so far, sum to top_p: a token stays
//                          while the tokens more likely than it sum to less than top_p
//                          (ties at the edge all stay); 1: no cut
// then sample from softmax(logit / temperature) renormalised over the tokens kept.
//
// `uniform` is a number in [0, 1) from the runtime's seeded generator, one per token: the
// token is the first (in the order of the top-k, else of the row) whose cumulative
// probability exceeds uniform * total. NaN logits are never picked (every comparison with NaN
// is false); a row of NaNs gives token 0. The token picked is added to `seen`.
// No infinity constant appears (WGSL compilers may assume there are none): the "no candidate
// yet" state is the index NONE.

struct Params {
  offset: u32,              // the row's first element in `logits`
  vocab: u32,               // the row's length
  top_k: u32,               // 0: the whole row
  temperature: f32,         // 0: greedy
  uniform: f32,             // in [0, 1)
  top_p: f32,               // in (0, 1]; 1: no cut
  repetition_penalty: f32,  // > 0; 1: none
  penalized: u32,           // 1: apply repetition_penalty to the tokens in `seen`
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> result: array<u32>;
@group(0) @binding(3) var<storage, read_write> seen: array<u32>;  // one bit per token id

const THREADS: u32 = 256u;
const MAX_TOP_K: u32 = 256u;
const NONE: u32 = 0xffffffffu;

var<workgroup> best_value: array<f32, THREADS>;
var<workgroup> best_index: array<u32, THREADS>;
var<workgroup> top_value: array<f32, MAX_TOP_K>;
var<workgroup> top_index: array<u32, MAX_TOP_K>;
var<workgroup> chunk_sum: array<f32, THREADS>;

// Logit i of the row, after the repetition penalty.
fn logit(i: u32) -> f32 {
  let value = logits[params.offset + i];
  if (params.penalized == 0u || (seen[i / 32u] & (1u << (i % 32u))) == 0u) {
    return value;
  }
  return select(value / params.repetition_penalty, value * params.repetition_penalty, value < 0.0);
}

// exp((value - largest) / temperature): the unnormalised probability of a logit.
fn weight(value: f32, largest: f32) -> f32 {
  return exp((value - largest) / params.temperature);
}

// A u32 that orders as the float does (for values that are not NaN).
fn order_key(value: f32) -> u32 {
  let bits = bitcast<u32>(value);
  return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

// Whether (value, index) comes before (other_value, other_index) in the order of the top-k:
// larger logits first, the smaller index first among equals.
fn before(value: f32, index: u32, other_value: f32, other_index: u32) -> bool {
  return other_index == NONE || value > other_value || (value == other_value && index < other_index);
}

// The largest logit that comes after the previous pick (`after_index` NONE: any), reduced
// over the workgroup into best_value[0], best_index[0].
fn largest_after(thread: u32, after_value: f32, after_index: u32) {
  var value = 0.0;
  var index = NONE;
  for (var i = thread; i < params.vocab; i += THREADS) {
    let candidate = logit(i);
    let eligible = after_index == NONE || before(after_value, after_index, candidate, i);
    if (eligible && candidate == candidate && before(candidate, i, value, index)) {
      value = candidate;
      index = i;
    }
  }
  best_value[thread] = value;
  best_index[thread] = index;
  workgroupBarrier();
  for (var stride = THREADS / 2u; stride > 0u; stride /= 2u) {
    if (thread < stride && best_index[thread + stride] != NONE &&
        before(best_value[thread + stride], best_index[thread + stride], best_value[thread], best_index[thread])) {
      best_value[thread] = best_value[thread + stride];
      best_index[thread] = best_index[thread + stride];
    }
    workgroupBarrier();
  }
}

// The weights of the row's logits whose key is at least `cutoff`, summed over the workgroup
// (the same value in every thread).
fn weight_from(thread: u32, cutoff: u32, largest: f32) -> f32 {
  var sum = 0.0;
  for (var i = thread; i < params.vocab; i += THREADS) {
    let value = logit(i);
    if (value == value && order_key(value) >= cutoff) {
      sum += weight(value, largest);
    }
  }
  chunk_sum[thread] = sum;
  workgroupBarrier();
  for (var stride = THREADS / 2u; stride > 0u; stride /= 2u) {
    if (thread < stride) {
      chunk_sum[thread] += chunk_sum[thread + stride];
    }
    workgroupBarrier();
  }
  return workgroupUniformLoad(&chunk_sum[0]);
}

// The smallest key whose tokens (the logits with a key at least it) keep top_p of the
// probability: a token stays while those strictly above it weigh less than top_p of the
// total. A bisection over the 2^32 keys, one workgroup sum each.
fn top_p_cutoff(thread: u32, largest: f32) -> u32 {
  let total = weight_from(thread, 0u, largest);
  var low = 0u;
  var high = NONE;  // the weight strictly above the largest key is 0, below top_p * total
  for (var round = 0u; round < 32u && low < high; round++) {
    let middle = low + (high - low) / 2u;
    // the weight strictly above `middle` is that from middle + 1 on
    if (weight_from(thread, middle + 1u, largest) < params.top_p * total) {
      high = middle;
    } else {
      low = middle + 1u;
    }
  }
  return low;
}

// Thread 0: mark `token` as seen (for the repetition penalty of the next tokens) and write it.
fn pick(token: u32) {
  seen[token / 32u] |= 1u << (token % 32u);
  result[0] = token;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) thread: u32) {
  let greedy = params.temperature == 0.0;
  let rounds = select(select(1u, min(params.top_k, MAX_TOP_K), params.top_k > 0u), 1u, greedy);
  // the top `rounds` logits in order: one workgroup argmax each, excluding those before
  var after_value = 0.0;
  var after_index = NONE;
  var found = 0u;
  var largest = 0.0;  // the row's largest logit, known to every thread
  for (var round = 0u; round < rounds; round++) {
    largest_after(thread, after_value, after_index);
    after_value = best_value[0];
    // a barrier too: everyone has read the winner before the next round overwrites it; and a
    // uniform value, so that the break keeps the barriers in uniform control flow
    after_index = workgroupUniformLoad(&best_index[0]);
    if (after_index == NONE) {
      break;  // fewer eligible logits than rounds
    }
    if (round == 0u) {
      largest = after_value;
    }
    if (thread == 0u) {
      top_value[round] = after_value;
      top_index[round] = after_index;
    }
    found = round + 1u;
  }
  if (greedy || found == 0u) {
    if (thread == 0u) {
      pick(select(top_index[0], 0u, found == 0u));
    }
    return;
  }
  if (params.top_k > 0u) {
    // sample among the top `found`, cut to top_p: keep j while those before it weigh less
    if (thread == 0u) {
      var total = 0.0;
      for (var j = 0u; j < found; j++) {
        total += weight(top_value[j], largest);
      }
      var kept = 0u;
      var kept_weight = 0.0;
      while (kept < found && (kept == 0u || kept_weight < params.top_p * total)) {
        kept_weight += weight(top_value[kept], largest);
        kept++;
      }
      let threshold = params.uniform * kept_weight;
      var picked = top_index[kept - 1u];
      var cumulative = 0.0;
      for (var j = 0u; j < kept; j++) {
        cumulative += weight(top_value[j], largest);
        if (cumulative > threshold) {
          picked = top_index[j];
          break;
        }
      }
      pick(picked);
    }
    return;
  }
  // sample over the whole row (the logits with a key at least `cutoff`): each thread sums a
  // contiguous chunk, thread 0 finds the chunk where the cumulative sum crosses the
  // threshold, then the element inside it
  var cutoff = 0u;
  if (params.top_p < 1.0) {
    cutoff = top_p_cutoff(thread, largest);
  }
  let chunk = (params.vocab + THREADS - 1u) / THREADS;
  let start = thread * chunk;
  var sum = 0.0;
  for (var i = start; i < min(start + chunk, params.vocab); i++) {
    let value = logit(i);
    if (value == value && order_key(value) >= cutoff) {
      sum += weight(value, largest);
    }
  }
  chunk_sum[thread] = sum;
  workgroupBarrier();
  if (thread == 0u) {
    var total = 0.0;
    for (var t = 0u; t < THREADS; t++) {
      total += chunk_sum[t];
    }
    let threshold = params.uniform * total;
    var picked = top_index[0];
    var cumulative = 0.0;
    for (var t = 0u; t < THREADS; t++) {
      if (cumulative + chunk_sum[t] > threshold) {
        for (var i = t * chunk; i < min((t + 1u) * chunk, params.vocab); i++) {
          let value = logit(i);
          if (value == value && order_key(value) >= cutoff) {
            cumulative += weight(value, largest);
            if (cumulative > threshold) {
              picked = i;
              break;
            }
          }
        }
        break;
      }
      cumulative += chunk_sum[t];
    }
    pick(picked);
  }
}
