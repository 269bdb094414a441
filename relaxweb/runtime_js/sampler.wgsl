// The next token of `generate`, picked on the GPU from one row of logits (both runtimes run
// this file: relaxweb/runtime/generate.py and runtime_js/generate.js). One workgroup of
// THREADS invocations; the result is one u32, the only value read back per token.
//
//   temperature == 0       greedy: the largest logit (the first of equals, as numpy's argmax)
//   top_k in 1..MAX_TOP_K  sample among the top_k largest logits, probabilities
//                          softmax(logit / temperature) renormalised over them
//   top_k == 0             sample over the whole row
//
// `uniform` is a number in [0, 1) from the runtime's seeded generator, one per token: the
// token is the first whose cumulative probability exceeds uniform * total (the threshold). NaN logits are
// never picked (every comparison with NaN is false); a row of NaNs gives token 0.
// No infinity constant appears (WGSL compilers may assume there are none): the "no candidate
// yet" state is the index NONE.

struct Params {
  offset: u32,       // the row's first element in `logits`
  vocab: u32,        // the row's length
  top_k: u32,        // 0: the whole row
  temperature: f32,  // 0: greedy
  uniform: f32,      // in [0, 1)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> result: array<u32>;

const THREADS: u32 = 256u;
const MAX_TOP_K: u32 = 256u;
const NONE: u32 = 0xffffffffu;

var<workgroup> best_value: array<f32, THREADS>;
var<workgroup> best_index: array<u32, THREADS>;
var<workgroup> top_value: array<f32, MAX_TOP_K>;
var<workgroup> top_index: array<u32, MAX_TOP_K>;
var<workgroup> chunk_sum: array<f32, THREADS>;

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
    let candidate = logits[params.offset + i];
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
      result[0] = select(top_index[0], 0u, found == 0u);
    }
    return;
  }
  if (params.top_k > 0u) {
    // sample among the top `found`
    if (thread == 0u) {
      var total = 0.0;
      for (var j = 0u; j < found; j++) {
        total += exp((top_value[j] - largest) / params.temperature);
      }
      let threshold = params.uniform * total;
      var picked = top_index[found - 1u];
      var cumulative = 0.0;
      for (var j = 0u; j < found; j++) {
        cumulative += exp((top_value[j] - largest) / params.temperature);
        if (cumulative > threshold) {
          picked = top_index[j];
          break;
        }
      }
      result[0] = picked;
    }
    return;
  }
  // sample over the whole row: each thread sums a contiguous chunk, thread 0 finds the chunk
  // where the cumulative sum crosses the threshold, then the element inside it
  let chunk = (params.vocab + THREADS - 1u) / THREADS;
  let start = thread * chunk;
  var sum = 0.0;
  for (var i = start; i < min(start + chunk, params.vocab); i++) {
    let value = logits[params.offset + i];
    if (value == value) {
      sum += exp((value - largest) / params.temperature);
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
          let value = logits[params.offset + i];
          if (value == value) {
            cumulative += exp((value - largest) / params.temperature);
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
    result[0] = picked;
  }
}
