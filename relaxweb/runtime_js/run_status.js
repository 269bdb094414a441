// The run status: where a bundle's kernels report the first error they find in a run's data
// (an index out of range of its axis), read back with the outputs. The twin of
// relaxweb/runtime/run_status.py (docs/design.md, "Errors found by kernels").
//
// A kernel that checks the run's data binds the status as its last buffer (a call site's
// {"status": 0}): STATUS_WORDS u32 words, word 0 the site of the first error (0: none),
// 1-based into the manifest's run_errors, then the values its message shows (signed 32-bit).

/** The words of the run status, and its bytes. */
export const STATUS_WORDS = 8;
export const STATUS_BYTES = 4 * STATUS_WORDS;

/** A check of a run's data inside a kernel failed: the message names the model's node. */
export class RunCheckError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = "RunCheckError";
  }
}

// Python's str.isprintable() is false for these (but the space)
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;
const ESCAPES = { "\t": "\\t", "\n": "\\n", "\r": "\\r" };

/** A name from a model on one line, as relaxweb/errors.py's shown writes it. @param {string} text */
export const shown = (text) => [...String(text)].map((c) => {
  if (c === " " || !UNPRINTABLE.test(c)) return c;
  const code = /** @type {number} */ (c.codePointAt(0));
  if (c in ESCAPES) return ESCAPES[/** @type {keyof typeof ESCAPES} */ (c)];
  const [prefix, digits] = code < 0x100 ? ["\\x", 2] : code < 0x10000 ? ["\\u", 4] : ["\\U", 8];
  return prefix + code.toString(16).padStart(digits, "0");
}).join("");

/** At most `most` characters, "..." where cut (relaxweb/errors.py's shortened). @param {string} text */
export const shortened = (text, most = 200) => {
  const characters = [...text];
  return characters.length <= most ? text : `${characters.slice(0, most - 3).join("")}...`;
};

/**
 * The message of an error a kernel reported at one of the manifest's run_errors sites:
 * `node 'Gather_3' (Gather): index 7 is out of range for axis 0 of extent 4`.
 * @param {string} node @param {string} op @param {string} template `{0}`, `{1}`... for the values
 * @param {ArrayLike<number>} values
 */
export function runErrorMessage(node, op, template, values) {
  let text = String(template);
  for (let position = 0; position < values.length; position++) text = text.replaceAll(`{${position}}`, String(values[position]));
  const where = node ? `node '${shortened(shown(node))}' (${shortened(shown(op))})` : shortened(shown(op));
  return `${where}: ${text}`;
}

/**
 * Throw the run's error when the status (its bytes as read back) holds one.
 * @param {any} manifest @param {ArrayBuffer} data at least STATUS_BYTES bytes
 */
export function checkRunStatus(manifest, data) {
  const words = new Int32Array(data.slice(0, STATUS_BYTES));
  const site = words[0] >>> 0;
  if (site === 0) return;
  const sites = manifest.run_errors ?? [];
  if (site > sites.length) {
    throw new Error(`a kernel reported error site ${site}, but the manifest's run_errors has ${sites.length}: the bundle is damaged`);
  }
  const entry = sites[site - 1];
  throw new RunCheckError(runErrorMessage(entry.node, entry.op, entry.message, words.subarray(1)));
}
