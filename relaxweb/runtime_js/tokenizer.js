// The tokenizer a bundle carries (manifest.json's `tokenizer`), for `model.generate` and
// `model.chat`: the Python runtime's relaxweb/tokenizer/ in JavaScript. The entry's `kind`
// says how to read the rest:
//
//   byte         {"kind": "byte", "vocab_size": 258, "bos_token_id": 256, "eos_token_id": 257}:
//                ids 0-255 are the bytes of the UTF-8 text; ids from 256 to vocab_size - 1 are
//                special tokens (bos_token_id starts every prompt, eos_token_id ends the text;
//                both optional) and decode to nothing.
//   huggingface  a Hugging Face tokenizer.json (in the bundle's tokenizer/ folder) encoded and
//                decoded by @huggingface/tokenizers, its chat template (chat_template.jinja)
//                rendered by @huggingface/jinja (chat_template.js); the entry holds what the
//                build read from the publisher's configs: eos_token_ids, special_tokens,
//                generation (sampling defaults). The libraries are imported only for such a
//                bundle (libraries.js).
//
// Text is what the Python `tokenizers` library gives: encode adds the post-processor's special
// tokens unless told not to; decode leaves special tokens out and cleans up no spaces.

import { fetchBytes } from "./bundle_files.js";
import { ChatTemplate } from "./chat_template.js";
import { importLibrary } from "./libraries.js";

const BYTES = 256;
const FOLDER = "tokenizer";
/** The most bytes of each file of a bundle's tokenizer/ (relaxweb/tokenizer/publisher.py's FILES). */
const MAX_BYTES = { "tokenizer.json": 64 << 20, "chat_template.jinja": 1 << 20 };
/** manifest `tokenizer.generation` -> generate's option names. */
const OPTION_NAMES = { temperature: "temperature", top_k: "topK", top_p: "topP", repetition_penalty: "repetitionPenalty" };

/** A `byte` tokenizer entry (from a validated manifest): text <-> token ids. */
export class ByteTokenizer {
  /** @param {{vocab_size: number, bos_token_id?: number, eos_token_id?: number}} entry */
  constructor(entry) {
    /** @type {"byte"} */
    this.kind = "byte";
    this.vocabSize = entry.vocab_size;
    /** @type {number|null} */
    this.bosTokenId = entry.bos_token_id ?? null;
    /** @type {number|null} */
    this.eosTokenId = entry.eos_token_id ?? null;
    /** A byte tokenizer has no chat template. @type {null} */
    this.chatTemplate = null;
  }

