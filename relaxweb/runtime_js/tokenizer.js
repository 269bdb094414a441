// The tokenizer a bundle carries (manifest.json's `tokenizer`), for `model.generate`: the
// Python runtime's relaxweb/tokenizer.py in JavaScript. The entry's `kind` says how to read the
// rest, so that other kinds can be added without changing the ones there are. Kinds:
//
//   byte  {"kind": "byte", "vocab_size": 258, "bos_token_id": 256, "eos_token_id": 257}: ids
//         0-255 are the bytes of the UTF-8 text; ids from 256 to vocab_size - 1 are special
//         tokens (bos_token_id starts every prompt, eos_token_id ends the text; both optional)
//         and decode to nothing.

const BYTES = 256;

/** A `byte` tokenizer entry (from a validated manifest): text <-> token ids. */
export class ByteTokenizer {
  /** @param {{vocab_size: number, bos_token_id?: number, eos_token_id?: number}} entry */
  constructor(entry) {
    this.vocabSize = entry.vocab_size;
    /** @type {number|null} */
    this.bosTokenId = entry.bos_token_id ?? null;
    /** @type {number|null} */
    this.eosTokenId = entry.eos_token_id ?? null;
  }

  /** The ids of a prompt: BOS (when the tokenizer has one), then the UTF-8 bytes. @param {string} text @returns {number[]} */
  encode(text) {
    return [...(this.bosTokenId === null ? [] : [this.bosTokenId]), ...new TextEncoder().encode(text)];
  }

  /** The text of `ids`: special ids dropped, bytes decoded as UTF-8 (invalid ones replaced by U+FFFD). @param {Iterable<number>} ids */
  decode(ids) {
    return new TextDecoder().decode(Uint8Array.from([...ids].filter((id) => id >= 0 && id < BYTES)));
  }

  /** @returns {TextStream} */
  stream() {
    return new TextStream();
  }

  /** The ids that end generation by default: the EOS, when there is one. @returns {number[]} */
  get stopTokens() {
    return this.eosTokenId === null ? [] : [this.eosTokenId];
  }
}

/**
 * Generated ids -> text, complete characters only: `push` returns the text a new id completes
 * ("" while a multi-byte character is unfinished), `finish` what is left.
 */
export class TextStream {
  constructor() {
    this.decoder = new TextDecoder();
  }

  /** @param {number} token @returns {string} */
  push(token) {
    return token >= 0 && token < BYTES ? this.decoder.decode(Uint8Array.of(token), { stream: true }) : "";
  }

  /** @returns {string} */
  finish() {
    return this.decoder.decode();
  }
}

/**
 * The tokenizer of a validated manifest's `tokenizer` entry (its kind is one the schema lists).
 * @param {any} entry
 * @returns {ByteTokenizer}
 */
export function makeTokenizer(entry) {
  return new ByteTokenizer(entry);
}
