/**
 * What the status bar item says: the pure formatting of the server's `diffill/status` notification and of the
 * client's own states. No `vscode` import, so it is unit-tested in plain node.
 */

/** The parameters of `diffill/status` (see lsp_server/status.py); every field may be missing from an older server. */
export interface StatusPayload {
  method?: string;
  uri?: string;
  outcome?: string; // ok, empty, cache, through, not_ready, superseded, cancelled, changed, disabled, invalid, error
  items?: number;
  cache_hit?: boolean;
  ms?: number; // the whole request
  model_ms?: number;
  forward_passes?: number;
  tokens_per_forward?: number;
  steps_done?: number;
  model?: string; // e.g. "diffill:model"
  state?: string; // starting, loading, ready, failed, absent, unreachable
}

/** The status bar item's text (with a codicon), tooltip, and whether it shows a warning. */
export interface StatusView {
  text: string;
  tooltip: string;
  warning: boolean;
}

const CLICK = "Click to open the diffill log.";

/** Milliseconds as the status bar shows them: `41 ms`, `1.2 s`. */
export function formatMs(ms: number): string {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/** The view of a server state when no request has been answered yet (or the model is not ready). */
export function stateView(state: string, model?: string, message?: string): StatusView {
  const name = model !== undefined && model !== "" ? model : "diffill";
  switch (state) {
    case "ready":
      return { text: `$(sparkle) ${name}`, tooltip: `diffill: model ${name} ready. ${CLICK}`, warning: false };
    case "starting":
    case "loading":
      return { text: "$(loading~spin) diffill", tooltip: `diffill: loading the model. ${CLICK}`, warning: false };
    case "unreachable":
      return {
        text: "$(debug-disconnect) diffill",
        tooltip: `diffill: the engine (a team server or the shared engine) is not answering; the next request tries it again. ${CLICK}`,
        warning: true,
      };
    case "stopped":
      return { text: "$(circle-slash) diffill", tooltip: `diffill: the server is not running. ${CLICK}`, warning: true };
    default: {
      const why = message !== undefined && message !== "" ? `: ${message}` : "";
      return { text: "$(warning) diffill", tooltip: `diffill: no model (${state})${why}. ${CLICK}`, warning: true };
    }
  }
}

/** The view after a request: model, the request's latency, and tokens per forward pass (or that the cache answered). */
export function statusView(payload: StatusPayload): StatusView {
  const state = payload.state ?? "ready";
  if (state !== "ready" || payload.outcome === "not_ready") {
    return stateView(state, payload.model);
  }
  const name = payload.model !== undefined && payload.model !== "" ? payload.model : "diffill";
  const parts = [`$(sparkle) ${name}`];
  if (payload.ms !== undefined) {
    parts.push(formatMs(payload.ms));
  }
  if (payload.cache_hit === true) {
    parts.push("cached");
  } else if (payload.tokens_per_forward !== undefined && payload.tokens_per_forward > 0) {
    parts.push(`${payload.tokens_per_forward.toFixed(1)} tok/fwd`);
  }
  const detail = [
    `model ${name}`,
    payload.method !== undefined ? `last request ${payload.method}: ${payload.outcome ?? "?"}` : undefined,
    payload.items !== undefined ? `${payload.items} suggestion${payload.items === 1 ? "" : "s"}` : undefined,
    payload.forward_passes !== undefined ? `${payload.forward_passes} forward passes` : undefined,
    payload.model_ms !== undefined && payload.model_ms > 0 ? `${formatMs(payload.model_ms)} in the model` : undefined,
  ].filter((part): part is string => part !== undefined);
  return { text: parts.join(" · "), tooltip: `diffill: ${detail.join(", ")}. ${CLICK}`, warning: false };
}