  /**
   * The ids of a prompt: BOS (when the tokenizer has one and addSpecialTokens), then the UTF-8 bytes.
   * @param {string} text @param {{addSpecialTokens?: boolean}} [options] @returns {number[]}
   */
  encode(text, { addSpecialTokens = true } = {}) {
    const bos = this.bosTokenId === null || !addSpecialTokens ? [] : [this.bosTokenId];
    return [...bos, ...new TextEncoder().encode(text)];
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

  /** A byte tokenizer brings no sampling defaults. @returns {Record<string, number>} */
  get generationDefaults() {
    return {};
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
 * A run of <0xNN> tokens decoded as the Python tokenizers library's ByteFallback decoder does:
 * as UTF-8 where the run is valid (a byte order mark kept), else one U+FFFD per byte.
 * @huggingface/tokenizers 0.2's ByteFallback uses a default TextDecoder, which drops a leading
 * byte order mark and gives one U+FFFD per invalid sequence; tokenizers.test.py's corpus and
 * decodes of cut characters catch the difference.
 */
class ByteRunDecoder extends TextDecoder {
  constructor() {
    super("utf-8", { fatal: true, ignoreBOM: true });
  }

  /** @param {AllowSharedBufferSource} [bytes] @returns {string} */
  decode(bytes) {
    try {
      return super.decode(bytes);
    } catch {
      return "\ufffd".repeat(bytes?.byteLength ?? 0);
    }
  }
}

/**
 * Give each ByteFallback decoder of a decoder tree (Sequence decoders hold others) a ByteRunDecoder.
 * @param {any} decoder @param {any} library the @huggingface/tokenizers module
 */
function decodeByteRunsAsTokenizers(decoder, library) {
  if (decoder instanceof library.ByteFallbackDecoder) decoder.text_decoder = new ByteRunDecoder();
  for (const inner of Array.isArray(decoder?.decoders) ? decoder.decoders : []) decodeByteRunsAsTokenizers(inner, library);
}

/** A `huggingface` tokenizer: text <-> ids with @huggingface/tokenizers, chat prompts with the publisher's template. */
export class HuggingFaceTokenizer {
  /**
   * @param {any} entry the manifest's tokenizer entry
   * @param {any} library the @huggingface/tokenizers module
   * @param {any} tokenizerJson tokenizer.json, parsed
   * @param {ChatTemplate|null} chatTemplate
   */
  constructor(entry, library, tokenizerJson, chatTemplate) {
    /** @type {"huggingface"} */
    this.kind = "huggingface";
    this.vocabSize = entry.vocab_size;
    /** @type {number[]} */
    this.eosTokenIds = [...(entry.eos_token_ids ?? [])];
    /** @type {Record<string, string>} */
    this.specialTokens = { ...(entry.special_tokens ?? {}) };
    this.chatTemplate = chatTemplate;
    /** @type {Record<string, number>} */
    this.defaults = Object.fromEntries(Object.entries(entry.generation ?? {})
      .map(([name, value]) => [/** @type {any} */ (OPTION_NAMES)[name], value]));
    try {
      // no tokenizer_config: its transformers-only settings (space clean-up, ...) are not the tokenizers library's
      this.tokenizer = new library.Tokenizer(tokenizerJson, {});
    } catch (error) {
      throw new Error(`the bundle's ${FOLDER}/tokenizer.json cannot be loaded by @huggingface/tokenizers: ${/** @type {Error} */ (error).message}`);
    }
    decodeByteRunsAsTokenizers(this.tokenizer.decoder, library);
  }

  /**
   * The ids of `text` (with the post-processor's special tokens when addSpecialTokens).
   * @param {string} text @param {{addSpecialTokens?: boolean}} [options] @returns {number[]}
   */
  encode(text, { addSpecialTokens = true } = {}) {
    if (typeof text !== "string") throw new Error(`the text to encode must be a string, got ${typeof text}`);
    return this.tokenizer.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  /** The text of `ids`, special tokens left out. @param {Iterable<number>} ids @returns {string} */
  decode(ids) {
    const list = [...ids];
    return list.length === 0 ? "" : this.tokenizer.decode(list, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
  }

  /** @returns {DecodeStream} */
  stream() {
    return new DecodeStream((ids) => this.decode(ids));
  }

  /** The ids that end generation by default: every EOS id of the model's configs. @returns {number[]} */
  get stopTokens() {
    return [...this.eosTokenIds];
  }

  /** The publisher's sampling options (generation_config.json), generate's defaults. @returns {Record<string, number>} */
  get generationDefaults() {
    return { ...this.defaults };
  }
}

/**
 * Generated ids -> text as it becomes final (relaxweb/tokenizer/huggingface.py's DecodeStream):
 * a window of recent ids is decoded with and without the ids not shown yet, the difference is
 * the new text, held back while it ends in U+FFFD (a character whose other bytes are to come).
 */
export class DecodeStream {
  /** @param {(ids: number[]) => string} decode */
  constructor(decode) {
    this.decode = decode;
    /** @type {number[]} */
    this.ids = [];
    this.prefix = 0; // where the window starts
    this.read = 0; // the ids before this are shown
  }

  /** @param {number} start @param {number} end */
  text(start, end) {
    return end > start ? this.decode(this.ids.slice(start, end)) : "";
  }

  /** @param {number} token @returns {string} */
  push(token) {
    this.ids.push(token);
    const shown = this.text(this.prefix, this.read);
    const text = this.text(this.prefix, this.ids.length);
    if (text.length <= shown.length || text.endsWith("\ufffd")) return "";
    [this.prefix, this.read] = [this.read, this.ids.length];
    return text.slice(shown.length);
  }

  /** @returns {string} */
  finish() {
    const shown = this.text(this.prefix, this.read);
    const text = this.text(this.prefix, this.ids.length);
    this.prefix = this.read = this.ids.length;
    return text.length > shown.length ? text.slice(shown.length) : "";
  }
}

/**
 * The tokenizer of a validated manifest's `tokenizer` entry, or null without one; a
 * huggingface tokenizer's files are read by `readText(path inside the bundle, most bytes)`.
 * @param {any} entry
 * @param {(file: string, maxBytes: number) => Promise<string>} readText
 * @returns {Promise<ByteTokenizer|HuggingFaceTokenizer|null>}
 */
export async function loadTokenizer(entry, readText) {
  if (!entry) return null;
  if (entry.kind === "byte") return new ByteTokenizer(entry);
  const file = (/** @type {"tokenizer.json"|"chat_template.jinja"} */ name) => readText(`${FOLDER}/${name}`, MAX_BYTES[name]);
  const withTemplate = entry.files.includes("chat_template.jinja");
  const [library, tokenizerText, jinja, templateText] = await Promise.all([
    importLibrary("tokenizers"), file("tokenizer.json"),
    withTemplate ? importLibrary("jinja") : null, withTemplate ? file("chat_template.jinja") : null,
  ]);
  let tokenizerJson;
  try {
    tokenizerJson = JSON.parse(tokenizerText);
  } catch (error) {
    throw new Error(`the bundle's ${FOLDER}/tokenizer.json is not valid JSON: ${/** @type {Error} */ (error).message}`);
  }
  const template = templateText === null ? null
    : new ChatTemplate(jinja, templateText, entry.special_tokens ?? {}, `the bundle's ${FOLDER}/chat_template.jinja`);
  return new HuggingFaceTokenizer(entry, library, tokenizerJson, template);
}

/**
 * A reader of a bundle's text files for loadTokenizer: fetched, at most `maxBytes`, UTF-8.
 * @param {(file: string) => URL} fileUrl
 * @returns {(file: string, maxBytes: number) => Promise<string>}
 */
export function fetchedText(fileUrl) {
  return async (file, maxBytes) => {
    const bytes = await fetchBytes(fileUrl(file));
    if (bytes.byteLength > maxBytes) throw new Error(`the bundle's ${file} is larger than ${maxBytes} bytes`);
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      throw new Error(`the bundle's ${file} is not UTF-8 text`);
    }
  };
}
