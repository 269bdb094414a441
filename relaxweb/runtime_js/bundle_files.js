// A bundle's files as the browser runtime fetches them (docs/bundle-format.md): the manifest,
// the weight shards (each verified by its size and sha256, optionally kept in the Cache API),
// and any other file, an HTTP error being an Error naming the URL.

/** The Cache API cache that `cache: true` uses. */
export const DEFAULT_CACHE_NAME = "relaxweb";

/**
 * @typedef {{loaded: number, total: number}} Progress  bytes of weights fetched so far / in all
 */

/**
 * A bundle's manifest.json, parsed (not checked yet: load() does that).
 * @param {URL} manifestUrl
 * @returns {Promise<any>}
 */
export async function fetchManifest(manifestUrl) {
  try {
    return await (await fetchOk(manifestUrl)).json();
  } catch (error) {
    if (!(error instanceof SyntaxError)) throw error;
    throw new Error(`${manifestUrl} is not valid JSON: ${error.message}`);
  }
}

/**
 * The URL of a bundle's manifest.json.
 * @param {string|URL} url a bundle folder or its manifest.json
 * @returns {URL}
 */
export function resolveManifestUrl(url) {
  const base = globalThis.location?.href;
  const text = String(url);
  if (text.endsWith(".json")) return new URL(text, base);
  return new URL("manifest.json", new URL(text.endsWith("/") ? text : `${text}/`, base));
}

/**
 * fetch() that rejects on an HTTP error status.
 * @param {URL} url
 * @returns {Promise<Response>}
 */
export async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`could not fetch ${url}: HTTP ${response.status} ${response.statusText}`);
  return response;
}

/**
 * A file's bytes (fetchOk: an HTTP error rejects).
 * @param {URL} url
 * @returns {Promise<ArrayBuffer>}
 */
export async function fetchBytes(url) {
  return (await fetchOk(url)).arrayBuffer();
}

/**
 * The Cache API cache that the `cache` option names, or null (no option, or no Cache API
 * here: not a secure context, or Node).
 * @param {boolean|string|undefined} cache
 * @returns {Promise<Cache|null>}
 */
export async function openShardCache(cache) {
  if (!cache) return null;
  if (!globalThis.caches) return null; // nothing to cache in: fetch as if the option were off
  return caches.open(cache === true ? DEFAULT_CACHE_NAME : String(cache));
}

/**
 * Fetch every weight shard (from `shardCache` when it holds it), report progress, and verify
 * its size and sha256. A cached shard that fails the check is fetched again from the network
 * (once); a fetched shard that fails it is an error naming the shard. Good fetched shards are
 * put in the cache.
 * @param {any} manifest
 * @param {(file: string) => URL} fileUrl
 * @param {((progress: Progress) => void)|undefined} onProgress
 * @param {Cache|null} [shardCache]
 * @returns {Promise<Uint8Array[]>}
 */
export async function fetchShards(manifest, fileUrl, onProgress, shardCache = null) {
  const total = manifest.shards.reduce((/** @type {number} */ sum, /** @type {any} */ s) => sum + s.nbytes, 0);
  let loaded = 0;
  const report = (/** @type {number} */ bytes) => {
    loaded += bytes;
    onProgress?.({ loaded, total });
  };
  report(0);
  return Promise.all(manifest.shards.map(async (/** @type {any} */ shard) => {
    const url = fileUrl(shard.file);
    const cached = shardCache ? await shardCache.match(url) : undefined;
    if (cached) {
      const bytes = new Uint8Array(await cached.arrayBuffer());
      if ((await shardProblem(shard, bytes)) === null) {
        report(bytes.byteLength);
        return bytes;
      }
      // A stale or damaged copy: drop it, and fetch the shard from the network.
      await shardCache?.delete(url);
    }
    // Progress counts only the bytes of this fetch, even if a cached copy was read before.
    const bytes = await readWithProgress(await fetchOk(url), shard.nbytes, report);
    const problem = await shardProblem(shard, bytes);
    if (problem !== null) throw new Error(problem);
    if (shardCache) {
      // A failure to store (quota) only costs the next load a download.
      await shardCache.put(url, new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } }))
        .catch(() => {});
    }
    return bytes;
  }));
}

/**
 * Why the bytes of a shard are not the manifest's (wrong size, wrong sha256), or null.
 * @param {{file: string, nbytes: number, sha256: string}} shard
 * @param {Uint8Array} bytes
 * @returns {Promise<string|null>}
 */
export async function shardProblem(shard, bytes) {
  if (bytes.byteLength !== shard.nbytes) {
    return `weight shard ${shard.file} has ${bytes.byteLength} bytes, expected ${shard.nbytes}`;
  }
  const digest = await sha256Hex(bytes);
  if (digest !== shard.sha256) {
    return `weight shard ${shard.file} is corrupt: sha256 ${digest}, expected ${shard.sha256}`;
  }
  return null;
}

/**
 * Read a response body, calling `report(bytes)` for each chunk.
 * @param {Response} response
 * @param {number} expectedBytes
 * @param {(bytes: number) => void} report
 * @returns {Promise<Uint8Array>}
 */
async function readWithProgress(response, expectedBytes, report) {
  if (!response.body) {
    const bytes = new Uint8Array(await response.arrayBuffer());
    report(bytes.byteLength);
    return bytes;
  }
  const chunks = [];
  let length = 0;
  const reader = response.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    length += value.byteLength;
    report(value.byteLength);
  }
  const bytes = new Uint8Array(length);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return bytes;
}

/**
 * @param {Uint8Array} bytes
 * @returns {Promise<string>}
 */
export async function sha256Hex(bytes) {
  if (!globalThis.crypto?.subtle) throw new Error("crypto.subtle is unavailable: serve the bundle over https or from localhost");
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}
