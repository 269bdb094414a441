// The npm packages the runtime uses for a Hugging Face tokenizer (tokenizer.js), imported only
// when a bundle has one: @huggingface/tokenizers (encode, decode) and @huggingface/jinja (chat
// templates). They are dependencies of the runtime's npm package, never copied into the
// repository.
//
// Each is imported by its bare name first: that resolves under a bundler (Vite, webpack: the
// string literals below are what they see), in Node, and on a page with an import map. A page
// that serves the bundle as static files resolves no bare name; for it `relaxweb build` copies
// each package's ES module next to the runtime (runtime/vendor/, from the node_modules where
// npm installed it: relaxweb/bundle.py's BROWSER_LIBRARIES names the same files), imported
// by a URL no bundler follows. Neither: an Error that says what to do.

/** @typedef {"tokenizers"|"jinja"} LibraryName */

/** @type {Record<LibraryName, {name: string, byName: () => Promise<any>, copy: string}>} */
const LIBRARIES = {
  tokenizers: { name: "@huggingface/tokenizers", byName: () => import("@huggingface/tokenizers"), copy: "tokenizers.mjs" },
  jinja: { name: "@huggingface/jinja", byName: () => import("@huggingface/jinja"), copy: "jinja.mjs" },
};

/** @type {Map<LibraryName, Promise<any>>} each library's module, imported once */
const imported = new Map();

/**
 * The module of a library: by its bare name, else the bundle's copy in runtime/vendor/.
 * @param {LibraryName} library
 * @returns {Promise<any>}
 */
export function importLibrary(library) {
  let module = imported.get(library);
  if (!module) {
    module = importEither(LIBRARIES[library]);
    module.catch(() => imported.delete(library));
    imported.set(library, module);
  }
  return module;
}

/**
 * @param {{name: string, byName: () => Promise<any>, copy: string}} library
 * @returns {Promise<any>}
 */
async function importEither({ name, byName, copy }) {
  try {
    return await byName();
  } catch (byNameError) {
    const url = new URL(`./vendor/${copy}`, import.meta.url).href;
    try {
      return await import(/* @vite-ignore */ /* webpackIgnore: true */ url);
    } catch (copyError) {
      throw new Error(`this bundle's tokenizer needs ${name}, and it could not be imported: not by its name ` +
        `(${String(/** @type {Error} */ (byNameError).message).slice(0, 120)}; a bundler or an import map resolves it), ` +
        `nor from the bundle's copy ${url} (${String(/** @type {Error} */ (copyError).message).slice(0, 120)}; ` +
        `'relaxweb build' copies it where 'npm install ${name}' has put it in node_modules)`);
    }
  }
}
