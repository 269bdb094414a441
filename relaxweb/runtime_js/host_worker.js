// The worker that runs a bundle's host module for the browser runtime (remote_host.js):
// a module that never returns blocks this worker, not the page, and is stopped by
// terminating it. Messages: {id, method, args} in; {id, result} or {id, error} out.

import { HostSessions } from "./host_session.js";

/** @type {HostSessions|null} the model's session and its batch instances' */
let session = null;

self.onmessage = async ({ data: { id, method, args } }) => {
  try {
    let result = null;
    if (method === "instantiate") {
      session = await HostSessions.instantiate(args[0], args[1]);
    } else if (session && ["configure", "start", "resume", "startInstance", "resumeInstance"].includes(method)) {
      result = await /** @type {any} */ (session)[method](...args);
    } else {
      throw new Error(`the host worker has no method ${method}`);
    }
    self.postMessage({ id, result });
  } catch (error) {
    const { name, message, code, value, expected } = /** @type {any} */ (error);
    self.postMessage({ id, error: { name: String(name), message: String(message ?? error), details: { code, value, expected } } });
  }
};
