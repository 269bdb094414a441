// Hand-written WGSL kernels for bench/kernel_ceiling.py: the fastest float32 matmul and
// convolution we could write for the shapes measured, as a ceiling for the generated
// tiled_matmul.  Each entry takes the shape and returns {code, workgroups, sizes}: the WGSL
// (bindings 0.. = the inputs, then the output, entry point `main`), the dispatch, and each
// binding's size in float32 elements.
//
// Design (after the tiling of TF.js's / onnxruntime-web's WebGPU matmul, adapted to a CPU
// adapter, SwiftShader, where workgroup memory and barriers buy nothing: every invocation of a
// workgroup runs on the same core): no workgroup memory; each invocation keeps a block of
// R rows x 4V columns in vec4 registers, reads the first factor as vec4 along K and the
// second as vec4 along N, and does 16 fma on vec4 per 4 + 4V loads.
window.KERNEL_CEILING = (() => {
  // C[M, N] = A[M, K] * B[K, N]; M % R == 0, N % (4 V) == 0, K % 4 == 0
  const matmul = (R, V) => ({ M, N, K }) => {
    const body = [], declarations = [], stores = [];
    for (let r = 0; r < R; r++) body.push(`    let a${r} = A[(row + ${r}u) * ${K / 4}u + k];`);
    for (let v = 0; v < V; v++) {
      for (let j = 0; j < 4; j++) body.push(`    let b${j}_${v} = B[(4u * k + ${j}u) * ${N / 4}u + column + ${v}u];`);
    }
    for (let r = 0; r < R; r++) {
      for (let v = 0; v < V; v++) {
        body.push(`    c${r}_${v} = fma(vec4(a${r}.x), b0_${v}, fma(vec4(a${r}.y), b1_${v}, ` +
                  `fma(vec4(a${r}.z), b2_${v}, fma(vec4(a${r}.w), b3_${v}, c${r}_${v}))));`);
        declarations.push(`  var c${r}_${v} = vec4<f32>();`);
        stores.push(`  C[(row + ${r}u) * ${N / 4}u + column + ${v}u] = c${r}_${v};`);
      }
    }
    return {
      code: `
@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  let column = id.x * ${V}u;  // in vec4 columns
  let row = id.y * ${R}u;
  if (column >= ${N / 4}u || row >= ${M}u) {
    return;
  }
${declarations.join("\n")}
  for (var k = 0u; k < ${K / 4}u; k = k + 1u) {
${body.join("\n")}
  }
${stores.join("\n")}
}`,
      workgroups: [Math.ceil(N / 4 / V / 8), Math.ceil(M / R / 8), 1],
      sizes: [M * K, K * N, M * N],
    };
  };

  // Y[O, H, W] = sum over (I, 3, 3) of X[I, H + ky - 1, W + kx - 1] * Wt[O, I, ky, kx] + bias[O]
  // (3x3, stride 1, padding 1, batch 1): an implicit GEMM of M = O, N = H * W, K = I * 9,
  // each invocation R output channels x 4 consecutive positions of a row (one vec4 each)
  const conv3x3 = (R) => ({ I, O, H, W }) => {
    const body = [], declarations = [], stores = [];
    for (let r = 0; r < R; r++) {
      declarations.push(`  var c${r} = vec4<f32>();`);
      stores.push(`  Y[((channel + ${r}u) * ${H}u + y) * ${W / 4}u + x4] = c${r} + vec4(bias[channel + ${r}u]);`);
    }
    for (let kx = 0; kx < 3; kx++) {
      body.push(`      let x${kx} = vec4(p${kx}, p${kx + 1}, p${kx + 2}, p${kx + 3});`);
      for (let r = 0; r < R; r++) {
        body.push(`      c${r} = fma(vec4(Wt[((channel + ${r}u) * ${I}u + i) * 9u + ky * 3u + ${kx}u]), x${kx}, c${r});`);
      }
    }
    return {
      code: `
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> Wt: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<vec4<f32>>;
fn input(i: u32, y: i32, x: i32) -> f32 {
  if (y < 0 || y >= ${H} || x < 0 || x >= ${W}) {
    return 0.0;
  }
  return X[(i * ${H}u + u32(y)) * ${W}u + u32(x)];
}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  let position = id.x;  // (y, x4) of the output, x4 in vec4 columns
  let channel = id.y * ${R}u;
  if (position >= ${H * W / 4}u) {
    return;
  }
  let y = position / ${W / 4}u;
  let x4 = position % ${W / 4}u;
  let x = i32(x4) * 4;
${declarations.join("\n")}
  for (var i = 0u; i < ${I}u; i = i + 1u) {
    for (var ky = 0u; ky < 3u; ky = ky + 1u) {
      let row = i32(y + ky) - 1;
      let p0 = input(i, row, x - 1);
      let p1 = input(i, row, x);
      let p2 = input(i, row, x + 1);
      let p3 = input(i, row, x + 2);
      let p4 = input(i, row, x + 3);
      let p5 = input(i, row, x + 4);
${body.join("\n")}
    }
  }
${stores.join("\n")}
}`,
      workgroups: [Math.ceil(H * W / 4 / 64), O / R, 1],
      sizes: [I * H * W, O * I * 9, O, O * H * W],
    };
  };

  return {
    matmul: { register4x4: matmul(4, 1), register8x4: matmul(8, 1), register4x8: matmul(4, 2), register8x8: matmul(8, 2) },
    conv: { direct4: conv3x3(4), direct8: conv3x3(8) },
  };
})();
