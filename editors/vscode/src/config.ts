/**
 * The pure half of the settings: which `diffill.*` settings belong to the server, how they nest into the JSON the
 * server reads, and how the server is started. No `vscode` import, so it is unit-tested in plain node.
 */
import manifest from "../package.json";

/** Settings that only the extension reads; every other `diffill.*` setting is the server's. */
const CLIENT_ONLY = ["server.", "ui.", "trace."];

/** A JSON value as the server receives it. */
export type Json = string | number | boolean | null | Json[] | { [key: string]: Json };

/** The dotted keys (without `diffill.`) of every server setting the extension contributes, e.g. `model.path`. */
export const SERVER_SETTINGS: readonly string[] = Object.keys(manifest.contributes.configuration.properties)
  .map((key) => key.replace(/^diffill\./, ""))
  .filter((key) => !CLIENT_ONLY.some((prefix) => key.startsWith(prefix)));

/**
 * The server's settings object from dotted keys and values: `[["model.path", "/m"]]` gives `{model: {path: "/m"}}`.
 * Keys whose value is `undefined` (not set by the user) are left out, so the server's own defaults apply.
 */
export function nestSettings(values: Iterable<readonly [string, Json | undefined]>): Record<string, Json> {
  const root: Record<string, Json> = {};
  for (const [key, value] of values) {
    if (value === undefined) {
      continue;
    }
    const parts = key.split(".");
    const last = parts.pop();
    if (last === undefined || last === "") {
      continue;
    }
    let node = root;
    for (const part of parts) {
      const child = node[part];
      if (child === undefined || child === null || typeof child !== "object" || Array.isArray(child)) {
        const fresh: Record<string, Json> = {};
        node[part] = fresh;
        node = fresh;
      } else {
        node = child;
      }
    }
    node[last] = value;
  }
  return root;
}

/** How the extension starts the server. */
export interface ServerLaunch {
  command: string;
  args: string[];
}

/** What the user configured about starting the server. */
export interface LaunchSettings {
  command: readonly string[]; // `diffill.server.command`, e.g. ["diffill", "serve"]
  pythonPath: string; // `diffill.server.pythonPath`; when set it wins over `command`
  args: readonly string[]; // `diffill.server.args`, appended
}

/** The process to spawn; throws an Error that says which setting to fix when there is nothing to run. */
export function serverLaunch(settings: LaunchSettings): ServerLaunch {
  const python = settings.pythonPath.trim();
  if (python !== "") {
    return { command: python, args: ["-m", "diffill", "serve", ...settings.args] };
  }
  const [command, ...rest] = settings.command.map((word) => word.trim()).filter((word) => word !== "");
  if (command === undefined) {
    throw new Error("diffill.server.command is empty: set it (e.g. [\"diffill\", \"serve\"]) or diffill.server.pythonPath");
  }
  return { command, args: [...rest, ...settings.args] };
}
