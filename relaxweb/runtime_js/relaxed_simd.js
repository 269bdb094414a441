// Relaxed SIMD on the wasm backend: whether the kernels run with it, and their lowering to
// plain SIMD128 where they do not (the twin of runtime/relaxed_simd.py).
//
// A bundle's kernels.wasm writes each f32x4 multiply-add as a site of one fixed form
// (relaxweb/cpu/relaxed_simd.py; docs/bundle-format.md, "Relaxed SIMD"), its two factors
// already on the stack:
//     local.get $sum  f32x4.relaxed_madd  nop nop nop      20 <index> fd 85 02 01 01 01
// and without relaxed SIMD the same bytes become
//     f32x4.mul  local.get $sum  f32x4.add                 fd e6 01 20 <index> fd e4 01
// which is as long, so the rewrite moves nothing else in the module. The manifest's
// wasm.relaxed_madd_sites counts the sites; a module where the lowering finds another count
// is damaged, and refused.

import { readLeb } from "./interruptible_kernels.js";

/**
 * A module that validates exactly where the engine has relaxed SIMD: one function returning
 * f32x4.relaxed_madd of its three v128 parameters (runtime/relaxed_simd.py has the same bytes).
 */
const RELAXED_SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 8, 1, 96, 3, 123, 123, 123, 1, 123, 3, 2, 1, 0,
  10, 13, 1, 11, 0, 32, 0, 32, 1, 32, 2, 253, 133, 2, 11]);

/** A site's bytes after its local.get: f32x4.relaxed_madd (0xfd 261) and three nops. */
const SITE_TAIL = [0xfd, 0x85, 0x02, 0x01, 0x01, 0x01];
const LOCAL_GET = 0x20;
const F32X4_MUL = [0xfd, 0xe6, 0x01];
const F32X4_ADD = [0xfd, 0xe4, 0x01];
const CODE_SECTION = 10;

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
 * Whether the kernels run with relaxed SIMD (the twin of runtime/relaxed_simd.py's
 * use_relaxed_simd): `relaxedSimd` undefined where the kernels multiply and add (the manifest's
 * `wasm.relaxed_madd_sites`) and the engine compiles it; true insists (an error where it
 * cannot); false runs them lowered to plain SIMD128 (results the same on every machine).
 * @param {any} entry the manifest's wasm entry @param {boolean|undefined} relaxedSimd the load option
 * @returns {boolean}
 */
export function useRelaxedSimd(entry, relaxedSimd) {
  checkRelaxedSimd(relaxedSimd);
  if (relaxedSimd === false) return false;
  if (!entry.relaxed_madd_sites) {
    if (relaxedSimd) {
      throw new Error("relaxedSimd: true, but the bundle's kernels use no relaxed SIMD (its manifest's wasm entry " +
        "has no relaxed_madd_sites: no kernel multiplies and adds)");
    }
    return false;
  }
  if (!engineHasRelaxedSimd()) {
    if (relaxedSimd) throw new Error("relaxedSimd: true, but this engine does not compile relaxed SIMD");
    return false;
  }
  return true;
}

/**
 * `bytes` (a kernels.wasm) with each of its `sites` relaxed multiply-adds rewritten as a plain
 * multiply then add, in place (runtime/relaxed_simd.py's lower_relaxed_simd).
 * @param {ArrayBuffer|Uint8Array} bytes @param {number} sites the manifest's wasm.relaxed_madd_sites
 * @returns {Uint8Array} a copy, edited
 */
export function lowerRelaxedSimd(bytes, sites) {
  const data = new Uint8Array(bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes)).slice();
  const [start, end] = codeSection(data);
  let found = 0;
  for (let position = findTail(data, start, end); position >= 0; position = findTail(data, position + SITE_TAIL.length, end)) {
    // the local.get before it: 0x20, then the local's index (LEB128: its last byte below 0x80)
    let get = position - 1;
    if (data[get] & 0x80) throw damaged("a relaxed multiply-add does not follow a local.get");
    get -= 1;
    while (get >= start && data[get] & 0x80 && position - get <= 5) get -= 1;
    if (data[get] !== LOCAL_GET) throw damaged("a relaxed multiply-add does not follow a local.get");
    const index = data.slice(get + 1, position);
    data.set([...F32X4_MUL, LOCAL_GET, ...index, ...F32X4_ADD], get);
    found += 1;
  }
  if (found !== sites) throw damaged(`${found} relaxed multiply-adds where the manifest counts ${sites}`);
  return data;
}

/** @param {Uint8Array} data @param {number} from @param {number} end @returns {number} where the next site's tail starts, or -1 */
function findTail(data, from, end) {
  for (let position = data.indexOf(SITE_TAIL[0], from); position >= 0 && position + SITE_TAIL.length <= end;
    position = data.indexOf(SITE_TAIL[0], position + 1)) {
    if (SITE_TAIL.every((byte, i) => data[position + i] === byte)) return position;
  }
  return -1;
}

/** @param {Uint8Array} data @returns {[number, number]} where the code section's bytes start and end */
function codeSection(data) {
  const header = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
  if (data.length < 8 || header.some((byte, i) => data[i] !== byte)) throw damaged("not a WebAssembly module (version 1)");
  for (let position = 8; position < data.length;) {
    const sectionId = data[position];
    const [size, start] = readLeb(data, position + 1);
    if (sectionId === CODE_SECTION) return [start, start + size];
    position = start + size;
  }
  throw damaged("no code section");
}

/** @param {string} why */
function damaged(why) {
  return new Error(`the bundle's kernels.wasm cannot be lowered to plain SIMD128 (${why}): the bundle is damaged`);
}
