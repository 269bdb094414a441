// Chat templates: a conversation -> the prompt text, as transformers'
// `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` renders it; the
// Python runtime's relaxweb/tokenizer/chat_template.py in JavaScript. The publisher's Jinja
// template is rendered by @huggingface/jinja (Hugging Face's JavaScript implementation of
// their template dialect: trimmed blocks, raise_exception, strftime_now, tojson, namespaces)
// with the messages, add_generation_prompt, tools and documents (null) and the tokenizer's
// named special tokens (bos_token, ...).

/** Where a message's reasoning may be (chat_template.py's REASONING_FIELDS). */
const REASONING_FIELDS = ["reasoning_content", "thinking", "reasoning"];

/** A publisher's chat template, parsed once (a syntax error is an Error). */
export class ChatTemplate {
  /**
   * @param {any} jinja the @huggingface/jinja module
   * @param {string} text the template
   * @param {Record<string, string>} specialTokens the variables bos_token, eos_token, ...
   * @param {string} source where the template is from, for errors
   */
  constructor(jinja, text, specialTokens, source) {
    this.text = text;
    this.specialTokens = { ...specialTokens };
    try {
      this.template = new jinja.Template(text);
    } catch (error) {
      throw new Error(`the chat template in ${source} is not valid Jinja: ${/** @type {Error} */ (error).message}`);
    }
  }

  /**
   * The prompt text of `messages` ([{role, content}, ...]).
   * @param {any} messages @param {{addGenerationPrompt?: boolean}} [options] @returns {string}
   */
  render(messages, { addGenerationPrompt = true } = {}) {
    if (typeof addGenerationPrompt !== "boolean") {
      throw new Error(`addGenerationPrompt must be true or false, got ${String(addGenerationPrompt).slice(0, 40)}`);
    }
    const context = {
      messages: templateMessages(messages), tools: null, documents: null, add_generation_prompt: addGenerationPrompt,
      ...this.specialTokens,
    };
    try {
      return this.template.render(context);
    } catch (error) {
      throw new Error(`the chat template refused these messages: ${/** @type {Error} */ (error).message}`);
    }
  }
}

/**
 * The messages as the template sees them (chat_template.py's template_messages): plain JSON
 * values, keys whose value is null or undefined dropped, a message's reasoning under the names
 * templates read; an Error for anything but a non-empty array of objects.
 * @param {any} messages @returns {Record<string, any>[]}
 */
export function templateMessages(messages) {
  if (!Array.isArray(messages) || messages.length === 0) {
    throw new Error(`messages must be a non-empty list of messages ({"role": ..., "content": ...}), got ${shown(messages)}`);
  }
  return messages.map((message, index) => {
    if (!isPlainObject(message)) {
      throw new Error(`messages[${index}] must be an object ({"role": ..., "content": ...}), got ${shown(message)}`);
    }
    /** @type {Record<string, any>} */
    let plain = Object.fromEntries(Object.entries(message).filter(([, value]) => value !== null && value !== undefined)
      .map(([key, value]) => [key, plainValue(value, `messages[${index}].${key}`)]));
    const reasoning = REASONING_FIELDS.map((name) => plain[name]).find((value) => value !== undefined);
    if (reasoning !== undefined) plain = { thinking: reasoning, ...plain, reasoning_content: reasoning };
    return plain;
  });
}

/** @param {any} value @returns {boolean} */
function isPlainObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value) &&
    [Object.prototype, null].includes(Object.getPrototypeOf(value));
}

/**
 * `value` as JSON gives values: nothing else reaches a template.
 * @param {any} value @param {string} where @returns {any}
 */
function plainValue(value, where) {
  if (value === null || ["string", "number", "boolean"].includes(typeof value)) return value;
  if (Array.isArray(value)) return value.map((item, index) => plainValue(item, `${where}[${index}]`));
  if (isPlainObject(value)) {
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, plainValue(item, `${where}.${key}`)]));
  }
  throw new Error(`${where}: a chat message holds JSON values (text, numbers, lists, objects), got ${typeof value}`);
}

/** @param {any} value */
function shown(value) {
  const text = (() => { try { return JSON.stringify(value) ?? String(value); } catch { return String(value); } })();
  return text.length <= 80 ? text : `${text.slice(0, 80)}...`;
}
