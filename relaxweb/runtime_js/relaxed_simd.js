// Relaxed SIMD on the wasm backend: which of a bundle's kernel modules runs. The bundle holds
// kernels.wasm (plain SIMD128) and, where some kernel multiplies and adds,
// kernels-relaxed.wasm (the same kernels with f32x4.relaxed_madd: relaxweb/cpu/relaxed_simd.py,
// docs/bundle-format.md "Relaxed SIMD"); the relaxed one runs where the engine compiles it. The
// twin of runtime/wasm_backend.py's use_relaxed_simd.

/**
 * A module that validates exactly where the engine has relaxed SIMD: one function returning
 * f32x4.relaxed_madd of its three v128 parameters (runtime/wasm_backend.py has the same bytes).
 */
const RELAXED_SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 8, 1, 96, 3, 123, 123, 123, 1, 123, 3, 2, 1, 0,
  10, 13, 1, 11, 0, 32, 0, 32, 1, 32, 2, 253, 133, 2, 11]);

/** Whether this engine compiles relaxed SIMD (Chromium from 114, Firefox from 120; Node 20 only behind a flag). */
export function engineHasRelaxedSimd() {
  try {
    return WebAssembly.validate(RELAXED_SIMD_PROBE);
  } catch {
    return false;
  }
}

/**
 * The `relaxedSimd` load option checked: true, false or left out.
 * @param {unknown} relaxedSimd
 */
export function checkRelaxedSimd(relaxedSimd) {
  if (relaxedSimd !== undefined && typeof relaxedSimd !== "boolean") {
    throw new Error(`relaxedSimd must be true or false (or left out: where the engine has it), got ${String(relaxedSimd).slice(0, 40)}`);
  }
}

/**
 * Which of the bundle's kernel modules runs (the twin of runtime/wasm_backend.py's
 * use_relaxed_simd): `relaxedSimd` undefined takes the manifest's `wasm.relaxed_file` (fused
 * multiply-adds) where the bundle has one and the engine compiles it; true insists (an error
 * where it cannot); false runs the plain `wasm.file` (results the same on every machine).
 * @param {any} entry the manifest's wasm entry @param {boolean|undefined} relaxedSimd the load option
 * @returns {{file: string, relaxedSimd: boolean}}
 */
export function kernelsFile(entry, relaxedSimd) {
  checkRelaxedSimd(relaxedSimd);
  if (relaxedSimd === false) return { file: entry.file, relaxedSimd: false };
  if (!entry.relaxed_file) {
    if (relaxedSimd) {
      throw new Error("relaxedSimd: true, but the bundle has no kernels with relaxed SIMD (its manifest's wasm entry has " +
        "no relaxed_file: no kernel multiplies and adds, or an older relaxweb built it)");
    }
    return { file: entry.file, relaxedSimd: false };
  }
  if (!engineHasRelaxedSimd()) {
    if (relaxedSimd) throw new Error("relaxedSimd: true, but this engine does not compile relaxed SIMD");
    return { file: entry.file, relaxedSimd: false };
  }
  return { file: entry.relaxed_file, relaxedSimd: true };
}
